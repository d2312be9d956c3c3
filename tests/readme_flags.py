#!/usr/bin/env python3
"""The flag reference's tables (docs/guide/flags.md) are what the binaries
generate from their flag tables (`BINARY --help-markdown`), so the
documentation, --help and the parser cannot drift apart.

    readme_flags.py docs/guide/flags.md BIN_DIR gradsync-run gradsync-agent ...
    readme_flags.py --update docs/guide/flags.md BIN_DIR gradsync-run ...   # rewrite them

Each binary's table is the first markdown table after its "## NAME" heading.
Links in the generated rows are relative to the repository root (the help
text cannot know where its table lands); they are compared and written
relative to the Markdown file's folder, so they resolve there.
"""
import difflib
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def rebase(line, doc):
    """The row with its root-relative link targets made relative to doc's folder."""
    here = os.path.dirname(os.path.abspath(doc))

    def fix(m):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return m.group(0)
        path, _, anchor = target.partition("#")
        rel = os.path.relpath(os.path.join(ROOT, path), here).replace(os.sep, "/")
        return f"]({rel}{'#' + anchor if anchor else ''})"

    return LINK.sub(fix, line)


def find_table(lines, name, doc):
    """Returns (start, end) of the first table after the heading '## name'."""
    try:
        at = lines.index(f"## {name}\n")
    except ValueError:
        sys.exit(f"{doc} has no '## {name}' section")
    start = at + 1
    while start < len(lines) and not lines[start].startswith("|"):
        if lines[start].startswith("## "):
            sys.exit(f"{doc}'s '## {name}' section has no flag table")
        start += 1
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    if start == end:
        sys.exit(f"{doc}'s '## {name}' section has no flag table")
    return start, end


def main(argv):
    update = argv[:1] == ["--update"]
    if update:
        argv = argv[1:]
    if len(argv) < 3:
        sys.exit(__doc__)
    doc, bin_dir, names = argv[0], argv[1], argv[2:]
    with open(doc, encoding="utf-8") as f:
        lines = f.readlines()
    env = {k: v for k, v in os.environ.items() if k not in ("GRADSYNC_TOKEN", "LOCAL_RANK")}
    failed = False
    for name in names:
        p = subprocess.run([os.path.join(bin_dir, name), "--help-markdown"], capture_output=True,
                           text=True, env=env, check=True)
        want = [rebase(line, doc) for line in p.stdout.splitlines(keepends=True)]
        start, end = find_table(lines, name, doc)
        if lines[start:end] == want:
            print(f"{name}: {doc} table matches --help-markdown")
            continue
        if update:
            lines[start:end] = want
            print(f"{name}: {doc} table updated")
            continue
        failed = True
        sys.stdout.writelines(difflib.unified_diff(lines[start:end], want, doc,
                                                   f"{name} --help-markdown"))
        print(f"{name}: {doc} table differs from the flag table in the code; run\n"
              f"  python3 tests/readme_flags.py --update {doc} BIN_DIR {name}")
    if update:
        with open(doc, "w", encoding="utf-8") as f:
            f.writelines(lines)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
