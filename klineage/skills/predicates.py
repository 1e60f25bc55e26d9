"""Preconditions from evidence: the simplest predicate over case parameters that separates the
cases where a step was sound from those where it was not.

Input: a table of labelled cases (`Labelled(name, params, ok)`). Output: a `Search` with the
predicate (a `klineage.expr` expression, a sentence and the evidence counts), or none and why.

Case facts (`case_facts`): numeric parameters as they are (bools as 0/1), and for each text
parameter `p` with value `v` a boolean `p_is_v` (`expr` has no string literals), so a dtype test
reads `dtype_is_float16`.

Candidates, simplest first. One atom beats two; among atoms the families go in this order:
1. equality of a text parameter (`dtype_is_float16`): "dtype must be float16";
2. divisibility `p % d == 0` for d in 2, 3, 4, 8, 16, 32, 64, 128: "p must be a multiple of d";
3. power-of-two sizes `is_pow2(p)`: "p must be a power of two";
4. thresholds `p >= v` / `p <= v`, v the tightest value the sound cases show: "p must be at least v".
Within a family the strongest claim the sound cases support wins (the largest divisor every sound
case has, the threshold at the sound cases' extreme): a precondition guards soundness, so it says
no more than the evidence shows to be safe. Parameters go in name order. When no atom separates,
pairs of atoms joined by `and` are tried in the same order. A predicate separates when it holds
on every sound case and fails on every unsound one.
No unsound case: nothing to separate, no precondition. A case labelled both ways, or no predicate
separating the labels: no precondition, and the search says the evidence is inconsistent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from klineage import expr

DIVISORS = (2, 3, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class Labelled:
    name: str
    params: Mapping[str, Any]
    ok: bool  # the step was sound on this case


@dataclass(frozen=True)
class Atom:
    expression: str
    sentence: str
    family: int  # 0 equality, 1 divisibility, 2 power of two, 3 threshold


@dataclass(frozen=True)
class Search:
    expression: str | None
    sentence: str
    holds: tuple[str, ...]  # sound cases (the predicate holds on each)
    fails: tuple[str, ...]  # unsound cases (the predicate fails on each)
    inconsistent: bool = False

    @property
    def found(self) -> bool:
        return self.expression is not None


def case_facts(params: Mapping[str, Any]) -> dict[str, Any]:
    """The names a predicate may use for one case."""
    facts: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, bool):
            facts[key] = int(value)
        elif isinstance(value, (int, float)):
            facts[key] = value
        elif isinstance(value, str):
            facts[f"{key}_is_{_ident(value)}"] = True
    return facts


def _ident(value: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in value)


def _env(params: Mapping[str, Any], text_values: Mapping[str, set[str]]) -> dict[str, Any]:
    env = case_facts(params)
    for key, values in text_values.items():  # every equality name defined on every case
        for value in values:
            env.setdefault(f"{key}_is_{_ident(value)}", False)
    return env


def _text_values(rows: Iterable[Labelled]) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    for row in rows:
        for key, value in row.params.items():
            if isinstance(value, str):
                seen.setdefault(key, set()).add(value)
    return seen


def _is_pow2(n: Any) -> bool:
    return isinstance(n, int) and n > 0 and n & (n - 1) == 0


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fmt(v: Any) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def candidates(good: list[Labelled], bad: list[Labelled]) -> list[Atom]:
    """Every atom the table can state, simplest family first; each holds on every sound case."""
    rows = good + bad
    keys = sorted({k for r in rows for k in r.params})
    atoms: list[Atom] = []
    texts = _text_values(rows)
    for key in keys:  # 1. equality of a text parameter
        values = {r.params.get(key) for r in good}
        if key in texts and len(values) == 1 and isinstance(next(iter(values)), str):
            value = next(iter(values))
            atoms.append(Atom(f"{key}_is_{_ident(value)}", f"{key} must be {value}", 0))
    numeric = [k for k in keys if all(_number(r.params.get(k)) for r in rows)]
    for key in numeric:  # 2. divisibility: the largest divisor every sound case has
        ints = [r.params[key] for r in good]
        if all(isinstance(v, int) for v in ints):
            shared = [d for d in DIVISORS if all(v % d == 0 for v in ints)]
            for d in sorted(shared, reverse=True):
                atoms.append(Atom(f"{key} % {d} == 0", f"{key} must be a multiple of {d}", 1))
    for key in numeric:  # 3. powers of two
        if all(_is_pow2(r.params[key]) for r in good):
            atoms.append(Atom(f"is_pow2({key})", f"{key} must be a power of two", 2))
    for key in numeric:  # 4. thresholds at the sound cases' extremes
        values = [r.params[key] for r in good]
        low, high = min(values), max(values)
        atoms.append(Atom(f"{key} >= {_fmt(low)}", f"{key} must be at least {_fmt(low)}", 3))
        atoms.append(Atom(f"{key} <= {_fmt(high)}", f"{key} must be at most {_fmt(high)}", 3))
    return atoms


def separate(rows: Iterable[Labelled]) -> Search:
    """The simplest predicate true on every sound case and false on every unsound one."""
    rows = list(rows)
    labels: dict[str, set[bool]] = {}
    for row in rows:
        labels.setdefault(row.name, set()).add(row.ok)
    both = sorted(n for n, seen in labels.items() if len(seen) > 1)
    unique: dict[str, Labelled] = {}
    for row in rows:
        unique.setdefault(row.name, row)
    good = [r for r in unique.values() if r.ok and r.name not in both]
    bad = [r for r in unique.values() if not r.ok and r.name not in both]
    good_names = tuple(sorted(r.name for r in good))
    bad_names = tuple(sorted(r.name for r in bad))
    if both:
        return Search(None, f"case(s) {', '.join(both)} were both sound and unsound for this step",
                      good_names, bad_names, inconsistent=True)
    if not bad:
        return Search(None, "no case where the step was unsound: nothing to separate", good_names, ())
    if not good:
        return Search(None, "no case where the step was sound: no predicate can say when it holds", (), bad_names,
                      inconsistent=True)
    texts = _text_values(rows)
    envs = {r.name: _env(r.params, texts) for r in rows}
    atoms = candidates(good, bad)

    def truth(expression: str, row: Labelled) -> bool:
        try:
            return bool(expr.evaluate(expression, envs[row.name]))
        except expr.ExpressionError:
            return False

    cache = {a.expression: ({r.name for r in good if truth(a.expression, r)},
                            {r.name for r in bad if truth(a.expression, r)}) for a in atoms}
    everyone = set(good_names)
    ordered = sorted(atoms, key=lambda a: a.family)  # stable: parameter and strength order kept within families
    for atom in ordered:
        holds, leaks = cache[atom.expression]
        if holds == everyone and not leaks:
            return Search(atom.expression, atom.sentence, good_names, bad_names)
    viable = [a for a in ordered if cache[a.expression][0] == everyone]
    pairs = sorted(combinations(viable, 2), key=lambda p: (p[0].family + p[1].family))
    for first, second in pairs:
        if not cache[first.expression][1] & cache[second.expression][1]:
            return Search(f"{first.expression} and {second.expression}", f"{first.sentence}, and {second.sentence}",
                          good_names, bad_names)
    return Search(None, "no predicate over the case parameters separates the sound cases "
                        f"({', '.join(good_names)}) from the unsound ones ({', '.join(bad_names)})",
                  good_names, bad_names, inconsistent=True)
