#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine: installs what is missing, builds, then
#   packaging/dev.sh demo   runs kvscope on the built-in demo capture
#   packaging/dev.sh test   runs the whole test suite (ctest)
set -euo pipefail
cd "$(dirname "$0")/.."

bash packaging/setup-debian.sh
cmake --preset default >/dev/null
cmake --build --preset default

case "${1:-}" in
  demo) shift; exec ./build/app/kvscope demo "$@" ;;
  test) exec ctest --preset default ;;
  *) echo "usage: packaging/dev.sh demo|test" >&2; exit 2 ;;
esac
