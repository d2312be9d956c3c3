#!/usr/bin/env bash
# The default way to try gradsync: two CPU ranks train the reference MLP on
# Fashion-MNIST for 3 epochs through a local coordinator, then print the
# final test accuracy. Usage: scripts/demo.sh [BUILD_DIR] [extra gradsync-run flags]
set -euo pipefail
build=${1:-build}
shift || true
run="$build/bin/gradsync-run"
[ -x "$run" ] || { echo "demo: $run not built; run 'make build'" >&2; exit 1; }

echo "+ gradsync-run --nproc 2 --reduce mean --epochs 3 --schedule cosine --log-level warn $*"
exec "$run" --nproc 2 --reduce mean --epochs 3 --schedule cosine --log-level warn "$@"
