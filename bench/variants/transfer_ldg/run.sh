#!/bin/bash
# Which of the library's extra spellings costs time on layer_norm and l2_normalize: each variant paired with
# the library's best kernel (the baseline) on the headline case, H200.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PATH=$PATH:/usr/local/cuda/bin KLINEAGE_CACHE_DIR=/tmp/kc
chmod +x .hostbin/bwrap; export KLINEAGE_BWRAP=$PWD/.hostbin/bwrap
for v in layer_norm_no_lb layer_norm_no_ldg layer_norm_unc l2_normalize_no_lb l2_normalize_unc; do
  op=${v%_no_lb}; op=${op%_no_ldg}; op=${op%_unc}
  timeout 100 python3 -m klineage gate bench/transfer/$op/problem.py bench/variants/transfer_ldg/$v --against bench/variants/transfer_ldg/${op}_lib \
    --sanitize never --json > /tmp/$v.json 2>/tmp/$v.err
  python3 - "$v" <<'PY'
import json, sys
v = sys.argv[1]
try:
    d = json.load(open(f"/tmp/{v}.json"))
except Exception as exc:
    print(v, "no verdict:", exc, open(f"/tmp/{v}.err").read()[-400:]); raise SystemExit
r = (d.get("profile") or {}).get("ratios", {}).get("vs_baseline", {})
print(f"{v:22s} {d.get('status')} lib_time/variant_time={r.get('overall')} trials={r.get('per_trial')} unsettled={d.get('unsettled')}")
PY
done
