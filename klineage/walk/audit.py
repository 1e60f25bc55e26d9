"""The feature audit of one backward step: did it remove exactly the one mechanism it declares?

The gate says a simplified kernel is still correct; the audit says the step is what it claims to
be. It compares the parent's and the child's verdict features (source features per function, SASS
instruction counts per kernel entry) with the rewrite's declaration (`removes`) and with the
transform's own view of its sites (`find`). Every rule must be checked and hold; anything the audit
cannot establish fails it ("unknown fails").

Rules:
1. Every declared name is a known source or SASS feature name; no name is both removed and added.
   A mechanism no feature detector sees (CTA order, padding) may declare nothing: then rules 3 and
   6 are its whole audit.
2. The anchor's function exists in the parent.
3. The transform's own sites: at the anchor's function exactly one fewer in the child, and the
   anchor was one of the parent's sites; at every other function the same number as before.
4. Source features at the anchor's function: every declared source name is present in the parent;
   where the transform finds no site of its own left at that function, it is absent in the child.
   A declared name must not vanish from any OTHER function (one locus per step).
5. SASS: for every declared SASS name, the count over all kernel entries strictly decreases, and
   at no entry does it increase. (Device helpers are inlined, so SASS loci are the entries.)
6. No other mechanism (`MECHANISMS`) disappears, from any function or any entry: one step removes
   exactly one mechanism.

Family scope. Some mechanisms live in several functions at once and cannot be removed from one of
them alone: an XOR swizzle of shared tiles is applied where the tiles are written (a `swizzle_offset`
helper) and where they are read (`a_fragment_offset`, `b_fragment_offset`), and dropping it at one
side only breaks the kernel. A transform declares this with the class attribute `scope = "family"`
(default `"function"`): each of its anchors names one whole family, anchored at one function. For
such a step the locus is the FAMILY: the set of functions whose text differs between parent and
child (read from the parse, never from the rewrite's say-so), which must contain the anchor's
function. Rules 3 and 4 then read "other function" as "function outside the family": the site count
at the anchor's function still drops by exactly one (one family per step), a declared name must be
present at some member of the family in the parent, must be gone from every member where no site
is left at the anchor's function, and must not vanish outside the family. Rule 6 is unchanged: a
family step still removes exactly one mechanism.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from klineage.errors import DocumentError
from klineage.features import cuda_parser as cp
from klineage.features.mechanisms import MECHANISMS
from klineage.features.sass import FEATURES as SASS_FEATURES
from klineage.features.source import FEATURE_NAMES as SOURCE_FEATURES
from klineage.features.source import FILE_LOCUS
from klineage.gate.verdict import Verdict
from klineage.kernel import KernelState
from klineage.lineage import FeatureChange, FeatureLevel
from klineage.transforms.base import Rewrite, Transform


@dataclass(frozen=True)
class Audit:
    ok: bool
    message: str  # what was removed, or every rule that failed
    removed: tuple[FeatureChange, ...]  # present in the parent at a locus, absent in the child
    added: tuple[FeatureChange, ...]  # absent in the parent at a locus, present in the child
    unexpected: tuple[FeatureChange, ...]  # mechanisms removed without being declared
    checks: tuple[str, ...] = ()  # every rule checked, with its numbers (evidence)
    failures: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "message": self.message, "removed": [f.to_dict() for f in self.removed],
                "added": [f.to_dict() for f in self.added], "unexpected": [f.to_dict() for f in self.unexpected],
                "checks": list(self.checks), "failures": list(self.failures)}


class _Features:
    """One verdict's features: source names per function, SASS counts per (entry, name)."""

    def __init__(self, verdict: Verdict, side: str):
        features = verdict.features
        if not isinstance(features, dict) or "source" not in features or "sass" not in features:
            raise DocumentError(f"{side} verdict", "carries no source and SASS features (did it compile?)")
        self.source: dict[str, set[str]] = {}
        for row in features["source"]:
            self.source.setdefault(row["locus"], set()).add(row["name"])
        sass = features["sass"]
        if not isinstance(sass, dict) or not isinstance(sass.get("counts"), list):
            raise DocumentError(f"{side} verdict", "SASS features have no 'counts'")
        self.sass: Counter[tuple[str, str]] = Counter()
        for row in sass["counts"]:
            self.sass[(row["locus"], row["name"])] += int(row["count"])

    def source_pairs(self) -> set[tuple[str, str]]:
        return {(locus, name) for locus, names in self.source.items() for name in names}

    def sass_pairs(self) -> set[tuple[str, str]]:
        return {key for key, count in self.sass.items() if count > 0}

    def sass_total(self, name: str) -> int:
        return sum(n for (_, feature), n in self.sass.items() if feature == name)

    def has(self, locus: str, name: str) -> bool:
        return name in self.source.get(locus, set())


