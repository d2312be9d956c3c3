#!/usr/bin/env bash
# The default way to try gradsync: two CPU ranks train the reference MLP on
# Fashion-MNIST for 3 epochs through a local coordinator, then print the
# final test accuracy. Usage: scripts/demo.sh [BUILD_DIR] [extra gradsync-run flags]
# (from any directory; BUILD_DIR defaults to the repository's build/)
set -euo pipefail
# The build folder: the first argument unless it is a flag, else the
# repository's build/, wherever this is run from.
build=$(cd "$(dirname "$0")/.." && pwd)/build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  build=$1
  shift
fi
run="$build/bin/gradsync-run"
[ -x "$run" ] || { echo "demo: $run not built; run 'make build'" >&2; exit 1; }

echo "+ gradsync-run --nproc 2 --reduce mean --epochs 3 --schedule cosine --log-level warn $*"
exec "$run" --nproc 2 --reduce mean --epochs 3 --schedule cosine --log-level warn "$@"
