#!/usr/bin/env bash
# One GPU-host session: install the carried wheels, run the gate evidence, and bring results back in $OUT.
# Usage (on the GPU host, from the repo root): bash bench/gpu_session.sh COMMIT STAGE...
# Stages: smoke, suite, example, adversarial, cost, gputests, multigpu, or PROBLEM:KERNEL (a gate run, recorded).
# multigpu needs PostgreSQL and Redis there: the pgserver wheel in .whl and redis-server in .hostbin (carried).
set -u
commit=${1:-unknown}; shift || true
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KLINEAGE_GIT_COMMIT=$commit
export KLINEAGE_CACHE_DIR=/tmp/kcache KLINEAGE_RECORDED_DIR=$OUT/recorded NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
echo "sanitizer: $(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)"
export PATH=$PATH:/usr/local/cuda/bin
for stage in "$@"; do
  echo "=== $stage"
  case $stage in
    smoke) timeout 240 python3 -m klineage gate row_softmax row_softmax/naive --sanitize never ;;
    suite) timeout 420 python3 bench/gate_suite.py --out "$OUT/results" ;;
    multigpu) chmod -R a+rX /tmp/site
      PATH=/tmp/site/pgserver/pginstall/bin:$PWD/.hostbin:$PATH timeout 540 python3 bench/multigpu.py ${MULTIGPU_ARGS:-} --out "$OUT/results/multigpu.json" ;;
    gputests) timeout 300 python3 -m pytest tests/test_gpu_gate.py -q -n 0 -p no:django -p no:cacheprovider -rA ;;
    example|adversarial|cost) timeout 500 python3 bench/gate_suite.py --out "$OUT/results" --only $stage ;;
    *:*) timeout ${GATE_TIMEOUT:-200} python3 -m klineage gate "${stage%%:*}" "${stage#*:}" --sanitize never --record ;;
  esac 2>&1 | tee -a "$OUT/log.txt" | tail -60
done
(cd "$OUT" && [ -d recorded ] && tar czf recorded.tgz recorded && rm -rf recorded)
ls -la "$OUT" "$OUT/results" 2>/dev/null
