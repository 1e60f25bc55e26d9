#!/bin/bash
# Would a 16-byte register row cache pay on the library's row-normalization kernels? (README.md here.)
# The library's kernels are made, not stored: each operator's library_then_catalog best kernel replayed off its recorded
# verdicts (`optimize --gate replay --save`); each variant is that kernel folder with kernel.cu replaced by the one
# here. On a GPU host each variant is gated against its operator's library kernel, paired, on every case.
# MAKE_ONLY=1 stops after making them.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=${VARIANTS_DIR:-/tmp/transfer_vec4}
. "$(dirname "$0")/../gpu_host.sh"
py=${PYTHON:-python3}
for op in rms_norm layer_norm; do
  $py -m klineage optimize "bench/transfer/$op/problem.py" --from "bench/transfer/$op/naive" --gate replay \
    --budget 8 --strategy library_then_catalog --save "$dir/${op}_lib" --out "$dir/${op}_lib.json" >/dev/null
  rm -rf "$dir/${op}_vec4" && cp -r "$dir/${op}_lib" "$dir/${op}_vec4" && cp "$here/${op}_vec4.cu" "$dir/${op}_vec4/kernel.cu"
done
[ -n "${MAKE_ONLY:-}" ] && exit 0
for op in rms_norm layer_norm; do
  timeout 120 $py -m klineage gate "bench/transfer/$op/problem.py" "$dir/${op}_vec4" --against "$dir/${op}_lib" \
    --json > "/tmp/${op}_vec4.json" 2>"/tmp/${op}_vec4.err" || true
  $py - "$op" <<'PY'
import json, sys
op = sys.argv[1]
try:
    d = json.load(open(f"/tmp/{op}_vec4.json"))
except ValueError as exc:
    print(op, "no verdict:", exc, open(f"/tmp/{op}_vec4.err").read()[-400:]); raise SystemExit
r = (d.get("profile") or {}).get("ratios", {}).get("vs_baseline", {})
print(f"{op}_vec4 {d.get('status')} settled={not d.get('unsettled', False)} lib_time/variant_time={r.get('overall')} "
      f"trials={r.get('per_trial')} per_case={r.get('per_case')}")
PY
done
