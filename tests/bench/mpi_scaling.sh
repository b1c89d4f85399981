#!/usr/bin/env bash
# Weak and strong scaling of kvscope-mpi on one machine (docs/scale-out.md). A sweep of Llama-
# shaped bundles (8 KV heads of 128, 16 layers, two prompts of 1,000 tokens and 24 decode steps,
# three-way; `kvscope synth --model-free`, about 310 MB each) is analysed:
#   strong: the whole sweep by kvscope (1 and 2 threads) and by kvscope-mpi at 1 and 2 ranks of
#           one thread each (the ranks are then the only parallelism);
#   weak:   half the sweep at 1 rank against the whole at 2 ranks.
# Every run's JSON must be the one kvscope writes (the script stops otherwise). Prints seconds,
# peak RSS per process and the bytes the ranks exchanged (KVSCOPE_MPI_STATS).
# Usage: mpi_scaling.sh [--bundles 20] [--dir DIR] [--keep] [--runs 2]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${KVSCOPE_BUILD:-$here/build}
kvscope=$build/app/kvscope
kvscope_mpi=$build/app/kvscope-mpi
bundles=20 dir="" keep=0 runs=2
while [ $# -gt 0 ]; do
  case $1 in
    --bundles) bundles=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --runs) runs=$2; shift 2 ;;
    *) echo "usage: $0 [--bundles 20] [--dir DIR] [--keep] [--runs 2]" >&2; exit 2 ;;
  esac
done
[ -x "$kvscope_mpi" ] || { echo "no $kvscope_mpi: build with MPI (libopenmpi-dev)" >&2; exit 2; }
[ -n "$dir" ] || dir=$(mktemp -d)
[ $keep -eq 1 ] || trap 'rm -rf "$dir/whole" "$dir/half" "$dir"/*.json' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$dir/whole" "$dir/half"
for i in $(seq 1 "$bundles"); do
  name=$(printf 'worker%02d.h5' "$i")
  [ -f "$dir/whole/$name" ] || "$kvscope" synth "$dir/whole/$name" --model-free --layers 16 --kv-heads 8 --head-dim 128 \
    --prompts 1000,1000 --decode 24 --seed "$i" >/dev/null
  [ "$i" -gt $((bundles / 2)) ] || ln -sf "$dir/whole/$name" "$dir/half/$name"
done
echo "sweep: $bundles bundles, $(du -sh -L "$dir/whole" | cut -f1) ($(nproc) cores)"

# best of `runs`: seconds and peak RSS (MB, the largest process: every rank is measured by
# /usr/bin/time of its own, appending to one file)
measure() {
  local label=$1 expect=$2 out=$3; shift 3
  local best="" rss=""
  for _ in $(seq 1 "$runs"); do
    local start end
    rm -f "$dir/rss"
    start=$(date +%s.%N)
    "$@" >/dev/null 2>"$dir/stderr" || { cat "$dir/stderr" >&2; exit 1; }
    end=$(date +%s.%N)
    local s; s=$(echo "$end - $start" | bc)
    if [ -z "$best" ] || [ "$(echo "$s < $best" | bc)" -eq 1 ]; then best=$s; rss=$(sort -n "$dir/rss" | tail -1); fi
  done
  [ -z "$expect" ] || cmp -s "$expect" "$out" || { echo "FAIL: $label: JSON differs from kvscope's" >&2; exit 1; }
  printf '%-44s %7.2f s  %6d MB\n' "$label" "$best" $((rss / 1024))
  grep "kvscope-mpi:" "$dir/stderr" | sed 's/^/    /' || true
}

export KVSCOPE_MPI_STATS=1
timed() { /usr/bin/time -a -o "$dir/rss" -f "%M" "$@"; }
echo "strong scaling (the whole sweep):"
measure "kvscope analyze, 1 thread" "" "$dir/one.json" timed "$kvscope" analyze "$dir/whole" --threads 1 --json "$dir/one.json"
measure "kvscope analyze, 2 threads" "$dir/one.json" "$dir/two.json" timed "$kvscope" analyze "$dir/whole" --threads 2 --json "$dir/two.json"
measure "kvscope-mpi -np 1, 1 thread" "$dir/one.json" "$dir/np1.json" \
  mpirun -np 1 /usr/bin/time -a -o "$dir/rss" -f "%M" "$kvscope_mpi" analyze "$dir/whole" --threads 1 --json "$dir/np1.json"
measure "kvscope-mpi -np 2, 1 thread each" "$dir/one.json" "$dir/np2.json" \
  mpirun -np 2 /usr/bin/time -a -o "$dir/rss" -f "%M" "$kvscope_mpi" analyze "$dir/whole" --threads 1 --json "$dir/np2.json"
echo "weak scaling (bundles per rank fixed):"
measure "kvscope-mpi -np 1, half the sweep" "" "$dir/half.json" \
  mpirun -np 1 /usr/bin/time -a -o "$dir/rss" -f "%M" "$kvscope_mpi" analyze "$dir/half" --threads 1 --json "$dir/half.json"
measure "kvscope-mpi -np 2, the whole sweep" "$dir/one.json" "$dir/np2w.json" \
  mpirun -np 2 /usr/bin/time -a -o "$dir/rss" -f "%M" "$kvscope_mpi" analyze "$dir/whole" --threads 1 --json "$dir/np2w.json"
echo "every JSON of the whole sweep is kvscope's, byte for byte"
