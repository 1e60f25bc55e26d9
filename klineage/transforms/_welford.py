"""Welford's running mean and sum of squared deviations, and the warp shuffle that joins two lanes' (count, mean,
M2) triples.

The serial form counts the values it has taken and moves the mean toward each one:

    ++n;                         // or n += 1, n++
    float d = v - mean;
    mean += d / n;
    m2 += d * (v - mean);

People often count by the loop index instead, `mean += d / (j + 1)` (or `(float)(j + 1)`) in a loop from 0 by
ones; `counted` writes that as the form above with a counter of the index's type declared before the loop and
stepped first in its body, which holds j + 1 wherever the index did, so the loop computes the same bits. A lane
that takes every 32nd column then counts its own columns.

Split over lanes, each from zero, a lane holds (n, mean, M2) over its columns; two triples join as N = n_a + n_b,
mean = (n_a mean_a + n_b mean_b) / N and M2 = M2_a + M2_b + delta^2 n_a n_b / N (delta = mean_b - mean_a; Chan et
al.'s pairwise update), where N is not zero (two lanes that saw nothing stay at zero). Each of those is symmetric
in the two triples, so both lanes of a shuffle, and so every lane of the row, end with the same triple. The mean
and M2 are then accumulated in another order than the serial loop's, as every lane's partial sum is: the gate
judges the result against the problem's tolerance.

Read where the loop body is local declarations that name none of n, mean, m2 and d and the count's step, the
deviation's declaration last of them, then the mean's update `mean += d / n` (n maybe cast to
the mean's type) and M2's `m2 += d * (v - mean)` (either factor first; or the second deviation named first,
`float d2 = v - mean; m2 += d * d2;`), the names distinct, named nowhere else in
the body, and all three starting at zero (the reduction checks the starts).

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._arg_reduction import tuple_butterfly
from klineage.transforms._edit import Edit, edited, indentation
from klineage.transforms._naive import squash, statements

PAIR_COUNT, PAIR_MEAN, PAIR_M2, PAIR_TOTAL, PAIR_DELTA = "pair_count", "pair_mean", "pair_m2", "pair_total", \
    "pair_delta"
_STEPS = (r"\+\+\s*{n};", r"{n}\s*\+\+;", r"{n}\s*\+=\s*1(?:\.0*f?)?;")  # a count's step
_LOOP = re.compile(r"^for \(((?:const )?[\w ]+?) (\w+) = 0; \2 < [^;]+; (?:\+\+\2|\2\+\+)\)")


@dataclass(frozen=True)
class Welford:
    """The loop keeps `count` values' `mean` and the sum of their squared deviations from it, `m2`."""

    count: str
    mean: str
    m2: str

    def __post_init__(self):
        if len({self.count, self.mean, self.m2}) != 3:
            raise ValueError(f"a Welford triple names three locals, not {self}")


def welford(parsed: cp.ParsedSource, loop_body: Node) -> Welford | None:
    """The loop body's Welford update (see the module's docstring), else None."""
    listed = statements(loop_body)
    after = _second_deviation(parsed, listed)  # `float d2 = v - mean; m2 += d * d2;` (the update's new mean)
    if after is not None:
        listed = [*listed[:-2], listed[-1]]
    steps = [node for node in listed[:-2] if node.type != "declaration"]
    declared = [node for node in listed[:-2] if node.type == "declaration"]
    if len(listed) < 4 or len(steps) != 1 or not declared:
        return None
    (step,), deviation, temporaries, (update, squares) = steps, declared[-1], declared[:-1], listed[-2:]
    found = re.fullmatch(r"(?:const )?(?:float|double) (\w+)\s*=\s*(.+?)\s*-\s*(\w+);", squash(parsed.text(deviation)))
    if deviation.type != "declaration" or found is None:
        return None
    d, value, mean = found.groups()
    mean_update = re.fullmatch(rf"{mean}\s*\+=\s*{d}\s*/\s*(?:\(\s*(?:float|double)\s*\)\s*)?(\w+);",
                               squash(parsed.text(update)))
    m2 = re.match(r"(\w+)\s*\+=", squash(parsed.text(squares)))
    if mean_update is None or m2 is None:
        return None
    count, m2 = mean_update[1], m2[1]
    deviated = rf"\(\s*{re.escape(value)}\s*-\s*{mean}\s*\)"
    if after is not None:  # the second deviation is v less the updated mean, named
        if after[1:] != (value, mean) or after[0] in (count, mean, m2, d):
            return None
        deviated = after[0]
    if not any(re.fullmatch(step_form.format(n=count), squash(parsed.text(step))) for step_form in _STEPS) or \
            not re.fullmatch(rf"{m2}\s*\+=\s*(?:{d}\s*\*\s*{deviated}|{deviated}\s*\*\s*{d});",
                             squash(parsed.text(squares))):
        return None
    names = (count, mean, m2, d)
    if len(set(names)) != 4 or any(t.type != "declaration" for t in temporaries) or \
            any(re.search(rf"\b(?:{'|'.join(names)})\b", text) for text in [value, *map(parsed.text, temporaries)]):
        return None
    return Welford(count, mean, m2)


