"""Pieces the corpus kernel tests share: the names a launch plan may bind, and the shared-memory limit."""

from __future__ import annotations

from klineage.devices import H200

SMEM_LIMIT = H200.smem_per_block_optin  # bytes of dynamic shared memory a block may opt into (the gate's check)


def buffer_names(problem) -> set[str]:
    """The problem's inputs (as made for its small case) and outputs: what a launch plan may name."""
    names = set(problem.make_inputs(dict(problem.info.case("small").params), 0, "cpu"))
    return names | {o.name for o in problem.info.outputs}
