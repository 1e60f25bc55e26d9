#!/usr/bin/env bash
# Gate the memory-bound corpus workloads on the GPU against the vendor path (torch eager), recorded:
# every naive and expert kernel of the nine problems in tests/test_corpus_memory_bound.py.
#   1. correctness: each kernel on every case x 3 seeds, untimed, $JOBS gates side by side (the gate is
#      host-bound), each verdict recorded;
#   2. timing: one expert at a time on the headline case (1 seed), against its naive kernel; the gate
#      times the vendor path beside them (torch eager), recorded: the expert's ratios to both, paired.
# Usage, on the GPU host from the repo root with klineage importable (bench/gpu_session.sh sets that up):
#   bash bench/corpus_memory_bound.sh OUT_DIR        or the gpu_session stage: corpus_mb
# Writes OUT_DIR/corpus_mb/<problem>_<kernel>.correct.json (every kernel) and .timed.json (the experts), and
# OUT_DIR/corpus_memory_bound.json (one row per kernel: status, cases passed, headline ratio vs the vendor,
# medians, roofline fraction, whether the timing settled). Env: JOBS (4), GATE_S (seconds a gate, 240),
# CORPUS_MB_SHARE (I/N: this lane's share of the kernels, for gpu_session --lanes).
set -u
out=${1:?usage: corpus_memory_bound.sh OUT_DIR}
mkdir -p "$out/corpus_mb"
py=${PYTHON:-python3}
kernels=(group_norm/naive group_norm/smem_vec4 causal_softmax/naive causal_softmax/warp_vec4 rope/naive rope/pack8
         column_max/naive column_max/split_vec4 logcumsumexp/naive logcumsumexp/block_scan
         nchw_to_nhwc/naive nchw_to_nhwc/smem_tile embedding_bag/naive embedding_bag/gather_vec4
         sgd_nesterov/naive sgd_nesterov/vec4_grid add_rms_norm/naive add_rms_norm/pack8_regs)
share=${CORPUS_MB_SHARE:-0/1}; lane=${share%/*}; lanes=${share#*/}
mine=(); for i in "${!kernels[@]}"; do (( i % lanes == lane )) && mine+=("${kernels[$i]}"); done

gate() {  # gate KERNEL SUFFIX ARGS...: one recorded verdict as JSON
  local kernel=$1 suffix=$2; shift 2
  timeout "${GATE_S:-240}" $py -m klineage gate "${kernel%%/*}" "$kernel" --sanitize never --record --json "$@" \
    > "$out/corpus_mb/${kernel//\//_}.$suffix.json" 2> "$out/corpus_mb/${kernel//\//_}.$suffix.log"
  echo "$kernel $suffix: exit $?"
}

echo "== correctness, ${#mine[@]} kernels, ${JOBS:-4} side by side ($(date -u +%T))"
running=0
for kernel in "${mine[@]}"; do
  gate "$kernel" correct --no-timing &
  running=$((running + 1))
  if (( running >= ${JOBS:-4} )); then wait -n; running=$((running - 1)); fi
done
wait
echo "== timing on the headline: each expert against its naive kernel and the vendor, one at a time ($(date -u +%T))"
for kernel in "${mine[@]}"; do
  [ "${kernel#*/}" = naive ] || gate "$kernel" timed --against "${kernel%%/*}/naive" --cases headline --seeds 1
done
echo "== done ($(date -u +%T))"
$py bench/corpus_memory_bound.py "$out/corpus_mb" --out "$out/corpus_memory_bound${CORPUS_MB_SHARE:+-$lane}.json"