def audit(parent_verdict: Verdict, child_verdict: Verdict, rewrite: Rewrite, transform: Transform | None, *,
          parent: KernelState) -> Audit:
    """Audit the backward step `parent` -> `rewrite.state`. `transform` is the one that made the
    rewrite (None when the proposal named no known transform: that fails)."""
    checks: list[str] = []
    failures: list[str] = []
    child = rewrite.state
    try:
        before, after = _Features(parent_verdict, "parent"), _Features(child_verdict, "child")
    except (DocumentError, KeyError, TypeError, ValueError) as exc:
        return Audit(False, f"unknown: {exc}", (), (), (), (), (f"features unreadable: {exc}",))

    removed, added = _changes(before, after)
    function = rewrite.anchor.function
    family = _family(parent, child, function) if scope_of(transform) == FAMILY else {function}
    others_word = "function(s) outside the family" if len(family) > 1 else "other function(s)"
    if len(family) > 1:
        checks.append(f"{rewrite.transform} acts on a family: {sorted(family)} (functions whose text changed)")
    declared = tuple(dict.fromkeys(rewrite.removes))
    source_names = [n for n in declared if n in SOURCE_FEATURES]
    sass_names = [n for n in declared if n in SASS_FEATURES]

    # 1. the declaration (an empty one claims no feature: the transform's own sites are the evidence)
    if not declared:
        checks.append("declares no feature: audited by the transform's own sites and the mechanism list")
    unknown = [n for n in declared if n not in SOURCE_FEATURES and n not in SASS_FEATURES]
    if unknown:
        failures.append(f"declared feature(s) {unknown} are neither source nor SASS features")
    contradictory = sorted(set(declared) & set(rewrite.adds))
    if contradictory:
        failures.append(f"feature(s) {contradictory} are declared both removed and added")
    checks.append(f"declared removes {list(declared)}, adds {list(rewrite.adds)}")

    # 2. the anchor's function
    known_functions = {f.name for f in cp.functions(parent.source)} | {FILE_LOCUS}
    if function not in known_functions:
        failures.append(f"the anchor's function '{function}' is not a function of the parent")

    # 3. the transform's own sites
    sites_left_here = None
    if transform is None:
        failures.append(f"unknown transform '{rewrite.transform}': its sites cannot be counted")
    else:
        try:
            sites_before = transform.find(parent)
            sites_after = transform.find(child)
        except Exception as exc:  # a transform that cannot read a state cannot vouch for the step
            failures.append(f"{transform.name}.find failed: {type(exc).__name__}: {exc}")
        else:
            count_before = Counter(a.function for a in sites_before)
            count_after = Counter(a.function for a in sites_after)
            sites_left_here = count_after[function]
            checks.append(f"{transform.name} sites at {function}: {count_before[function]} -> {count_after[function]}")
            if count_before[function] - count_after[function] != 1:
                failures.append(f"{transform.name} finds {count_before[function]} site(s) at {function} before and "
                                f"{count_after[function]} after: a step removes exactly one")
            if rewrite.anchor not in sites_before:
                failures.append(f"the anchor {rewrite.anchor} is not one of {transform.name}'s sites in the parent")
            elsewhere = sorted(f for f in set(count_before) | set(count_after)
                               if f not in family and count_before[f] != count_after[f])
            if elsewhere:
                failures.append(f"{transform.name} sites changed at {others_word} {elsewhere}")

    # 4. declared source features at the anchor's function
    where = function if len(family) == 1 else "the family " + ",".join(sorted(family))
    for name in source_names:
        present = any(before.has(f, name) for f in family)
        still = sorted(f for f in family if after.has(f, name))
        checks.append(f"source {where}:{name}: {'present' if present else 'absent'} before, "
                      f"{'present at ' + ','.join(still) if still else 'absent'} after")
        if not present:
            failures.append(f"declares removing {name} at {where}, but the parent has none there")
        elif sites_left_here == 0 and still:
            failures.append(f"{name} is still at {','.join(still)} though {rewrite.transform} finds no site left "
                            f"at {function}")
        others = sorted(c.locus for c in removed
                        if c.level is FeatureLevel.SOURCE and c.name == name and c.locus not in family)
        if others:
            failures.append(f"{name} also vanished from {others}: one step acts at one locus")

    # 5. declared SASS features, over all entries
    for name in sass_names:
        total_before, total_after = before.sass_total(name), after.sass_total(name)
        checks.append(f"sass {name}: {total_before} -> {total_after} instructions over all entries")
        if total_after >= total_before:
            failures.append(f"declares removing SASS {name}, but its count went {total_before} -> {total_after}")
        grown = sorted(entry for (entry, feature) in set(before.sass) | set(after.sass)
                       if feature == name and after.sass[(entry, feature)] > before.sass[(entry, feature)])
        if grown:
            failures.append(f"SASS {name} grew at {grown}")

    # 6. undeclared mechanisms that disappeared
    unexpected = tuple(c for c in removed if c.name in MECHANISMS[c.level] and c.name not in declared)
    if unexpected:
        failures.append("undeclared mechanism(s) removed: " + ", ".join(str(c) for c in unexpected))
    checks.append(f"{len(removed)} feature(s) removed, {len(added)} added")

    if failures:
        return Audit(False, "; ".join(failures), removed, added, unexpected, tuple(checks), tuple(failures))
    what = ", ".join(declared) or f"one {rewrite.transform} site"
    return Audit(True, f"removed {what} at {function}", removed, added, (), tuple(checks), ())


