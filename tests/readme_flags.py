#!/usr/bin/env python3
"""The README's flag tables are what the binaries generate from their flag
tables (`BINARY --help-markdown`), so the README, --help and the parser
cannot drift apart.

    readme_flags.py README.md BIN_DIR gradsync-run gradsync-agent ...
    readme_flags.py --update README.md BIN_DIR gradsync-run ...   # rewrite them

Each binary's table is the first markdown table after its "## NAME" heading.
"""
import difflib
import os
import subprocess
import sys


def find_table(lines, name):
    """Returns (start, end) of the first table after the heading '## name'."""
    try:
        at = lines.index(f"## {name}\n")
    except ValueError:
        sys.exit(f"README has no '## {name}' section")
    start = at + 1
    while start < len(lines) and not lines[start].startswith("|"):
        if lines[start].startswith("## "):
            sys.exit(f"README's '## {name}' section has no flag table")
        start += 1
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    if start == end:
        sys.exit(f"README's '## {name}' section has no flag table")
    return start, end


def main(argv):
    update = argv[:1] == ["--update"]
    if update:
        argv = argv[1:]
    readme, bin_dir, names = argv[0], argv[1], argv[2:]
    with open(readme, encoding="utf-8") as f:
        lines = f.readlines()
    env = {k: v for k, v in os.environ.items() if k not in ("GRADSYNC_TOKEN", "LOCAL_RANK")}
    failed = False
    for name in names:
        p = subprocess.run([os.path.join(bin_dir, name), "--help-markdown"], capture_output=True,
                           text=True, env=env, check=True)
        want = p.stdout.splitlines(keepends=True)
        start, end = find_table(lines, name)
        if lines[start:end] == want:
            print(f"{name}: README table matches --help-markdown")
            continue
        if update:
            lines[start:end] = want
            print(f"{name}: README table updated")
            continue
        failed = True
        sys.stdout.writelines(difflib.unified_diff(lines[start:end], want, "README.md",
                                                   f"{name} --help-markdown"))
        print(f"{name}: README table differs from the flag table in the code; run\n"
              f"  python3 tests/readme_flags.py --update README.md BIN_DIR {name}")
    if update:
        with open(readme, "w", encoding="utf-8") as f:
            f.writelines(lines)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
