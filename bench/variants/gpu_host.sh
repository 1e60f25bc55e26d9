# Sourced by the variant scripts here: on the GPU host (unless MAKE_ONLY is set), the carried wheels installed,
# CUDA on the PATH, a cache of the call's own and the carried bubblewrap as the sandbox.
if [ -z "${MAKE_ONLY:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site PATH=$PATH:/usr/local/cuda/bin KLINEAGE_CACHE_DIR=/tmp/kc
  chmod +x .hostbin/bwrap; export KLINEAGE_BWRAP=$PWD/.hostbin/bwrap
fi