FUNCTION, FAMILY = "function", "family"


def scope_of(transform: Transform | None) -> str:
    """A transform's declared locus: "function" (the default) or "family" (see the module docstring)."""
    scope = getattr(transform, "scope", FUNCTION)
    return scope if scope in (FUNCTION, FAMILY) else FUNCTION


def _function_texts(state: KernelState) -> dict[str, list[str]]:
    parsed = cp.parse(state.source)
    texts: dict[str, list[str]] = {}
    for f in cp.functions(parsed):
        texts.setdefault(f.name, []).append(parsed.text(f.node))
    return texts


def _family(parent: KernelState, child: KernelState, function: str) -> set[str]:
    """The anchor's function and every function whose text differs between parent and child."""
    old, new = _function_texts(parent), _function_texts(child)
    return {function} | {name for name in set(old) | set(new) if old.get(name) != new.get(name)}


def _changes(before: _Features, after: _Features) -> tuple[tuple[FeatureChange, ...], tuple[FeatureChange, ...]]:
    removed: list[FeatureChange] = []
    added: list[FeatureChange] = []
    for level, old, new in ((FeatureLevel.SOURCE, before.source_pairs(), after.source_pairs()),
                            (FeatureLevel.SASS, before.sass_pairs(), after.sass_pairs())):
        removed += [FeatureChange(level, locus, name) for locus, name in old - new]
        added += [FeatureChange(level, locus, name) for locus, name in new - old]
    return tuple(sorted(removed)), tuple(sorted(added))