def _second_deviation(parsed: cp.ParsedSource, listed: list[Node]) -> tuple[str, str, str] | None:
    """(name, value, mean) where the statement before the last declares the deviation from the updated mean,
    `float d2 = v - mean;`; else None."""
    if len(listed) < 5 or listed[-2].type != "declaration":
        return None
    found = re.fullmatch(r"(?:const )?(?:float|double) (\w+)\s*=\s*(.+?)\s*-\s*(\w+);", squash(parsed.text(listed[-2])))
    return found.groups() if found else None


def counted(state: KernelState, only: str | None = None) -> KernelState:
    """`state` with each Welford loop of its kernels (or of the kernel `only`) that counts by its index (`mean += d
    / (j + 1)`) written to count with a local of the index's type (see the module's docstring); the same state where
    none does."""
    def counters(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> list[Edit]:
        taken = {parsed.text(node) for node in cp.nodes_of_type(function.node, "identifier")}
        return [found for loop in cp.nodes_of_type(body, "for_statement") for found in _counted(parsed, loop, taken)]

    return edited(state, counters, only)


def _counted(parsed: cp.ParsedSource, loop: Node, taken: set[str]) -> list[Edit]:
    """The edits that count a loop's Welford update by a local; none where the loop is no such update."""
    header = _LOOP.match(squash(parsed.data[loop.start_byte:loop.child_by_field_name("body").start_byte].decode()))
    listed = statements(loop.child_by_field_name("body"))
    if header is None:
        return []
    kind, index = header.groups()
    by_index = re.compile(rf"(\w+)\s*\+=\s*(\w+)\s*/\s*(?:\(\s*(?:float|double)\s*\)\s*)?\(\s*{index}\s*\+\s*1\s*\);")
    found = [(at, match) for at, node in enumerate(listed) if (match := by_index.fullmatch(squash(parsed.text(node))))]
    if len(found) != 1:
        return []
    (at, match), texts = found[0], [squash(parsed.text(node)) for node in listed]
    mean, d = match.groups()
    name = next(f"{mean}_count{n or ''}" for n in range(len(taken) + 1) if f"{mean}_count{n or ''}" not in taken)
    texts[at] = f"{mean} += {d} / {name};"
    # the counted body must be the form `welford` reads (the index may still say which column is read)
    probe = cp.parse("__global__ void k() { for (;;) { " + " ".join([f"++{name};", *texts]) + " } }")
    (probe_loop,) = cp.nodes_of_type(probe.root, "for_statement")
    if welford(probe, probe_loop.child_by_field_name("body")) is None:
        return []
    taken.add(name)
    indent, inner = indentation(parsed.data, loop.start_byte), indentation(parsed.data, listed[0].start_byte)
    return [Edit(loop.start_byte, loop.start_byte, f"{kind.removeprefix('const ')} {name} = 0;\n{indent}"),
            Edit(listed[0].start_byte, listed[0].start_byte, f"++{name};\n{inner}"),
            Edit(listed[at].start_byte, listed[at].end_byte, texts[at])]


def welford_butterfly(triple: Welford, kinds: dict[str, str], indent: str, header: str, mask: str) -> str:
    """The butterfly (`header`, over the lanes of `mask`) that leaves every lane with its lanes' triples joined."""
    shuffled = {triple.count: kinds[triple.count], triple.mean: kinds[triple.mean], triple.m2: kinds[triple.mean]}
    return tuple_butterfly(shuffled, (PAIR_COUNT, PAIR_MEAN, PAIR_M2),
                           welford_join(triple, kinds, PAIR_COUNT, PAIR_MEAN, PAIR_M2), indent, header, mask)


def welford_join(triple: Welford, kinds: dict[str, str], count: str, mean: str, m2: str) -> list[str]:
    """The statements that join the triple (`count`, `mean`, `m2`) into the accumulators by Chan's update, each
    term symmetric in the two triples."""
    n, value = triple.count, kinds[triple.mean]
    return [f"const {kinds[n]} {PAIR_TOTAL} = {n} + {count};",
            f"const {value} {PAIR_DELTA} = {mean} - {triple.mean};",
            f"if ({PAIR_TOTAL} > 0) {{",
            f"    {triple.m2} = {triple.m2} + {m2} + {PAIR_DELTA} * {PAIR_DELTA} * (({value}){n} * ({value}){count} / "
            f"({value}){PAIR_TOTAL});",
            f"    {triple.mean} = (({value}){n} * {triple.mean} + ({value}){count} * {mean}) / ({value}){PAIR_TOTAL};",
            "}",
            f"{n} = {PAIR_TOTAL};"]


def is_welford_butterfly(parsed: cp.ParsedSource, node: Node, header: str, mask: str) -> bool:
    """Whether `node` (a for statement) is exactly what welford_butterfly writes with this header and mask."""
    listed = statements(node.child_by_field_name("body"))
    if len(listed) != 7 or any(s.type != "declaration" for s in listed[:5]):
        return False
    shuffled = [re.fullmatch(r"const ([\w ]+?) \w+ = __shfl_xor_sync\(.+?, (\w+), offset\);", squash(parsed.text(s)))
                for s in listed[:3]]
    if None in shuffled:
        return False
    (count, n), (value, mean), (_, m2) = (m.groups() for m in shuffled)
    return squash(parsed.text(node)) == squash(
        welford_butterfly(Welford(n, mean, m2), {n: count, mean: value}, "", header, mask))
