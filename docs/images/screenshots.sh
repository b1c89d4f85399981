#!/usr/bin/env bash
# The README's pictures, made anew from the built-in demo capture: the main view and the
# across-prompts page, each at 1280x800 under Xvfb (apt-get install xvfb xauth).
#   bash docs/images/screenshots.sh [BUILD_DIR]   (default: build)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kvscope=$(cd "${1:-$here/../../build}" && pwd)/app/kvscope
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$kvscope" synth "$work/demo.h5" --demo >/dev/null
xvfb-run -a -s "-screen 0 1600x1000x24" "$kvscope" "$work/demo.h5" --screenshot "$here/main-view.png"
xvfb-run -a -s "-screen 0 1600x1000x24" "$kvscope" "$work/demo.h5" --screenshot "$here/across-prompts.png" --across
# Two pictures of one view would say the same thing twice.
if cmp -s "$here/main-view.png" "$here/across-prompts.png"; then
  echo "screenshots.sh: the two pictures are the same" >&2
  exit 1
fi
echo "wrote $here/main-view.png and $here/across-prompts.png"
