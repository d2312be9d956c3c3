#!/usr/bin/python3
"""Checks the links of the documentation: every relative link and every
`#anchor` in every Markdown file of the tree (README.md, docs/, the guide,
proto/README.md, bench/README.md, any other .md) must resolve.

    check_links.py [ROOT]        # ROOT: the repository (default: this file's ../)
    check_links.py --self-test   # the checker against a tree of known links

A relative link's file (or folder) must exist inside the repository, and
its anchor, when it has one and points into a Markdown file, must be a
heading of that file (GitHub's slugs: the heading's text lowercased,
punctuation other than hyphens and underscores removed, spaces made
hyphens, a repeated slug given -1, -2, ...) or an explicit
`<a name=...>`/`id=...`. Into other files only GitHub's line anchors
(`#L10`, `#L10-L20`) are accepted. Links in code blocks, code spans and
HTML comments are not links. External links (http, https, mailto) are
not fetched, only listed as skipped. Exit status 1 when any link is
broken, each named as FILE:LINE.

Debian's python3 and its standard library only.
"""
import io
import os
import re
import sys
import tempfile
import unicodedata
import urllib.parse

SKIP_DIRS = {".git", "node_modules", "__pycache__", "Testing"}
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")
INLINE_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)
HTML_ID = re.compile(r"<[a-z][a-z0-9]*\s[^>]*\bid\s*=\s*[\"']([^\"']+)[\"']", re.I)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
LINE_ANCHOR = re.compile(r"^L\d+(-L\d+)?$")


def markdown_files(root):
    """Every .md file under root, sorted, leaving out .git, hidden folders,
    build trees (a CMakeCache.txt) and nested checkouts (a .git of their own)."""
    found = []
    for d, dirs, files in os.walk(root):
        keep = []
        for name in sorted(dirs):
            path = os.path.join(d, name)
            if name in SKIP_DIRS or name.startswith(".") or name.startswith("build"):
                continue
            if os.path.exists(os.path.join(path, "CMakeCache.txt")):
                continue
            if os.path.exists(os.path.join(path, ".git")):
                continue
            keep.append(name)
        dirs[:] = keep
        found += [os.path.join(d, f) for f in sorted(files) if f.endswith(".md")]
    return sorted(found)


def text_lines(lines):
    """Yields (line number, text) of the lines outside fenced code blocks
    and HTML comments, with code spans and comments blanked out."""
    fence = None
    in_comment = False
    for n, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if m and not in_comment:
            fence = m.group(1)
            continue
        out = ""
        rest = line
        while rest:
            if in_comment:
                end = rest.find("-->")
                if end < 0:
                    rest = ""
                    break
                rest = rest[end + 3:]
                in_comment = False
            start = rest.find("<!--")
            if start < 0:
                out += rest
                break
            out += rest[:start]
            rest = rest[start + 4:]
            in_comment = True
        yield n, CODE_SPAN.sub(lambda s: " " * len(s.group(0)), out)


def heading_text(raw):
    """A heading's text as GitHub renders it: code spans keep their
    content, links keep their text, images, HTML tags and emphasis marks go."""
    t = CODE_SPAN.sub(lambda m: m.group(2).strip(), raw)
    t = re.sub(r"!\[([^\]]*)\]\([^)]*\)", "", t)
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", t)
    t = re.sub(r"<[^>]+>", "", t)
    t = re.sub(r"\*+", "", t)
    return t.strip()


def slug(text):
    """GitHub's slug of a heading's text (github-slugger): lowercase,
    characters other than letters, digits, marks, '_', '-' and spaces
    removed, each space a hyphen."""
    s = text.lower()
    s = "".join(c for c in s
                if c in "-_ " or c.isalnum() or unicodedata.category(c).startswith("M"))
    return s.replace(" ", "-")


def anchors(lines):
    """The anchors a Markdown file defines: heading slugs, numbered as
    GitHub numbers repeats, and explicit HTML names and ids."""
    seen = {}
    out = set()
    prev = None
    fence = None
    for line in lines:
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            prev = None
            continue
        if m:
            fence = m.group(1)
            prev = None
            continue
        for a in HTML_ANCHOR.findall(line) + HTML_ID.findall(line):
            out.add(a)
        text = None
        h = ATX.match(line)
        if h:
            text = h.group(2) or ""
        elif prev is not None and SETEXT.match(line):
            text = prev
        if text is not None:
            base = slug(heading_text(text))
            s = base
            while s in seen:
                seen[base] += 1
                s = f"{base}-{seen[base]}"
            seen[s] = 0
            out.add(s)
            prev = None
            continue
        stripped = line.strip()
        paragraph = stripped and not re.match(r"^([-*+>|]|\d+[.)]\s|<)", stripped) \
            and not line.startswith("    ")
        prev = stripped if paragraph else None
    return out


