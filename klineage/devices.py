"""What the gate knows about GPUs before it touches one: limits for static checks, ceilings for rooflines.

A GPU runner reads the real device and reports it; these tables serve machines without a GPU
(compile-only and replay) and the plausibility floor (roofline) of every timing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from klineage.errors import DocumentError


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    arch: str  # "sm_90"
    num_sms: int
    smem_per_block_optin: int  # bytes a block may use after raising its dynamic limit
    smem_per_block_default: int
    max_threads_per_block: int
    l2_bytes: int
    # Ceilings: datasheet leads, corrected by what was measured on the lent H200 (shared/notes).
    dram_bytes_per_s: float
    flops_per_s: dict[str, float]  # by math dtype: "fp32", "tf32", "fp16", "bf16"

    def to_dict(self) -> dict:
        return asdict(self)

    def facts(self) -> dict[str, int]:
        """Names a launch-plan expression may use."""
        return {
            "num_sms": self.num_sms,
            "smem_per_block_optin": self.smem_per_block_optin,
            "max_threads_per_block": self.max_threads_per_block,
            "l2_bytes": self.l2_bytes,
        }


H200 = DeviceSpec(
    name="NVIDIA H200",
    arch="sm_90",
    num_sms=132,
    smem_per_block_optin=232448,
    smem_per_block_default=49152,
    max_threads_per_block=1024,
    l2_bytes=50 * 1024 * 1024,
    dram_bytes_per_s=4.8e12,
    flops_per_s={"fp32": 67e12, "tf32": 494e12, "fp16": 989e12, "bf16": 989e12},
)
H100 = DeviceSpec(
    name="NVIDIA H100 80GB HBM3",
    arch="sm_90",
    num_sms=132,
    smem_per_block_optin=232448,
    smem_per_block_default=49152,
    max_threads_per_block=1024,
    l2_bytes=50 * 1024 * 1024,
    dram_bytes_per_s=3.35e12,
    flops_per_s={"fp32": 67e12, "tf32": 494e12, "fp16": 989e12, "bf16": 989e12},
)
KNOWN = {spec.name: spec for spec in (H200, H100)}
DEFAULT = H200


def lookup(name: str) -> DeviceSpec:
    """The spec of a GPU by its reported name; an unknown GPU is an error, not a guess."""
    if name in KNOWN:
        return KNOWN[name]
    for known, spec in KNOWN.items():
        if name.startswith(known):
            return spec
    raise DocumentError("device", f"unknown GPU '{name}'; known: {', '.join(KNOWN)}")
