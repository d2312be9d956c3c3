#!/usr/bin/python3
"""Every command of the README's quick start runs as written.

    readme_quickstart.py SOURCE_DIR BUILD_DIR

The quick start is the first fenced code block after the marker
`<!-- quickstart` in README.md, under its "## Quick start" heading. Each
line of it is a command (a `#` comment after it is the shell's); they run
in order, in one bash (`set -e`), from the source tree, as a person who
just cloned it would type them.

Except one: `make test`. CI runs exactly that line (`.ci/run`, checked
here), and ctest runs this test inside it, so running it here would run
the whole suite again from within itself, forever. That line is skipped,
saying so; every other line runs.

Clean state: the environment loses what an enclosing `make test` or a
scheduler put there (MAKEFLAGS and MAKELEVEL, gradsync's, torchrun's and
SLURM's variables), so the commands see a plain shell's. They use the build
that ctest runs in: `make demo` builds into `build/`, which `make test` has
already built, so its `cmake --build` finds nothing to do (a stale build
is rebuilt, as the README promises, and this test says it was). When
ctest runs in another build folder, BUILD is set to it in the environment
(the Makefile's `BUILD ?= build` takes it), so the text of each command
stays as written and no second build is made. The demo must finish and
print a final test accuracy above 0.80 (the README says about 0.866).
"""
import os
import re
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testlib  # noqa: E402,F401  (its deadline, and nothing left running)

MARKER = "<!-- quickstart"
HEADING = "## Quick start"
SKIPPED = {"make test": "what CI runs (.ci/run); it cannot run inside make test, which runs this test"}
DROP_ENV = re.compile(r"^(MAKEFLAGS|MFLAGS|MAKELEVEL|MAKEOVERRIDES|GRADSYNC_.*|MASTER_ADDR|"
                      r"MASTER_PORT|WORLD_SIZE|LOCAL_RANK|RANK|LOCAL_WORLD_SIZE|PET_.*|SLURM_.*|"
                      r"SLURMD_.*|JOB_COMPLETION_INDEX)$")


def quickstart_commands(readme):
    """The command lines of the quick start block, as written."""
    with open(readme, encoding="utf-8") as f:
        lines = f.read().splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith(MARKER)), None)
    if at is None:
        sys.exit(f"{readme}: no '{MARKER}' marker before the quick start's code block")
    heading = next((line for line in reversed(lines[:at]) if line.startswith("## ")), None)
    if heading != HEADING:
        sys.exit(f"{readme}: the quick start marker is under '{heading}', not '{HEADING}'")
    start = next((i for i in range(at + 1, len(lines)) if lines[i].startswith("```")), None)
    if start is None or any(line.strip() for line in lines[at + 1:start]):
        sys.exit(f"{readme}: the marker is not directly followed by a code block")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("```")), None)
    if end is None:
        sys.exit(f"{readme}: the quick start's code block does not end")
    commands = [line for line in lines[start + 1:end] if line.strip()]
    if not commands:
        sys.exit(f"{readme}: the quick start's code block is empty")
    return commands


def command_of(line):
    """The command without a trailing shell comment, for matching."""
    return shlex.split(line, comments=True)


def ci_runs_make_test(src):
    with open(os.path.join(src, ".ci", "run"), encoding="utf-8") as f:
        return any(command_of(line) == ["make", "test"] for line in f)


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    src, build = (os.path.realpath(a) for a in argv)
    commands = quickstart_commands(os.path.join(src, "README.md"))
    env = {k: v for k, v in os.environ.items() if not DROP_ENV.match(k)}
    if build != os.path.join(src, "build"):
        env["BUILD"] = build
        print(f"BUILD={build} in the environment (ctest's build folder; the README's is build/)")
    script = ["set -e"]
    ran = []
    for line in commands:
        words = " ".join(command_of(line))
        if words in SKIPPED:
            if words == "make test" and not ci_runs_make_test(src):
                sys.exit("the quick start's 'make test' is skipped because .ci/run runs it, "
                         "but .ci/run has no 'make test' line")
            print(f"skipped: {line}\n  ({SKIPPED[words]})")
            continue
        script += [f"echo {shlex.quote('+ ' + line)}", line]
        ran.append(line)
    if not ran:
        sys.exit("no quick start command left to run")
    p = subprocess.run(["bash", "-c", "\n".join(script)], cwd=src, env=env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        print(f"FAILED: the quick start's commands exited {p.returncode}")
        return 1
    if re.search(r"^\[ *\d+%\] (Building|Linking)", p.stdout, re.M):
        print("note: the build was not up to date; the quick start rebuilt it")
    if any(command_of(line)[:2] == ["make", "demo"] for line in ran):
        m = re.search(r"final: test accuracy ([0-9.]+)", p.stdout)
        if not m or float(m.group(1)) <= 0.80:
            print(f"FAILED: make demo printed {m.group(0) if m else 'no final test accuracy'}; "
                  "the README promises about 0.866")
            return 1
    print(f"ok: ran {len(ran)} quick start command(s) as written: {'; '.join(ran)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
