#!/bin/bash
# Which spelling costs the library's transfer kernels time on layer_norm and l2_normalize (README.md here).
# The kernels are made, not stored: each strategy's best kernel replayed off its recorded verdicts
# (`optimize --gate replay --save`), the variants edited from the library's. Then, on a GPU host, each variant
# is gated against its operator's library kernel, paired on the headline case. MAKE_ONLY=1 stops after making them.
set -eu
dir=${VARIANTS_DIR:-/tmp/transfer_ldg}
py=${PYTHON:-python3}
. "$(dirname "$0")/../gpu_host.sh"
for op in layer_norm l2_normalize; do
  # the library's search cut at 3 evaluations: its kernel as session 34 measured it (since the catalog gates passed-over
  # kernels last, l2_normalize's search goes on to fill the row cache through __ldg itself)
  for run in lib:library_then_catalog:3 unc:unconditioned_random:8; do
    strategy=${run#*:}
    $py -m klineage optimize "bench/transfer/$op/problem.py" --from "bench/transfer/$op/naive" --gate replay \
      --budget "${strategy#*:}" --strategy "${strategy%:*}" --save "$dir/${op}_${run%%:*}" --out "$dir/${op}_${run%%:*}.json" >/dev/null
  done
  cp -r "$dir/${op}_lib" "$dir/${op}_no_lb" && sed -i 's/__launch_bounds__(128) //' "$dir/${op}_no_lb/kernel.cu"
done
cp -r "$dir/layer_norm_lib" "$dir/layer_norm_no_ldg" && sed -i -E 's/__ldg\(&([a-z]+)\[j\]\)/\1[j]/g' "$dir/layer_norm_no_ldg/kernel.cu"
[ -n "${MAKE_ONLY:-}" ] && exit 0
for v in layer_norm_no_lb layer_norm_no_ldg layer_norm_unc l2_normalize_no_lb l2_normalize_unc; do
  op=${v%_no_lb}; op=${op%_no_ldg}; op=${op%_unc}
  judge "$v" "bench/transfer/$op/problem.py" "$dir/$v" "$dir/${op}_lib" --sanitize never
done
