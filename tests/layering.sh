#!/usr/bin/env bash
# The folders tell the truth: each folder of core/ includes only the folders below it, core/
# and app/commands/ include no Qt, and metrics/ does no I/O. Prints each include that breaks a rule.
set -u
root=${1:-$(dirname "$0")/..}
cd "$root" || exit 2
declare -A allowed=(
  [util]="util"
  [format]="util format"
  [kv]="util format kv"
  [metrics]="util metrics"
  [analysis]="util format kv metrics analysis"
  [results]="util format kv metrics analysis results"
  [diff]="util format kv metrics analysis results diff"
  [synth]="util format kv quant synth"
  [dumps]="util format dumps"
  [quant]="util format kv quant"
  [transfer]="util format kv analysis transfer"
)
bad=0
for folder in "${!allowed[@]}"; do
  while IFS=: read -r file _ line; do
    dep=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")
    if [[ " ${allowed[$folder]} " != *" $dep "* ]]; then
      echo "$file: core/$folder may not include $dep/: $line"
      bad=1
    fi
  done < <(grep -Hn '#include "[a-z_]*/' core/"$folder"/*.h core/"$folder"/*.cpp 2>/dev/null)
done
# No Qt in the engine or in kvscope's Qt-free commands.
if grep -Hn -E '#include <Q[A-Za-z]*>|#include <Qt' core/*/*.h core/*/*.cpp app/commands/*.h app/commands/*.cpp; then
  echo "Qt included where it may not be (above)"
  bad=1
fi
[ "$bad" = 0 ] && echo "layering: every include follows the folders' rules"
exit "$bad"
