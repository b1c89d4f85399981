#!/usr/bin/env bash
# A stop request (kill, Ctrl+C, a scheduler's SIGTERM) reaches kvscope's parent process while the
# work runs in its guarded child: the child must stop too, and an unfinished results file must
# neither be finished nor left behind as RUN.kvres.partial.
set -u
kvscope=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$kvscope" synth "$dir/b.h5" --layers 16 --prompts 1500 --decode 8 >/dev/null || exit 2
# (Not INT: a script's background job starts with SIGINT ignored, which kvscope leaves so;
# Ctrl+C in a terminal reaches the child itself, in the foreground process group.)
for signal in TERM HUP; do
  rm -f "$dir/r.kvres"
  "$kvscope" analyze "$dir/b.h5" --save "$dir/r.kvres" --threads 1 >/dev/null 2>"$dir/err" &
  pid=$!
  for _ in $(seq 500); do [ -e "$dir/r.kvres.partial" ] && break; sleep 0.005; done
  if [ ! -e "$dir/r.kvres.partial" ]; then
    wait $pid; echo "SIG$signal: the analysis ended before it could be stopped: nothing tested"; exit 2
  fi
  kill -s $signal $pid
  wait $pid
  code=$?
  sleep 0.5  # a child that ignored the request would finish and rename its file meanwhile
  if [ -e "$dir/r.kvres" ] || [ -e "$dir/r.kvres.partial" ]; then
    echo "SIG$signal: a results file was left:"; ls "$dir"; exit 1
  fi
  if [ $code -lt 128 ] || ! grep -q "stopped" "$dir/err"; then
    echo "SIG$signal: exit $code, stderr:"; cat "$dir/err"; exit 1
  fi
done
echo "stopped on request: nothing left behind"
