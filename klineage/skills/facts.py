"""What a measured case is valued by when induction asks where a step pays (klineage.skills.when): its
parameters, what the step's parent kernel's launch plan makes of them, what ptxas said of that kernel, the
work the problem's roofline figures give the case, the rows its outputs are written in, and what the
kernel is made of from its SASS. Each family is named in units every operator shares, so that a card
measured on several operators can be told where it pays where their parameters mean different things.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from klineage import devices, expr
from klineage.devices import DeviceSpec
from klineage.errors import DocumentError, ExpressionError
from klineage.kernel import KernelState
from klineage.launch import numeric
from klineage.problem import DTYPE_BYTES, OutputSpec
from klineage.skills.predicates import case_facts as param_facts


def case_facts(params: Mapping[str, Any], launch: Mapping[str, Any] | None = None,
               compiled: Mapping[str, Any] | None = None,
               roofline: Mapping[str, float] | None = None,
               layout: Mapping[str, Any] | None = None,
               kernel: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The names a timing predicate may use for one case: parameters, launch, compiled, work, layout and
    kernel facts."""
    return {**param_facts(params), **(launch or {}), **(compiled or {}), **work_facts(roofline, launch or {}),
            **(layout or {}), **(kernel or {})}


# Kernel facts: SASS feature counts summed into what a kernel engineer reads a kernel by, in names that
# mean the same in every operator. Static counts (an instruction in a loop counts once).
_KERNEL_COUNTS = {
    "shared_accesses": ("lds", "sts", "ldsm", "stsm"),
    "barriers": ("bar_sync",),
    "shuffles": ("shfl",),
    "tensor_ops": ("hmma", "hgmma", "imma"),
    "async_copies": ("ldgsts", "utmaldg"),
    "special_functions": ("mufu",),
    "local_accesses": ("ldl", "stl"),
    "atomics": ("atom", "red", "atoms"),
    "global_loads": ("ldg_32", "ldg_64", "ldg_128"),
}


KERNEL_FACTS = frozenset({*_KERNEL_COUNTS, "vector_load_share", "readonly_load_share"})


def kernel_facts(features: Mapping[str, Any]) -> dict[str, Any]:
    """What the kernel a forward step starts from is made of, from its SASS feature counts (a state's
    `features`): the counts of `_KERNEL_COUNTS`, and of its global loads the share that are 8 or 16
    bytes wide (`vector_load_share`) and the share on the read-only path (`readonly_load_share`). These
    tell kernels of one operator apart where no case fact can (a tiled and a plain kernel of one
    convolution time the same cases). {} where the kernel's SASS was not read."""
    sass = features.get("sass") if isinstance(features, Mapping) else None
    if not isinstance(sass, Mapping) or "counts" not in sass:
        return {}
    totals: Counter[str] = Counter()
    for count in sass["counts"]:
        totals[str(count["name"])] += int(count["count"])
    facts: dict[str, Any] = {name: sum(totals[n] for n in names) for name, names in _KERNEL_COUNTS.items()}
    loads = facts["global_loads"]
    if loads:
        facts["vector_load_share"] = round((totals["ldg_64"] + totals["ldg_128"]) / loads, 3)
        facts["readonly_load_share"] = round(totals["ldg_const"] / loads, 3)
    return facts


def layout_facts(outputs: Sequence[OutputSpec], params: Mapping[str, Any]) -> dict[str, Any]:
    """The contiguous rows a case writes, in units every operator shares: `row_bytes`, the shortest
    innermost row of its outputs in bytes, and `row_align`, the largest power of two up to 128 dividing
    every output's row. Whether 16-byte vector accesses line up row after row depends on it (a row of
    4100 bfloat16 values is 8200 bytes: aligned to 8, not 16), and a parameter's name cannot say so
    across operators. {} where an output's shape does not resolve for the case."""
    rows = []
    for output in outputs:
        try:
            dims, dtype = output.resolve(dict(params))
        except (DocumentError, ExpressionError):
            return {}
        rows.append(dims[-1] * DTYPE_BYTES[dtype])
    if not rows or min(rows) <= 0:
        return {}
    return {"row_bytes": min(rows), "row_align": min(math.gcd(r, 128) for r in rows)}