class Checker:
    def __init__(self, root):
        self.root = os.path.realpath(root)
        self.cache = {}
        self.broken = []
        self.skipped = []
        self.checked = 0

    def anchors_of(self, path):
        if path not in self.cache:
            with open(path, encoding="utf-8") as f:
                self.cache[path] = anchors(f.read().splitlines())
        return self.cache[path]

    def check_target(self, src, n, target):
        where = f"{os.path.relpath(src, self.root)}:{n}"
        if target.startswith("<") and target.endswith(">"):
            target = target[1:-1]
        if SCHEME.match(target):
            self.skipped.append(f"{where}: {target}")
            return
        self.checked += 1
        path, hashmark, anchor = target.partition("#")
        path = urllib.parse.unquote(path)
        anchor = urllib.parse.unquote(anchor)
        if not path:
            dest = src
        elif path.startswith("/"):
            dest = os.path.join(self.root, path.lstrip("/"))
        else:
            dest = os.path.join(os.path.dirname(src), path)
        dest = os.path.realpath(dest)
        if dest != self.root and not dest.startswith(self.root + os.sep):
            self.broken.append(f"{where}: broken link '{target}': it leaves the repository")
            return
        if not os.path.exists(dest):
            self.broken.append(f"{where}: broken link '{target}': "
                               f"{os.path.relpath(dest, self.root)} does not exist")
            return
        if not hashmark:
            return
        if not anchor:
            self.broken.append(f"{where}: broken link '{target}': empty anchor")
        elif dest.endswith(".md") and os.path.isfile(dest):
            if anchor not in self.anchors_of(dest):
                self.broken.append(f"{where}: broken link '{target}': no heading or anchor "
                                   f"'#{anchor}' in {os.path.relpath(dest, self.root)}")
        elif not LINE_ANCHOR.match(anchor):
            self.broken.append(f"{where}: broken link '{target}': an anchor into a file "
                               "that is not Markdown (only #L10 line anchors are checkable)")

    def check_file(self, path):
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for n, text in text_lines(lines):
            for m in INLINE_LINK.finditer(text):
                self.check_target(path, n, m.group(2))
            m = REF_DEF.match(text)
            if m:
                self.check_target(path, n, m.group(1))


def run(root, out=sys.stdout):
    files = markdown_files(root)
    c = Checker(root)
    for f in files:
        c.check_file(os.path.realpath(f))
    for s in c.skipped:
        print(f"skipped (external, not fetched): {s}", file=out)
    for b in c.broken:
        print(b, file=out)
    print(f"{len(files)} Markdown files, {c.checked} relative links checked, "
          f"{len(c.skipped)} external skipped, {len(c.broken)} broken", file=out)
    return 1 if c.broken else 0


def self_test():
    """The checker against a small tree whose broken links are known: it
    must name each of them, with its line, and nothing else."""
    files = {
        "README.md": "# Top\n\n## Quick start\n\n[ok](docs/a.md#the-b-section)\n"
                     "[bad file](docs/missing.md)\n[bad anchor](docs/a.md#nope)\n"
                     "`[not a link](nowhere.md)`\n```\n[in code](nowhere.md)\n```\n"
                     "[ext](https://example.com/x) [self](#quick-start)\n"
                     "<!-- [commented](nowhere.md) -->\n[up](../outside.md)\n",
        "docs/a.md": "# A\n\n## The `b` section!\n\n## Repeat\n\n## Repeat\n\n"
                     "[dup](#repeat-1) [dup2](#repeat-2)\n[dir](../docs/) [line](../src.c#L3)\n"
                     "[ref]: ../README.md#top\n",
        "src.c": "int x;\n",
    }
    with tempfile.TemporaryDirectory() as root:
        for name, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        buf = io.StringIO()
        status = run(root, buf)
    report = buf.getvalue()
    broken = sorted(line.split(": broken link")[0] for line in report.splitlines()
                    if ": broken link" in line)
    want = ["README.md:14", "README.md:6", "README.md:7", "docs/a.md:9"]
    ok = status == 1 and broken == want and "skipped (external, not fetched): README.md:12" in report
    print(report, end="")
    print(f"self-test: broken links reported at {broken}, expected {want}: "
          f"{'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


def main(argv):
    if argv[:1] == ["--self-test"]:
        return self_test()
    root = argv[0] if argv else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    return run(root)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
