# Sourced by the variant scripts here (after setting py): on the GPU host (unless MAKE_ONLY is set), the carried wheels installed,
# CUDA on the PATH, a cache of the call's own and the carried bubblewrap as the sandbox.
if [ -z "${MAKE_ONLY:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site PATH=$PATH:/usr/local/cuda/bin KLINEAGE_CACHE_DIR=/tmp/kc
  chmod +x .hostbin/bwrap; export KLINEAGE_BWRAP=$PWD/.hostbin/bwrap
fi

# judge NAME PROBLEM VARIANT AGAINST [GATE_ARGS...]: gate VARIANT against AGAINST, paired, and print one line: the
# status, whether the timing settled, against's time / the variant's time and each trial's, or why no verdict came.
judge() {
  local name=$1 problem=$2 variant=$3 against=$4; shift 4
  timeout 120 "$py" -m klineage gate "$problem" "$variant" --against "$against" --json "$@" \
    > "/tmp/$name.json" 2> "/tmp/$name.err" || true
  "$py" - "$name" <<'PY'
import json, sys
name = sys.argv[1]
try:
    d = json.load(open(f"/tmp/{name}.json"))
except ValueError as exc:
    print(name, "no verdict:", exc, open(f"/tmp/{name}.err").read()[-400:]); raise SystemExit
r = (d.get("profile") or {}).get("ratios", {}).get("vs_baseline", {})
print(f"{name:22s} {d.get('status')} settled={not d.get('unsettled', False)} against_time/variant_time={r.get('overall')} "
      f"trials={r.get('per_trial')}")
PY
}