def work_facts(roofline: Mapping[str, float] | None, launch: Mapping[str, Any]) -> dict[str, Any]:
    """What a case asks of the kernel in units every operator shares, from the problem's roofline figures
    for it: `megabytes` (the least traffic the case needs, 1e6 bytes), `intensity` (flops per byte of it)
    and, where the launch is known, `bytes_per_thread` (that traffic over the threads of the largest
    launch: how much work each thread has to hide its latency behind). Parameters name different things in
    different problems (conv2d's N is a batch, GEMM's N a width); these do not, so a card measured on several
    operators can still be told where it pays by size and by work per thread. {} without figures."""
    if not roofline or not roofline.get("bytes"):
        return {}
    moved = float(roofline["bytes"])
    facts = {"megabytes": round(moved / 1e6, 4), "intensity": round(float(roofline.get("flops", 0.0)) / moved, 4)}
    threads = launch.get("blocks", 0) * launch.get("threads", 0)
    if threads:
        facts["bytes_per_thread"] = round(moved / threads, 2)
    return facts


def launch_facts(kernel: KernelState, params: Mapping[str, Any],
                 device: DeviceSpec = devices.DEFAULT) -> dict[str, Any]:
    """What `kernel`'s launch plan makes of a case on `device`: the largest launch's `blocks`, `waves`
    (blocks / SMs: below 1 the grid leaves SMs idle), `threads` a block and `dynamic_shared` bytes;
    {} where the plan does not resolve for the case."""
    env = numeric({**params, **kernel.constants, **device.facts()})
    best: dict[str, Any] = {}
    try:
        for launch in kernel.plan.launches:
            blocks = math.prod(expr.evaluate_int(str(d), env) for d in launch.grid)
            if blocks > best.get("blocks", 0):
                best = {"blocks": blocks, "waves": round(blocks / device.num_sms, 4),
                        "threads": math.prod(expr.evaluate_int(str(d), env) for d in launch.block),
                        "dynamic_shared": expr.evaluate_int(str(launch.shared), env)}
    except (ExpressionError, DocumentError, ZeroDivisionError):
        return {}
    return best


# What each fact a predicate may name means, for whoever reads the precondition (SKILL.md, the card page):
# names like `row_align` are short to keep predicates readable, not because a reader knows them.
_MEANINGS = {
    "blocks": "thread blocks in the kernel's largest launch",
    "waves": "those blocks over the GPU's SMs (below 1, SMs sit idle)",
    "threads": "threads in a block",
    "dynamic_shared": "dynamic shared memory a block, in bytes",
    "registers": "registers a thread, as ptxas reports them",
    "static_shared": "static shared memory a block, in bytes, as ptxas reports it",
    "stack_bytes": "the stack frame a thread, in bytes, as ptxas reports it",
    "spill_bytes": "bytes a thread spills to local memory and loads back, as ptxas reports them",
    "megabytes": "the least memory traffic the case needs, in units of 1e6 bytes",
    "intensity": "flops per byte of that least traffic",
    "bytes_per_thread": "that least traffic over the threads of the largest launch",
    "row_bytes": "bytes in the shortest innermost row the case writes",
    "row_align": "the largest power of two, up to 128, dividing the bytes of every row the case writes",
    "vector_load_share": "the share of the kernel's global loads that are 8 or 16 bytes wide",
    "readonly_load_share": "the share of the kernel's global loads on the read-only path",
    **{name: f"{name.replace('_', ' ')} in the kernel's SASS, counted once per instruction"
       for name in _KERNEL_COUNTS},
}
# Facts measured or derived rather than chosen by the caller: a register count, a grid or a traffic
# figure that happens to be a multiple of 3 says nothing about the kernel, so these get thresholds only.
# Divisibility is searched over the case's own sizes and its row bytes, where alignment lives.
MEASURED_FACTS = frozenset(_MEANINGS) - {"row_bytes"}


def meaning(name: str, operators: Sequence[str] = ()) -> str:
    """What fact `name` is, in words: a derived fact's definition, else a parameter of the operators' cases
    (`dtype_is_float16`: their dtype parameter is float16)."""
    if name in _MEANINGS:
        return _MEANINGS[name]
    where = f"the {', '.join(operators)} cases" if operators else "the problem's cases"
    if "_is_" in name:
        param, value = name.split("_is_", 1)
        return f"true where the {param} parameter of {where} is {value}"
    return f"a parameter of {where}"

