"""Kernel, lineage and job pages."""

from klineage_web.views import pending_section

lineages = pending_section(
    "Lineages",
    "Backward walks from expert kernels: each accepted simplification with its diff, feature "
    "change and paired timings, each rejected one with its evidence, and why the walk ended.",
)
kernels = pending_section(
    "Kernels",
    "Kernel states by fingerprint: CUDA source, launch plan, and every gate verdict on them.",
)
jobs = pending_section(
    "Jobs",
    "Gate runs and walks queued for GPU workers, with their progress and results.",
)
