#!/usr/bin/env bash
# A reader that stops early (`kvscope analyze X | head`) is not the file's fault: the command
# must not report its bundle as having crashed the HDF5 library.
set -u
kvscope=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$kvscope" synth "$dir/b.h5" --layers 8 --prompts 100 --decode 16 >/dev/null || exit 2
for _ in 1 2 3; do
  # The JSON to the pipe: megabytes, written long after the reader has gone.
  "$kvscope" analyze "$dir/b.h5" --json /dev/stdout 2>"$dir/err" | head -c 1 >/dev/null
  if grep -q "crashed" "$dir/err"; then
    echo "reported as a crash:"; cat "$dir/err"; exit 1
  fi
done
echo "output closed early: no crash reported"
