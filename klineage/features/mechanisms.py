"""Mechanism names: the features a step may remove only by declaring it.

The walk's audit (rule 6) refuses a step that removes an undeclared mechanism; transforms read the same
names to tell a mechanism from plumbing. They live here, beside the feature detectors that name them,
so both can import them without the transforms importing the walk.
"""

from __future__ import annotations

from klineage.lineage import FeatureLevel

# The mechanisms a step may remove only by declaring it. Source names: techniques a transform
# removes as a unit (not `syncthreads`, `global_fn`, `atomic`, `printf`, which are plumbing or
# semantics). SASS names: instruction classes that only a mechanism brings (not scalar loads,
# shared loads/stores, barriers, spills, FFMA/MUFU, which every simplification may shift; not
# `ldg_const` either: the read-only path is the compiler's reading of `__restrict__` and `__ldg`
# together, and it vanishes only when the last of them goes, so those source features are audited
# instead).
MECHANISMS: dict[FeatureLevel, frozenset[str]] = {
    FeatureLevel.SOURCE: frozenset({
        "launch_bounds", "restrict_ptr", "ldg", "unroll_pragma", "fast_math",  # micro-optimizations
        "vector_type_float4", "vector_type_float2", "vector_type_int4", "vector_type_int2",  # vector access
        "vector_type_half2", "vector_type_bf162",
        "shfl",  # warp shuffles
        "cp_async", "cp_async_wait", "tma", "mbarrier",  # async copies and the pipeline that waits on them
        "ldmatrix", "mma_sync", "wmma", "wgmma",  # tensor cores and their fragment loads
        "xor_swizzle", "shared_array", "dynamic_shared",  # shared staging and its layout
        "multistage_pipeline",  # a cp.async ring that keeps copies of later stages in flight
    }),
    FeatureLevel.SASS: frozenset({
        "ldg_128", "ldg_64", "stg_128", "stg_64",  # vector loads and stores
        "ldgsts", "utmaldg", "utmastg", "mbarrier",  # async copies
        "ldsm", "stsm", "hmma", "hgmma", "imma",  # tensor cores
        "shfl",
    }),
}
