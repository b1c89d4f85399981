#!/bin/bash
# Every unit of core/ has a test: a test that includes its header, or a line of
# unit_coverage.txt naming the tests that cover it, which must exist.
# usage: unit_coverage.sh SOURCE_DIR BUILD_DIR
set -u
src=$1 build=$2
tests=$(ctest --test-dir "$build" -N | sed -n 's/^ *Test *#[0-9]*: //p')
failed=0
declare -A listed
while read -r header names; do
  [[ -z "$header" || "$header" == \#* ]] && continue
  listed[$header]=1
  [[ -f "$src/core/$header" ]] || { echo "unit_coverage.txt: core/$header does not exist"; failed=1; }
  for name in $names; do
    grep -qx "$name" <<<"$tests" || { echo "unit_coverage.txt: $header: no test named $name"; failed=1; }
  done
done < "$src/tests/unit_coverage.txt"
cd "$src/core" || exit 2
for header in $(find . -name '*.h' | sed 's|^\./||' | sort); do
  if ! grep -rqs --include='*.cpp' --include='*.h' "#include \"$header\"" "$src/tests" && [[ -z "${listed[$header]:-}" ]]; then
    echo "core/$header: no test includes it, and tests/unit_coverage.txt names none that covers it"
    failed=1
  fi
done
exit $failed
