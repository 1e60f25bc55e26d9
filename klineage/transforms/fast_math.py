"""fast_math: replace one fast-math intrinsic by the precise function it approximates.

Sites, each keyed `<site>#<n>` within its function (kind "call" or "asm"):
  - `__expf(x)` -> `expf(x)`, and likewise `__exp10f`, `__logf`, `__log2f`, `__log10f`, `__sinf`,
    `__cosf`, `__tanf`, `__powf`, `__sincosf`: the called name is replaced, the arguments are kept.
    Key `__expf#<n>`, <n> counting the function's calls of `__expf` and of `expf` together.
  - `__fdividef(a, b)` -> `((a) / (b))`: an IEEE division, parenthesised so that it binds exactly
    as the call did. Key `__fdividef#<n>`, counting `__fdividef` calls and `((a) / (b))` together.
  - inline asm holding one approximate PTX instruction, `asm("ex2.approx.f32 %0, %1;" : "=f"(y)
    : "f"(x))` (also `.ftz`, and `lg2`, `sin`, `cos`, `tanh`), as a statement of its own ->
    `y = exp2f(x);` (`log2f`, `sinf`, `cosf`, `tanhf`). Key `asm:<mnemonic>#<n>` (`asm volatile:`
    when it was volatile), counting such asm statements and `y = exp2f(x);` statements together.
    Forward writes the asm back in the canonical form shown above; the round trip is byte-exact
    for asm written that way (other spacing comes back canonical).
`exp2f`, `__fmul_rn` and the other correctly rounded or precise functions are not fast math.

Forward also reads the overloaded spellings of those functions on single precision (templates and C++ habits
write them): `exp(x)`, `std::exp(x)` (`log`, `log2`, `log10`, `exp10`, `sin`, `cos`, `tan`, `pow`) whose every
argument reads as float (`_float_values.value_type`: a double, an integer or an unknown argument is no site) are
CUDA's float overloads, `expf(x)` by another name, and become `__expf(x)`. Key `exp#<n>` (kind "call"), <n>
counting the function's float calls of that spelling alone, so the families above keep their numbers; backward of
the `__expf` they become gives `expf`, the name the float overload stands for.

Forward also finds divisions no backward step wrote: a float division `a / b` of a device function, written
any way (kind "division", key the division's text without blanks; every division of the function spelled so, a
vectorized body's lanes and its tail, goes in one step), becomes `__fdividef(a, b)`. It qualifies where both
operands read as single precision or integer, at least one float (`_float_values.value_type`: declarations,
parameters, literals, casts, the math library's float functions; a double or an unknown operand is no site), the
divisor is no constant (reciprocal_constant folds those), it is not the canonical `((a) / (b))` (a site of its
own, above), the quotient is read as a floating value up to where it is stored (`_float_values.stays_floating`:
never truncated or compared, where 2 ulp could be a whole step), and it runs per element (in a loop, or reading
nothing a loop assigns: a row's mean after its loop is made once a row, not worth a gate evaluation). Backward of
the call is the canonical parenthesised division, as for any `__fdividef`.

Backward is always correct, since the precise function is at least as accurate everywhere: `expf`
is within 2 ulp over its whole range where `__expf` errs by 2 + 1.16|x| ulp; `logf`/`sinf`/`cosf`
are within 1-2 ulp where the intrinsics' error is absolute and grows outside [-pi, pi] or near 1;
`a / b` is correctly rounded and also right for 2^126 < |b| < 2^128, where `__fdividef` returns 0;
`exp2f`/`log2f`/`tanhf` keep subnormals that `.ftz` flushes. (Under `--use_fast_math` nvcc maps the
precise calls back to the intrinsics: the rewrite then changes nothing in SASS, which is still
correct.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._edit import Scope, splice
from klineage.transforms._float_values import (
    blankless,
    constant,
    device_operations,
    runs_per_element,
    stays_floating,
    value_type,
)
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform

PRECISE = {"__expf": "expf", "__exp10f": "exp10f", "__logf": "logf", "__log2f": "log2f", "__log10f": "log10f",
           "__sinf": "sinf", "__cosf": "cosf", "__tanf": "tanf", "__powf": "powf", "__sincosf": "sincosf"}
FAST = {precise: fast for fast, precise in PRECISE.items()}
# the overloaded (and std::) names whose float overload is a PRECISE function: its fast intrinsic
OVERLOADED = {name.removesuffix("f"): fast for fast, name in PRECISE.items() if fast != "__sincosf"}
ASM_PRECISE = {"ex2": "exp2f", "lg2": "log2f", "sin": "sinf", "cos": "cosf", "tanh": "tanhf"}
_ASM_TEMPLATE = re.compile(r"^\s*(?P<mnemonic>(?P<op>ex2|lg2|sin|cos|tanh)\.approx(?:\.ftz)?\.f32)"
                           r"\s+%0\s*,\s*%1\s*;?\s*$")
_KEY = re.compile(rf"^(?:(?P<asm>asm(?: volatile)?):(?P<mnemonic>[\w.]+)|(?P<name>__\w+|{'|'.join(OVERLOADED)}))"
                  r"#(?P<n>\d+)$")


class _Site:
    def __init__(self, function: str, family: str, node: Node, fast: bool, **parts: str):
        self.function, self.family, self.node, self.fast, self.parts = function, family, node, fast, parts


def _string(parsed: cp.ParsedSource, operand: Node) -> str:
    literal = next((c for c in operand.named_children if c.type in ("string_literal", "concatenated_string")), None)
    return cp.string_value(parsed, literal) if literal is not None else ""


def _operand_expression(parsed: cp.ParsedSource, operand: Node) -> str:
    value = operand.child_by_field_name("value")
    if value is None:
        value = operand.named_children[-1] if operand.named_children else None
    return parsed.text(value) if value is not None else ""


def _asm_site(parsed: cp.ParsedSource, node: Node) -> dict[str, str] | None:
    """The parts of a one-instruction approximate asm statement, or None for any other asm."""
    statement = node.parent
    if statement is None or statement.type != "expression_statement":
        return None
    code = node.child_by_field_name("assembly_code")
    match = _ASM_TEMPLATE.match(cp.string_value(parsed, code)) if code is not None else None
    if match is None:
        return None
    outputs = node.child_by_field_name("output_operands")
    inputs = node.child_by_field_name("input_operands")
    if node.child_by_field_name("clobbers") is not None or outputs is None or inputs is None:
        return None
    outs = [c for c in outputs.named_children if c.type == "gnu_asm_output_operand"]
    ins = [c for c in inputs.named_children if c.type == "gnu_asm_input_operand"]
    if len(outs) != 1 or len(ins) != 1 or _string(parsed, outs[0]) != "=f" or _string(parsed, ins[0]) != "f":
        return None
    volatile = any(parsed.text(c) == "volatile" for c in node.children if c.type in ("gnu_asm_qualifier", "volatile"))
    return {"op": match["op"], "mnemonic": match["mnemonic"], "volatile": "volatile" if volatile else "",
            "out": _operand_expression(parsed, outs[0]), "in": _operand_expression(parsed, ins[0])}


def _float_overload(scope: Scope, call: Node) -> str | None:
    """The overloaded name (`exp`, `std::exp`) a call spells where it reads as the float overload (every argument
    float: `_float_values.value_type`), else None."""
    callee = call.child_by_field_name("function")
    named = callee is not None and callee.type in ("identifier", "qualified_identifier")
    name = scope.parsed.text(callee).removeprefix("std::") if named else ""
    return name if name in OVERLOADED and value_type(scope, call) == "float" else None


def _sites(parsed: cp.ParsedSource) -> list[_Site]:
    found, scope = [], Scope(parsed)
    for node in cp.nodes_of_type(parsed.root, "call_expression", "gnu_asm_expression", "parenthesized_expression",
                                 "expression_statement"):
        function = cp.function_of(node) or "<file>"
        if node.type == "call_expression":
            callee = node.child_by_field_name("function")
            overload = _float_overload(scope, node)
            if overload is not None:
                found.append(_Site(function, overload, node, False))
            if callee is None or callee.type != "identifier":
                continue
            name = parsed.text(callee)
            if name in PRECISE or name in FAST:
                found.append(_Site(function, FAST.get(name, name), node, name in PRECISE))
            elif name == "__fdividef":
                arguments = node.child_by_field_name("arguments").named_children
                if len(arguments) == 2:
                    found.append(_Site(function, name, node, True, a=parsed.text(arguments[0]),
                                       b=parsed.text(arguments[1])))
        elif node.type == "parenthesized_expression":
            division = node.named_children[0] if node.named_child_count == 1 else None
            if division is None or division.type != "binary_expression":
                continue
            left, right = division.child_by_field_name("left"), division.child_by_field_name("right")
            operator = division.child_by_field_name("operator")
            if (parsed.text(operator) == "/" and left.type == right.type == "parenthesized_expression"
                    and left.named_child_count == right.named_child_count == 1):
                found.append(_Site(function, "__fdividef", node, False, a=parsed.text(left.named_children[0]),
                                   b=parsed.text(right.named_children[0])))
        elif node.type == "gnu_asm_expression":
            parts = _asm_site(parsed, node)
            if parts is not None:
                found.append(_Site(function, f"asm:{parts['op']}", node, True, **parts))
        else:  # `y = exp2f(x);`, the precise form of an asm site
            assignment = node.named_children[0] if node.named_child_count == 1 else None
            if assignment is None or assignment.type != "assignment_expression":
                continue
            value = assignment.child_by_field_name("right")
            if parsed.text(assignment.child_by_field_name("operator")) != "=" or value.type != "call_expression":
                continue
            callee = value.child_by_field_name("function")
            arguments = value.child_by_field_name("arguments").named_children
            op = next((op for op, name in ASM_PRECISE.items() if callee.type == "identifier"
                       and parsed.text(callee) == name), None)
            if op is not None and len(arguments) == 1:
                found.append(_Site(function, f"asm:{op}", assignment, False,
                                   out=parsed.text(assignment.child_by_field_name("left")),
                                   **{"in": parsed.text(arguments[0])}))
    return found


def _keyed(parsed: cp.ParsedSource) -> list[tuple[int, _Site]]:
    counts: dict[tuple[str, str], int] = {}
    keyed = []
    for site in _sites(parsed):
        n = counts.get((site.function, site.family), 0)
        counts[(site.function, site.family)] = n + 1
        keyed.append((n, site))
    return keyed


def _canonical_division(node: Node) -> bool:
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    return (node.parent is not None and node.parent.type == "parenthesized_expression"
            and left.type == right.type == "parenthesized_expression")


def _divisions(parsed: cp.ParsedSource) -> list[tuple[str, Node]]:
    """(function, division) of each float division `__fdividef` could compute (the module's doc says which)."""
    scope = Scope(parsed)
    found = []
    for function, node, _ in device_operations(parsed, ("/",)):
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        types = {value_type(scope, left), value_type(scope, right)}
        if (types in ({"float"}, {"float", "int"}) and constant(parsed, right) is None
                and not _canonical_division(node) and runs_per_element(parsed, node) and stays_floating(scope, node)):
            found.append((function.name, node))
    return found


class FastMath(Transform):
    name = "fast_math"
    intent = "Use a fast hardware approximation (__expf, __fdividef, ex2.approx) where its error is acceptable."
    removes = ("fast_math",)

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        anchors = []
        for n, site in _keyed(parsed):
            if not site.fast:
                continue
            if site.family.startswith("asm:"):
                key = f"asm{' volatile' if site.parts['volatile'] else ''}:{site.parts['mnemonic']}#{n}"
                anchors.append(Anchor(site.function, "asm", key, parsed.text(site.node.parent)))
            else:
                anchors.append(Anchor(site.function, "call", f"{site.family}#{n}", parsed.text(site.node)))
        return anchors

    def _site(self, parsed: cp.ParsedSource, anchor: Anchor) -> tuple[_Site, re.Match]:
        match = _KEY.match(anchor.key) if anchor.kind in ("call", "asm") else None
        if match is None:
            raise NotApplicable(f"fast_math needs a call anchor `__expf#<n>` or an asm anchor "
                                f"`asm:ex2.approx.f32#<n>`, not {anchor}")
        if match["asm"]:
            family = "asm:" + match["mnemonic"].split(".")[0]
            if family[4:] not in ASM_PRECISE:
                raise NotApplicable(f"fast_math: {match['mnemonic']} is not an approximate instruction it knows")
        else:
            family = match["name"]
            if family not in PRECISE and family not in OVERLOADED and family != "__fdividef":
                raise NotApplicable(f"fast_math: {family} is not a fast-math intrinsic it knows")
        for n, site in _keyed(parsed):
            if site.function == anchor.function and site.family == family and n == int(match["n"]):
                return site, match
        raise NotApplicable(f"fast_math: no site {anchor.key} in {anchor.function}")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        site, _ = self._site(parsed, anchor)
        if not site.fast:
            raise NotApplicable(f"fast_math: the site at {anchor} is already the precise form")
        node = site.node
        if site.family == "__fdividef":
            text, precise = f"(({site.parts['a']}) / ({site.parts['b']}))", "/"
        elif site.family.startswith("asm:"):
            precise = ASM_PRECISE[site.parts["op"]]
            text = f"{site.parts['out']} = {precise}({site.parts['in']})"
        else:
            node = node.child_by_field_name("function")
            text = precise = PRECISE[site.family]
        data = parsed.data
        source = (data[:node.start_byte] + text.encode() + data[node.end_byte:]).decode("utf-8")
        fast = site.parts.get("mnemonic", site.family)
        return self.rewrite(state, anchor, Direction.BACKWARD, source, carrier={"fast": fast, "precise": precise},
                            note=f"{fast} became the precise {precise}")

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        if anchor.kind == "division":
            return self._approximate_divisions(state, parsed, anchor)
        site, match = self._site(parsed, anchor)
        if site.fast:
            raise NotApplicable(f"fast_math: the site at {anchor} is already fast")
        node = site.node
        if site.family == "__fdividef":
            text = f"__fdividef({site.parts['a']}, {site.parts['b']})"
        elif site.family.startswith("asm:"):
            asm = match["asm"]
            text = f'{asm}("{match["mnemonic"]} %0, %1;" : "=f"({site.parts["out"]}) : "f"({site.parts["in"]}))'
        else:
            node = node.child_by_field_name("function")
            text = OVERLOADED.get(site.family, site.family)
        data = parsed.data
        source = (data[:node.start_byte] + text.encode() + data[node.end_byte:]).decode("utf-8")
        fast = match["mnemonic"] or OVERLOADED.get(site.family, site.family)
        return self.rewrite(state, anchor, Direction.FORWARD, source, carrier={"fast": fast},
                            note=f"{parsed.text(site.node)} became the fast {fast}")

    def _approximate_divisions(self, state: KernelState, parsed: cp.ParsedSource, anchor: Anchor) -> Rewrite:
        chosen = [node for function, node in _divisions(parsed)
                  if function == anchor.function and blankless(parsed, node) == anchor.key]
        if not chosen:
            raise NotApplicable(f"fast_math: {anchor.function} has no float division {anchor.key} to approximate")
        edits = [(node.start_byte, node.end_byte, f"__fdividef({parsed.text(node.child_by_field_name('left'))}, "
                                                  f"{parsed.text(node.child_by_field_name('right'))})")
                 for node in chosen]
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.FORWARD, source, carrier={"fast": "__fdividef"},
                            note=f"{len(edits)} division(s) {anchor.key} became __fdividef")

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        """Precise sites of the families the carrier's "fast" values show (`__expf`, `__fdividef`,
        `ex2.approx.f32` ...: the approximations the evidence found acceptable); with no carrier,
        every call family, and asm sites as their `.approx.f32` instruction."""
        fast = [str(v) for v in self.carrier_values(carrier, "fast")]
        mnemonics = {v.split(".")[0]: v for v in reversed(fast) if v.split(".")[0] in ASM_PRECISE}
        parsed = cp.parse(state.source)
        anchors = []
        for n, site in _keyed(parsed):
            if site.fast:
                continue
            if site.family.startswith("asm:"):
                op = site.parts.get("op") or site.family[4:]
                mnemonic = mnemonics.get(op, "" if fast else f"{op}.approx.f32")
                if mnemonic:
                    anchors.append(Anchor(site.function, "asm", f"asm:{mnemonic}#{n}", parsed.text(site.node)))
            elif not fast or OVERLOADED.get(site.family, site.family) in fast:
                anchors.append(Anchor(site.function, "call", f"{site.family}#{n}", parsed.text(site.node)))
        if not fast or "__fdividef" in fast:
            for function, node in _divisions(parsed):
                anchor = Anchor(function, "division", blankless(parsed, node), parsed.text(node))
                if anchor not in anchors:
                    anchors.append(anchor)
        return anchors


register(FastMath())
