"""The sweep cases a gate that times every case adds to its problem's cases.

A problem's `SWEEP` cases are timed only (klineage.problem). A gate under `TimingScope.EVERY_CASE` times
each judged case and each sweep case that every timed kernel supports. The `SWEEP` table is not part
of the problem's fingerprint, so such a gate's key names each sweep case with a digest of its
parameters (`key_names`): a changed sweep case is a different verdict, an added one leaves the
others' verdicts of other policies as they were.
"""

from __future__ import annotations

from typing import Any

from klineage.fingerprint import sha256_json
from klineage.kernel import KernelState


def supported(info: Any, kernels: list[KernelState | None], device_facts: dict[str, Any]) -> list[str]:
    """The names of `info`'s sweep cases that every kernel given declares it supports."""
    if info is None:
        return []
    present = [k for k in kernels if k is not None]
    return [case.name for case in info.sweep
            if all(k.plan.supports_case(case.params, {**k.constants, **device_facts}) for k in present)]


def key_names(info: Any, names: list[str]) -> list[str]:
    """How each timed sweep case is named in a verdict's key: its name and the digest of its parameters."""
    return [f"sweep:{name}:{sha256_json(dict(info.case(name).params))[:16]}" for name in names]
