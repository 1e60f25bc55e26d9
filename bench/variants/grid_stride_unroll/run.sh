#!/bin/bash
# Would unrolling a grid-stride loop (more loads in flight a thread) pay where more blocks did not? (README.md here.)
# The base is mse_loss's vector loop as the catalog writes it (unaggregate_atomics, then scalarize_grid_stride, on
# the naive kernel's 256 blocks); each variant is that kernel folder with kernel.cu replaced by the one here, and
# `sized` is the base on fix_grid_cap's num_sms * 8 blocks. On a GPU host each is gated against the base, paired, on
# every case. MAKE_ONLY=1 stops after making them.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=${VARIANTS_DIR:-/tmp/grid_stride_unroll}
py=${PYTHON:-python3}
. "$(dirname "$0")/../gpu_host.sh"
problem=bench/transfer/mse_loss/problem.py
"$py" - "$dir" <<'PY'
import sys
from pathlib import Path

from klineage.kernel import load_kernel
from klineage.kernel_export import write_kernel_folder
from klineage.transforms import get

state = load_kernel(Path("bench/transfer/mse_loss/naive"))
for name in ("unaggregate_atomics", "scalarize_grid_stride", "fix_grid_cap"):
    if name == "fix_grid_cap":
        write_kernel_folder(state, Path(sys.argv[1]) / "base")
    forward = get(name)
    state = forward.forward(state, forward.forward_sites(state)[0]).state
write_kernel_folder(state, Path(sys.argv[1]) / "sized")
PY
for variant in u2_guarded u4_guarded u4_split; do
  rm -rf "$dir/$variant" && cp -r "$dir/base" "$dir/$variant" && cp "$here/$variant.cu" "$dir/$variant/kernel.cu"
done
rm -rf "$dir/u4_split_sized" && cp -r "$dir/sized" "$dir/u4_split_sized" && cp "$here/u4_split.cu" "$dir/u4_split_sized/kernel.cu"
[ -n "${MAKE_ONLY:-}" ] && exit 0
for variant in sized u2_guarded u4_guarded u4_split u4_split_sized; do
  judge "$variant" "$problem" "$dir/$variant" "$dir/base"
done
