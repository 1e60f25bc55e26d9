#!/bin/bash
# Would a 16-byte register row cache pay on the library's row-normalization kernels? (README.md here.)
# The library's kernels are made, not stored: each operator's library_then_catalog best kernel replayed off its recorded
# verdicts (`optimize --gate replay --save`); each variant is that kernel folder with kernel.cu replaced by the one
# here. On a GPU host each variant is gated against its operator's library kernel, paired, on every case.
# MAKE_ONLY=1 stops after making them.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=${VARIANTS_DIR:-/tmp/transfer_vec4}
py=${PYTHON:-python3}
. "$(dirname "$0")/../gpu_host.sh"
for op in rms_norm layer_norm; do
  $py -m klineage optimize "bench/transfer/$op/problem.py" --from "bench/transfer/$op/naive" --gate replay \
    --budget 8 --strategy library_then_catalog --save "$dir/${op}_lib" --out "$dir/${op}_lib.json" >/dev/null
  rm -rf "$dir/${op}_vec4" && cp -r "$dir/${op}_lib" "$dir/${op}_vec4" && cp "$here/${op}_vec4.cu" "$dir/${op}_vec4/kernel.cu"
done
[ -n "${MAKE_ONLY:-}" ] && exit 0
for op in rms_norm layer_norm; do
  judge "${op}_vec4" "bench/transfer/$op/problem.py" "$dir/${op}_vec4" "$dir/${op}_lib"
done
