#!/usr/bin/env bash
# Fails when a C, header or CUDA file of the tree differs from what
# clang-format makes of it with the committed .clang-format (run by
# `make test` as the ctest `format`). Fix with: scripts/check-format.sh --fix
set -euo pipefail
cd "$(dirname "$0")/.."
mode=(--dry-run -Werror)
[ "${1:-}" = "--fix" ] && mode=(-i)
command -v clang-format >/dev/null || { echo "check-format: clang-format is not installed (scripts/install-deps.sh)" >&2; exit 1; }
mapfile -t files < <(find agent coordinator common python tests bench \
  \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) -type f | sort)
clang-format "${mode[@]}" "${files[@]}"
echo "check-format: ${#files[@]} files formatted as .clang-format says"
