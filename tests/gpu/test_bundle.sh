#!/usr/bin/env bash
# Runs tests/gpu/bundle.sh on this build into a temporary folder and checks
# the bundle stands on its own: under the 64 MiB limit (bundle.sh refuses
# more), every library it carries is the one its binaries load (the
# $ORIGIN rpath works), and the bundled launcher trains a few steps on the
# cpu device. Runs everywhere (no GPU needed); a CPU-only build is bundled
# with --allow-cpu.
#
# usage: test_bundle.sh BUILD_DIR   (data: the agent's default, Fashion-MNIST
# from the Debian package)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: test_bundle.sh BUILD_DIR}
tmp=$(mktemp -d /tmp/gs_bundle_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test_bundle: FAIL: $*" >&2; exit 1; }

allow=()
"$build/bin/gradsync-agent" --version | grep -q cuda || allow=(--allow-cpu)
bash "$here/bundle.sh" "${allow[@]}" "$build" "$tmp/gpu-bundle"
b="$tmp/gpu-bundle"
[ -f "$tmp/gpu-bundle.tar.gz" ] || fail "no tarball"

# Every bundled library must be loaded from the bundle, by every binary.
for f in "$b"/bin/*; do
  [ "$(head -c 4 "$f" | tail -c 3)" = ELF ] || continue
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [ "$path" != "not" ] || fail "$(basename "$f") cannot find $name"
    if [ -e "$b/lib/$name" ] && [ "$(realpath "$path")" != "$(realpath "$b/lib/$name")" ]; then
      fail "$(basename "$f") loads $name from $path, not from the bundle"
    fi
  done < <(ldd "$f")
  echo "test_bundle: $(basename "$f"): bundled libraries resolve into the bundle"
done

"$b/bin/gradsync-agent" --version
"$b/bin/gradsync-coordinator" --help >/dev/null
# The bundled launcher, coordinator and agent train a few steps together.
out=$("$b/bin/gradsync-run" --nproc 1 --device cpu --steps 30 --no-validate \
      --log-level warn 2>&1) || fail "bundled training failed: $out"
grep -q "final:" <<<"$out" || fail "no final line: $out"
echo "test_bundle: bundled training: $(grep final: <<<"$out")"

# Without a GPU the bundle's run.sh skips (exit 77, the benchmark SKIP),
# never FAILs: what a GPU-less machine reports is "nothing to run here".
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  rc=0
  out=$(bash "$b/bin/run.sh" "$b" "$tmp/report" --only kernels,parity,bench 2>&1) || rc=$?
  [ "$rc" -eq 77 ] || fail "run.sh without a GPU exited $rc, want 77: $out"
  grep -q '^| bench | SKIP | 0 | no CUDA device visible' "$tmp/report/report.md" ||
    fail "run.sh without a GPU did not mark the benchmark SKIP: $(cat "$tmp/report/report.md")"
  ! grep -q '| FAIL |' "$tmp/report/report.md" || fail "run.sh without a GPU: a FAIL: $out"
  echo "test_bundle: run.sh without a GPU: skipped (exit 77), benchmark SKIP"
fi
echo "test_bundle: ok"
