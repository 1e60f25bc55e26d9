"""The rule rewriter: the catalog's mechanism transforms, in dependency order, site by site.

At a state, a transform is eligible when every transform named in its `after` has no site left
(names in `after` that the catalog does not hold are ignored: they cannot have sites). Carrier
transforms (tile sizes, vector widths) are never proposed. Eligible transforms come in `PRIORITY`
order; a transform the list does not name comes after the listed substantive mechanisms and before
the micro-optimizations (`MICRO_OPTIMIZATIONS`), by name; each one's sites in `find` order. Pairs already
dealt with at this
state (the history) are skipped. A transform that refuses a site yields its reason; one that
crashes yields the crash as the reason, so one broken transform cannot stop a walk.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from klineage.kernel import KernelState
from klineage.rewriters.base import History, Proposal
from klineage.transforms import catalog
from klineage.transforms.base import Anchor, NotApplicable, Role, Transform

# The one place the walk's preference lives. A step removes one feature at one locus, and a walk has
# a step budget, so the substantive mechanisms come first, in the order a backward walk can take
# them apart: the tensor cores (a warpgroup MMA becomes per-warp mma.sync first, with its fences once
# none is left; then the MMA, then the ldmatrix fragment loads that feed it), the
# software pipeline, then the async copies it overlapped (sync_copies declares `after` unpipeline),
# the shared layout (swizzle, padding), the shared staging itself (unstage_shared, once its tiles are
# plain element stores: it declares `after` the tensor cores, the pipeline and the async copies),
# a row kept in registers across passes (uncache_row: before the vector widths, which rewrite the loads that
# fill the register array into per-element copies it no longer recognizes), vector widths and warp
# shuffles, thread coarsening (uncoarsen: a fixed batch of independent items per thread becomes one),
# the CTA order, and last the micro-optimizations (fast math, reciprocals of constant divisors, read-only
# loads, restrict, unroll pragmas, launch bounds), of which an expert has many sites and which change no
# algorithm. `after` overrides this order where a transform needs it.
PRIORITY: tuple[str, ...] = (
    "warp_mma",
    "scalarize_mma",
    "scalarize_ldmatrix",
    "unpipeline",
    "sync_copies",
    "unswizzle_shared",
    "unpad_shared",
    "unstage_shared",
    "uncache_row",
    "devectorize",
    "shuffle_to_shared",
    "uncoarsen",
    "block_swizzle",
    "fast_math",
    "reciprocal_constant",
    "ldg",
    "restrict",
    "unroll",
    "launch_bounds",
)


# Many sites per expert, no algorithm changed: the tail of every walk.
MICRO_OPTIMIZATIONS: frozenset[str] = frozenset({"fast_math", "reciprocal_constant", "ldg", "restrict", "unroll",
                                                 "launch_bounds"})


def ordered(transforms: Iterable[Transform], priority: Sequence[str] = PRIORITY) -> list[Transform]:
    """Mechanism transforms in walk order: by `priority`; an unlisted one, by name, just before the
    first micro-optimization of `priority` (at the end when it lists none)."""
    rank = {name: float(i) for i, name in enumerate(priority)}
    unlisted = next((i for i, name in enumerate(priority) if name in MICRO_OPTIMIZATIONS), len(priority)) - 0.5
    mechanisms = [t for t in transforms if t.role is not Role.CARRIER]
    return sorted(mechanisms, key=lambda t: (rank.get(t.name, unlisted), t.name))


class RulesRewriter:
    """Proposals from named transforms (the catalog, unless a list is given)."""

    name = "rules"

    def __init__(self, transforms: Iterable[Transform] | None = None, priority: Sequence[str] = PRIORITY):
        pool = list(catalog().values() if transforms is None else transforms)
        self.by_name: dict[str, Transform] = {t.name: t for t in pool}  # carriers included: `after` may name one
        self.transforms: list[Transform] = ordered(pool, priority)

    def propose(self, state: KernelState, history: History | None = None) -> Iterator[Proposal]:
        history = history if history is not None else History()
        sites: dict[str, tuple[list[Anchor], str]] = {}

        def find(transform: Transform) -> tuple[list[Anchor], str]:
            if transform.name not in sites:
                try:
                    sites[transform.name] = (list(transform.find(state)), "")
                except Exception as exc:
                    sites[transform.name] = ([], f"{transform.name}.find failed: {type(exc).__name__}: {exc}")
            return sites[transform.name]

        for transform in self.transforms:
            if self.blocked_by(transform, find):
                continue
            anchors, error = find(transform)
            if error:
                if (transform.name, None) not in history.tried_at(state.fingerprint):
                    yield Proposal(transform.name, None, not_applicable_reason=error)
                continue
            for anchor in anchors:
                if (transform.name, anchor) in history.tried_at(state.fingerprint):  # read now: the walk appends
                    continue
                yield self._backward(transform, state, anchor)

    def blocked_by(self, transform: Transform, find) -> list[str]:
        """The transforms in `transform.after` that still have sites (or whose sites are unknown)."""
        blocking = []
        for name in transform.after:
            other = self.by_name.get(name)
            if other is None:
                continue
            anchors, error = find(other)
            if anchors or error:
                blocking.append(name)
        return blocking

    @staticmethod
    def _backward(transform: Transform, state: KernelState, anchor: Anchor) -> Proposal:
        try:
            return Proposal(transform.name, anchor, transform.backward(state, anchor))
        except NotApplicable as exc:
            return Proposal(transform.name, anchor, not_applicable_reason=str(exc) or "not applicable")
        except Exception as exc:  # a broken transform is evidence against itself, not the end of the walk
            return Proposal(transform.name, anchor,
                            not_applicable_reason=f"{transform.name}.backward failed: {type(exc).__name__}: {exc}")


__all__ = ["MICRO_OPTIMIZATIONS", "PRIORITY", "RulesRewriter", "ordered"]
