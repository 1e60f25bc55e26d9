"""sync_copies: replace cp.async global->shared copies by synchronous copies.

Sites (`find`), copies first:
- a copy: inline asm `cp.async.ca/cg.shared.global [dst], [src], N[, src_size]` (with or without
  the src-size zero-fill operand), `__pipeline_memcpy_async(dst, src, N[, zfill])`, or the
  per-thread `cuda::memcpy_async(dst, src, size, barrier_or_pipeline)`. A copy inside a macro is a
  site too, but backward declines it (the copy is spliced at its uses);
- a commit or wait of cp.async groups: a helper that does nothing else (`cp_async_commit`,
  `cp_async_wait<N>`, a macro of one such asm), or a commit/wait statement written inline
  (`asm("cp.async.commit_group;")`, `__pipeline_commit()`, `__pipeline_wait_prior(n)`).
Each step acts at one site, so one function's source changes and the step audit sees the
mechanism leave one locus at a time: the copies go first (LDGSTS goes with the last), then, once
no asynchronous copy is left, the commits and waits, which then guard nothing.

Anchor: a copy or commit/wait that is, declarations aside, the whole body of a helper function is
anchored at the helper: function and key the helper's name, kind "function". Any other site: its
function, kind "asm" or "call", key `cp.async#<n>` (the n-th copy of the function in source order;
copies already made synchronous still count, so the ordinals survive the rewrite) or `group#<n>`
(the n-th inline commit/wait). Macros: function "<file>", kind "macro", key the macro's name.

Backward at a copy replaces the statement by a synchronous copy: one N-byte register load (`__ldcg`
for .cg, `__ldca` for .ca) and one N-byte shared store (`st.shared` through the same 32- or 64-bit
shared address operand). The zero-fill stays: when the src-size operand is provably 0 or N (a
constant, a `c ? N : 0` local, or a parameter every caller passes that way) the load happens only
when it is non-zero and zeros are stored otherwise; any other src-size gets the general form (the
first src-size bytes, zeros after them). A thread's own synchronous stores are complete in program
order, and the barrier that followed every wait still separates the stores from other threads'
reads, so the waits and commits left behind are harmless until their own steps. Backward at a
commit/wait (declined while any asynchronous copy is left) empties the helper's body (its call
sites stay, as no-ops), a macro's expansion, or deletes the inline statement.
Declared per step: a copy removes `cp_async` (source) and `ldgsts` (SASS), a commit/wait removes
`cp_async_wait`; the class declares their union.

Forward puts a site back. The anchor's snippet holds the original definition of the function (or
macro) the backward step changed, so forward applied to the backward result gives it back byte
for byte; a copy is put back only where something still waits for cp.async groups (forward the
commit/wait steps first). Without a snippet (a kernel that never had cp.async), forward turns a
synchronous-copy unit of the form backward writes back into the canonical `cp.async` asm and, if
nothing in the file waits for cp.async groups, commits and waits for it right after it
(`wait_group 0`): correct, and the pipeline that overlaps the copy with compute is a separate
transform (unpipeline's inverse). A commit/wait has no place to go without its snippet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._async_copy import (
    CALL_ROLES,
    COMMIT,
    COPY,
    COPY_ASM,
    WAIT,
    asm_operands,
    asm_roles,
    async_roles,
    c_value,
    call_argument,
    direct_roles,
    parameter_names,
    short_name,
)
from klineage.transforms._edit import Edit, first_line, indentation, line_start, own_lines, splice
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform

_GROUP_LINE = re.compile(r"^\s*cp\.async\.(?:commit_group|wait_all|wait_group\s+(?:\d+|%\d+))\s*;?\s*$")
_CP_ASYNC = re.compile(
    r"^\s*cp\.async\.(?P<cache>ca|cg)\.shared(?:::cta)?\.global(?:\.L2::(?:64B|128B|256B))?\s+"
    r"\[\s*%(?P<dst>\d+)\s*\]\s*,\s*\[\s*%(?P<src>\d+)\s*\]\s*,\s*(?P<size>\d+|%\d+)\s*"
    r"(?:,\s*(?P<bytes>\d+|%\d+)\s*)?;?\s*$")
_CVTA_GLOBAL = ("__cvta_generic_to_global",)
_KEY = re.compile(r"^cp\.async#(\d+)$")

# Per copy size: the register type, its zero, the st.shared form and the registers it stores.
_VECTORS = {
    16: ("uint4", "make_uint4(0u, 0u, 0u, 0u)", "st.shared.v4.u32 [%0], {%1, %2, %3, %4};", (".x", ".y", ".z", ".w")),
    8: ("uint2", "make_uint2(0u, 0u)", "st.shared.v2.u32 [%0], {%1, %2};", (".x", ".y")),
    4: ("unsigned int", "0u", "st.shared.u32 [%0], %1;", ("",)),
}
_TYPES = {v[0]: size for size, v in _VECTORS.items()}
_LOADS = {"cg": "__ldcg", "ca": "__ldca"}


# ---------------------------------------------------------------------------------------------
# Text helpers (shared with unpipeline): whole-line spans, indentation, splicing.
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# cp.async roles: which functions and macros copy, commit and wait (directly or through helpers)
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Constant expressions of the source (template arguments, src-size operands)
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Copy sites
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    statement: Node  # the expression_statement that copies, or a synchronous unit written by backward
    form: str  # "asm", "pipeline" (__pipeline_memcpy_async), "memcpy_async", "sync" (already synchronous)
    function: cp.Function


def _copy_form(parsed: cp.ParsedSource, statement: Node) -> str | None:
    if statement.type != "expression_statement" or not statement.named_children:
        return None
    inner = statement.named_children[0]
    if inner.type == "gnu_asm_expression":
        code = inner.child_by_field_name("assembly_code")
        return "asm" if code is not None and COPY_ASM.search(cp.string_value(parsed, code)) else None
    if inner.type == "call_expression":
        name = cp.call_name(inner)
        if name == "__pipeline_memcpy_async":
            return "pipeline"
        if name == "memcpy_async":
            return "memcpy_async"
    return None


def _function_nodes(parsed: cp.ParsedSource) -> dict[int, cp.Function]:
    return {f.node.id: f for f in cp.functions(parsed)}


def sites(parsed: cp.ParsedSource, include_sync: bool = False) -> list[Site]:
    by_id = _function_nodes(parsed)
    found = []
    for statement in cp.nodes_of_type(parsed.root, "expression_statement", "compound_statement"):
        form = _copy_form(parsed, statement)
        if form is None and include_sync and _sync_unit(parsed, statement) is not None:
            form = "sync"
        definition = cp.enclosing_function(statement)
        if form is None or definition is None:
            continue
        found.append(Site(statement, form, by_id[definition.id]))
    if include_sync:  # the synchronous body of a helper is a unit of its statements, not one node
        for function in by_id.values():
            unit = _helper_sync_unit(parsed, function)
            if unit is not None and not any(s.function.node.id == function.node.id for s in found):
                found.append(Site(unit.first, "sync", function))
    return sorted(found, key=lambda s: s.statement.start_byte)


def _body_statements(function: cp.Function) -> list[Node]:
    body = function.node.child_by_field_name("body")
    return [c for c in body.named_children if c.type != "comment"] if body is not None else []


def is_helper_site(function: cp.Function, statement: Node) -> bool:
    """The copy is, declarations aside, the whole body of a non-kernel function."""
    if function.is_kernel:
        return False
    body = _body_statements(function)
    return statement in body and all(s.type == "declaration" for s in body if s != statement)


def _anchor_for(parsed: cp.ParsedSource, site: Site, all_sites: list[Site]) -> Anchor:
    name = short_name(site.function.name)
    if site.form == "sync" and _helper_sync_unit(parsed, site.function) is not None:
        return Anchor(name, "function", name)
    if site.form != "sync" and is_helper_site(site.function, site.statement):
        return Anchor(name, "function", name)
    same = [s for s in all_sites if s.function.node.id == site.function.node.id]
    n = [s.statement.id for s in same].index(site.statement.id)
    unit = _sync_unit(parsed, site.statement) if site.form == "sync" else None
    kind = "asm" if site.form == "asm" or (unit is not None and unit.form == "asm") else "call"
    return Anchor(name, kind, f"cp.async#{n}")


def _locate(parsed: cp.ParsedSource, anchor: Anchor, want_sync: bool) -> Site:
    """The copy (or, for forward, the synchronous unit) an anchor names."""
    found = sites(parsed, include_sync=True)
    for site in found:
        if (site.form == "sync") != want_sync or short_name(site.function.name) != anchor.function:
            continue
        if _anchor_for(parsed, site, found) == anchor:
            return site
    what = "synchronous copy written by sync_copies" if want_sync else "cp.async copy"
    raise NotApplicable(f"sync_copies: no {what} at {anchor}")


# ---------------------------------------------------------------------------------------------
# The synchronous copy
# ---------------------------------------------------------------------------------------------


@dataclass
class CopySpec:
    size: int  # bytes per copy: 4, 8 or 16
    dst: str  # shared destination: a 32/64-bit shared address (asm) or a generic pointer
    dst_constraint: str  # "r" or "l" for asm; "" for a generic pointer
    src: str  # global source, as a generic pointer expression
    src_bytes: str | None  # bytes actually read (the rest zero-filled); None: all of them
    zero_or_full: bool  # src_bytes is provably 0 or size
    cache: str = "ca"  # "ca" or "cg" (asm); the load intrinsic follows it
    zfill: str | None = None  # __pipeline_memcpy_async: bytes zero-filled at the end


def _strip_cvta(parsed: cp.ParsedSource, node: Node) -> str:
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    if node.type == "call_expression" and cp.call_name(node) in _CVTA_GLOBAL:
        args = node.child_by_field_name("arguments").named_children
        if len(args) == 1:
            return parsed.text(args[0])
    return parsed.text(node)


def _asm_spec(parsed: cp.ParsedSource, statement: Node, constants: dict) -> CopySpec:
    block = statement.named_children[0]
    code = cp.string_value(parsed, block.child_by_field_name("assembly_code"))
    match = _CP_ASYNC.match(code)
    if match is None:
        raise NotApplicable(f"sync_copies: `{code.strip()}` is not a plain cp.async.ca/cg.shared.global "
                            "[dst], [src], size[, src_size] (cache hints and ignore-src are not handled)")
    operands = asm_operands(parsed, block)
    if block.child_by_field_name("output_operands") is not None and any(
            o.type == "gnu_asm_output_operand" for o in block.child_by_field_name("output_operands").named_children):
        raise NotApplicable("sync_copies: a cp.async asm statement with output operands")

    def operand(token: str) -> tuple[str, Node]:
        index = int(token.lstrip("%"))
        if index >= len(operands):
            raise NotApplicable(f"sync_copies: operand %{index} of `{code.strip()}` is missing")
        return operands[index]

    size_token = match["size"]
    size = int(size_token) if not size_token.startswith("%") else c_value(parsed.text(operand(size_token)[1]),
                                                                            constants)
    if size not in _VECTORS:
        raise NotApplicable(f"sync_copies: cp.async copy size {size_token} is not 4, 8 or 16 bytes")
    dst_constraint, dst = operand("%" + match["dst"])
    _, src = operand("%" + match["src"])
    src_bytes, proven = None, True
    if match["bytes"] is not None:
        if match["bytes"].startswith("%"):
            node = operand(match["bytes"])[1]
            src_bytes = parsed.text(node)
            proven = _zero_or_full(parsed, node, size, constants, cp.function_of(statement), 0)
        else:
            src_bytes = match["bytes"]
            proven = int(src_bytes) in (0, size)
    if src_bytes is not None and c_value(src_bytes, constants) == size:
        src_bytes = None
    return CopySpec(size, parsed.text(dst), dst_constraint.strip("=+&"), _strip_cvta(parsed, src), src_bytes, proven,
                    match["cache"])


def _call_spec(parsed: cp.ParsedSource, statement: Node, constants: dict) -> CopySpec:
    call = statement.named_children[0]
    args = [a for a in call.child_by_field_name("arguments").named_children if a.type != "comment"]
    name = cp.call_name(call)
    if name == "memcpy_async":
        if len(args) != 4:
            raise NotApplicable("sync_copies: cuda::memcpy_async with a thread group (or an unknown form): only "
                                "the per-thread (dst, src, size, barrier) form is rewritten")
        return CopySpec(0, parsed.text(args[0]), "", parsed.text(args[1]), parsed.text(args[2]), True)
    if len(args) not in (3, 4):
        raise NotApplicable("sync_copies: __pipeline_memcpy_async needs (dst, src, size[, zfill])")
    size = c_value(parsed.text(args[2]), constants)
    if size not in _VECTORS:
        raise NotApplicable(f"sync_copies: __pipeline_memcpy_async size `{parsed.text(args[2])}` is not 4, 8 or 16")
    zfill = parsed.text(args[3]) if len(args) == 4 and c_value(parsed.text(args[3]), constants) != 0 else None
    proven = zfill is None or _zero_or_full(parsed, args[3], size, constants, cp.function_of(statement), 0)
    return CopySpec(size, parsed.text(args[0]), "", parsed.text(args[1]),
                    None if zfill is None else f"{size} - ({zfill})", proven, "ca", zfill)


def _zero_or_full(parsed: cp.ParsedSource, node: Node, full: int, constants: dict, function: str | None,
                  depth: int) -> bool:
    """Whether an src-size (or zfill) expression can only be 0 or `full`."""
    if depth > 6 or node is None:
        return False
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    value = c_value(parsed.text(node), constants)
    if value is not None:
        return value in (0, full)
    if node.type == "conditional_expression":
        return all(_zero_or_full(parsed, node.child_by_field_name(f), full, constants, function, depth + 1)
                   for f in ("consequence", "alternative"))
    if node.type != "identifier" or function is None:
        return False
    name = parsed.text(node)
    definition = cp.enclosing_function(node)
    local = [d for d in cp.declarations(parsed) if d.name == name and d.function == function
             and definition.start_byte <= d.node.start_byte < definition.end_byte]
    if local:
        if len(local) != 1 or local[0].init is None or _assigned(parsed, definition, name):
            return False
        return _zero_or_full(parsed, local[0].init, full, constants, function, depth + 1)
    functions = [f for f in cp.functions(parsed) if f.node.id == definition.id]
    params = parameter_names(parsed, functions[0]) if functions else []
    if name not in params or _assigned(parsed, definition, name):
        return False
    index, callee = params.index(name), short_name(functions[0].name)
    calls = [c for c in cp.nodes_of_type(parsed.root, "call_expression") if cp.call_name(c) == callee]
    if not calls:
        return False
    for call in calls:
        arg = call_argument(call, "argument", index)
        if arg is None or not _zero_or_full(parsed, arg, full, constants, cp.function_of(call), depth + 1):
            return False
    return True


def _assigned(parsed: cp.ParsedSource, scope: Node, name: str) -> bool:
    for node in cp.nodes_of_type(scope, "assignment_expression", "update_expression"):
        target = node.child_by_field_name("left") or node.child_by_field_name("argument")
        if target is not None and parsed.text(target) == name:
            return True
    return False


def _fresh(parsed: cp.ParsedSource, scope: Node, base: str, taken: set[str]) -> str:
    used = {parsed.text(n) for n in cp.nodes_of_type(scope, "identifier", "field_identifier", "type_identifier")}
    used |= taken
    name, n = base, 1
    while name in used:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def _paren(text: str) -> str:
    return text if re.fullmatch(r"[\w.]+", text.strip()) else f"({text})"


def sync_lines(parsed: cp.ParsedSource, scope: Node, spec: CopySpec, form: str) -> list[str]:
    """The statements of a synchronous copy (without indentation)."""
    if form == "memcpy_async":
        return [f"memcpy({spec.dst}, {spec.src}, {spec.src_bytes});"]
    taken: set[str] = set()
    value = _fresh(parsed, scope, "copied", taken)
    vtype, zero, store, regs = _VECTORS[spec.size]
    if form == "asm":
        load = f"{_LOADS[spec.cache]}(reinterpret_cast<const {vtype}*>({spec.src}))"
        operands = ", ".join([f'"{spec.dst_constraint}"({spec.dst})'] + [f'"r"({value}{r})' for r in regs])
        store_line = f'asm volatile("{store}\\n"\n             :: {operands} : "memory");'
    else:
        load = f"*reinterpret_cast<const {vtype}*>({spec.src})"
        store_line = f"*reinterpret_cast<{vtype}*>({spec.dst}) = {value};"
    if spec.src_bytes is None:
        return [f"const {vtype} {value} = {load};", store_line]
    if spec.zfill is not None and spec.zero_or_full:
        return [f"{vtype} {value} = {zero};  // {_paren(spec.zfill)} == {spec.size}: zeros, nothing is read",
                f"if ({_paren(spec.zfill)} == 0) {value} = {load};", store_line]
    if c_value(spec.src_bytes, {}) == 0:
        return [f"const {vtype} {value} = {zero};  // src-size 0: zeros, nothing is read", store_line]
    if spec.zero_or_full:
        return [f"{vtype} {value} = {zero};  // {_paren(spec.src_bytes)} == 0: zeros, nothing is read",
                f"if ({_paren(spec.src_bytes)} != 0) {value} = {load};", store_line]
    # Any src-size: the first src_bytes bytes, zeros after them (registers only: the loop unrolls).
    bytes_, words, i = (_fresh(parsed, scope, base, taken) for base in ("bytes", "words", "i"))
    count = spec.size // 4
    zeros = ", ".join(["0u"] * count)
    assemble = {16: f"make_uint4({words}[0], {words}[1], {words}[2], {words}[3])",
                8: f"make_uint2({words}[0], {words}[1])", 4: f"{words}[0]"}[spec.size]
    return [f"{vtype} {value} = {zero};",
            f"if ({_paren(spec.src_bytes)} >= {spec.size}) {{",
            f"    {value} = {load};",
            "} else {  // a partial copy: the first src-size bytes, zeros after them",
            f"    const unsigned char* {bytes_} = reinterpret_cast<const unsigned char*>({spec.src});",
            f"    unsigned int {words}[{count}] = {{{zeros}}};",
            "#pragma unroll",
            f"    for (int {i} = 0; {i} < {spec.size}; ++{i})",
            f"        if ({i} < {_paren(spec.src_bytes)}) {words}[{i} / 4] |= "
            f"static_cast<unsigned int>({bytes_}[{i}]) << (8 * ({i} % 4));",
            f"    {value} = {assemble};",
            "}",
            store_line]


def _indent_lines(lines: list[str], indent: str) -> str:
    """Statements (some spanning lines) as source lines at `indent`; `#` lines stay at column 0."""
    split = [line for statement in lines for line in statement.split("\n")]
    return "".join((line if line.startswith("#") else indent + line) + "\n" for line in split)


def _one_line(lines: list[str]) -> str:
    return " ".join(re.sub(r"\n\s*", " ", line) for line in lines)


# ---------------------------------------------------------------------------------------------
# Recognising the synchronous unit backward writes (for forward and for stable ordinals)
# ---------------------------------------------------------------------------------------------


@dataclass
class SyncUnit:
    first: Node
    last: Node
    spec: CopySpec
    form: str  # "asm" or "pipeline"


def _declared_vector(parsed: cp.ParsedSource, statement: Node) -> tuple[str, int, Node | None] | None:
    if statement.type != "declaration":
        return None
    type_node = statement.child_by_field_name("type")
    vtype = parsed.text(type_node) if type_node is not None else ""
    if vtype == "int" and "unsigned" in parsed.text(statement).split("=")[0]:
        vtype = "unsigned int"
    declarators = statement.children_by_field_name("declarator")
    if vtype not in _TYPES or len(declarators) != 1 or declarators[0].type != "init_declarator":
        return None
    name = declarators[0].child_by_field_name("declarator")
    return parsed.text(name), _TYPES[vtype], declarators[0].child_by_field_name("value")


_LOAD_CALL = re.compile(r"^(?P<fn>__ldcg|__ldca)\(reinterpret_cast<const [\w ]+\*>\((?P<src>.*)\)\)$", re.S)
_LOAD_DEREF = re.compile(r"^\*reinterpret_cast<const [\w ]+\*>\((?P<src>.*)\)$", re.S)


def _unit_from(parsed: cp.ParsedSource, statements: list[Node]) -> SyncUnit | None:
    """A synchronous copy as sync_lines writes it: `T v = ...;` [`if (...) v = load;`] then the store."""
    statements = [s for s in statements if s.type != "comment"]
    if len(statements) not in (2, 3):
        return None
    declared = _declared_vector(parsed, statements[0])
    if declared is None:
        return None
    name, size, init = declared
    vtype, zero, store, _ = _VECTORS[size]
    store_statement = statements[-1]
    inner = store_statement.named_children[0] if store_statement.named_children else None
    if inner is None:
        return None
    if inner.type == "gnu_asm_expression":
        code = cp.string_value(parsed, inner.child_by_field_name("assembly_code")).strip()
        operands = asm_operands(parsed, inner)
        if code != store or not operands:
            return None
        form, dst, constraint = "asm", parsed.text(operands[0][1]), operands[0][0]
    elif inner.type == "assignment_expression" and parsed.text(inner.child_by_field_name("right")) == name:
        target = re.match(r"^\*reinterpret_cast<[\w ]+\*>\((.*)\)$", parsed.text(inner.child_by_field_name("left")),
                          re.S)
        if target is None:
            return None
        form, dst, constraint = "pipeline", target.group(1), ""
    else:
        return None
    pattern = _LOAD_CALL if form == "asm" else _LOAD_DEREF
    init_text = parsed.text(init) if init is not None else ""
    if len(statements) == 2:
        load = pattern.match(init_text)
        if load is not None:
            cache = "cg" if load.groupdict().get("fn") == "__ldcg" else "ca"
            return SyncUnit(statements[0], statements[-1], CopySpec(size, dst, constraint, load["src"], None, True,
                                                                    cache), form)
        return None
    guard = statements[1]
    if guard.type != "if_statement" or guard.child_by_field_name("alternative") is not None or init_text != zero:
        return None
    condition = parsed.text(guard.child_by_field_name("condition")).strip()[1:-1].strip()
    body = parsed.text(guard.child_by_field_name("consequence")).strip().rstrip(";")
    assign = re.match(rf"^{re.escape(name)}\s*=\s*(.*)$", body, re.S)
    load = pattern.match(assign.group(1).strip()) if assign else None
    if load is None:
        return None
    cache = "cg" if load.groupdict().get("fn") == "__ldcg" else "ca"
    if condition.endswith("!= 0"):
        spec = CopySpec(size, dst, constraint, load["src"], _unparen(condition[:-4]), True, cache)
    elif condition.endswith("== 0") and form == "pipeline":
        zfill = _unparen(condition[:-4])
        spec = CopySpec(size, dst, constraint, load["src"], f"{size} - ({zfill})", True, cache, zfill)
    else:
        return None
    return SyncUnit(statements[0], statements[-1], spec, form)


def _unparen(text: str) -> str:
    text = text.strip()
    return text[1:-1] if text.startswith("(") and text.endswith(")") else text


def _sync_unit(parsed: cp.ParsedSource, node: Node) -> SyncUnit | None:
    """An inline synchronous copy: a `{ ... }` block holding exactly the unit."""
    if node.type != "compound_statement" or node.parent is None or node.parent.type == "function_definition":
        return None
    return _unit_from(parsed, list(node.named_children))


def _helper_sync_unit(parsed: cp.ParsedSource, function: cp.Function) -> SyncUnit | None:
    """A helper whose body is, declarations aside, a synchronous copy unit."""
    if function.is_kernel:
        return None
    body = _body_statements(function)
    start = next((i for i, s in enumerate(body) if _declared_vector(parsed, s) is not None), None)
    if start is None or any(s.type != "declaration" for s in body[:start]):
        return None
    return _unit_from(parsed, body[start:])


# ---------------------------------------------------------------------------------------------
# cp.async groups (commit / wait): what goes when the last copy does
# ---------------------------------------------------------------------------------------------


def _pure_group(parsed: cp.ParsedSource, statement: Node) -> bool | None:
    """True: a statement that only commits or waits (asm of nothing but commit/wait, or the
    __pipeline intrinsics); False: no group role; None: mixed with other instructions."""
    if statement.type != "expression_statement" or not statement.named_children:
        return False
    inner = statement.named_children[0]
    if inner.type == "gnu_asm_expression":
        code = cp.string_value(parsed, inner.child_by_field_name("assembly_code"))
        if not asm_roles(code) & {COMMIT, WAIT}:
            return False
        lines = [line for part in code.splitlines() for line in part.split(";") if line.strip()]
        return True if all(_GROUP_LINE.match(line) for line in lines) else None
    if inner.type == "call_expression" and CALL_ROLES.get(cp.call_name(inner)) in (COMMIT, WAIT):
        return True
    return False


@dataclass(frozen=True)
class GroupSite:
    """A cp.async commit or wait: a helper (function or macro) that only commits or waits, or such a
    statement written inline in another function."""

    anchor: Anchor
    statements: tuple[Node, ...]  # what goes: every statement of a helper, or the one inline statement
    definition: Node  # the function or macro whose text changes
    macro: cp.Macro | None = None


def group_sites(parsed: cp.ParsedSource) -> list[GroupSite]:
    found = []
    for macro in cp.macros(parsed):
        body = cp.parse_fragment(macro.body)
        statements = [s for s in cp.nodes_of_type(body.root, "expression_statement")
                      if s.parent is not None and s.parent.type == "compound_statement" and s.named_children]
        purity = [_pure_group(body, s) for s in statements]
        if statements and all(p is True for p in purity):
            # The macro's features are credited to the functions that use it: anchor at the one user.
            users = {cp.function_of(call) for call in cp.nodes_of_type(parsed.root, "call_expression")
                     if cp.call_name(call) == macro.name}
            user = short_name(users.pop()) if len(users) == 1 and None not in users else "<file>"
            found.append(GroupSite(Anchor(user, "macro", macro.name, parsed.text(macro.node).strip()), (),
                                   macro.node, macro))
    for function in cp.functions(parsed):
        name = short_name(function.name)
        body = _body_statements(function)
        pure = [s for s in cp.nodes_of_type(function.node, "expression_statement") if _pure_group(parsed, s)]
        if not pure:
            continue
        if not function.is_kernel and all(s.id in {p.id for p in pure} for s in body):
            found.append(GroupSite(Anchor(name, "function", name, parsed.text(function.node)), tuple(pure),
                                   function.node))
            continue
        for n, statement in enumerate(pure):
            kind = "asm" if statement.named_children[0].type == "gnu_asm_expression" else "call"
            found.append(GroupSite(Anchor(name, kind, f"group#{n}", parsed.text(statement)), (statement,),
                                   function.node))
    return sorted(found, key=lambda g: g.definition.start_byte)


def _mixed_groups(parsed: cp.ParsedSource) -> list[Node]:
    """asm statements that commit or wait together with other instructions (never rewritten)."""
    return [s for s in cp.nodes_of_type(parsed.root, "expression_statement") if _pure_group(parsed, s) is None]


def _definition_span(parsed: cp.ParsedSource, node: Node) -> tuple[int, int]:
    """A function definition with its `template <...>` line, or a macro definition."""
    if node.parent is not None and node.parent.type == "template_declaration":
        node = node.parent
    return line_start(parsed.data, node.start_byte), node.end_byte


def _definitions(parsed: cp.ParsedSource) -> list[tuple[str, str, int, Node]]:
    """(kind, name, ordinal among same-named definitions, node) of every function and macro."""
    found, counts = [], {}
    items = [("function", short_name(f.name), f.node) for f in cp.functions(parsed)]
    items += [("macro", m.name, m.node) for m in cp.macros(parsed)]
    for kind, name, node in sorted(items, key=lambda item: item[2].start_byte):
        n = counts.get((kind, name), 0)
        counts[(kind, name)] = n + 1
        found.append((kind, name, n, node))
    return found


def _signature(parsed: cp.ParsedSource, node: Node) -> str:
    """A function definition's head (return type, name, parameters), blanks collapsed."""
    body = node.child_by_field_name("body")
    head = parsed.data[node.start_byte:body.start_byte if body is not None else node.end_byte]
    return " ".join(head.decode("utf-8").split())


def _snippet(parsed: cp.ParsedSource, nodes: list[Node]) -> str:
    """The original text of the definitions a rewrite changes, in source order."""
    spans = sorted({_definition_span(parsed, node) for node in nodes})
    return "\n".join(parsed.data[start:end].decode("utf-8").rstrip("\n") + "\n" for start, end in spans)


# ---------------------------------------------------------------------------------------------
# The transform
# ---------------------------------------------------------------------------------------------


class SyncCopies(Transform):
    name = "sync_copies"
    intent = ("Copy global memory into shared memory asynchronously (cp.async, 16 bytes per copy, zero-fill "
              "through src-size), committing copies in groups and waiting for them before the barrier that "
              "publishes the tile.")
    removes = ("cp_async", "cp_async_wait", "ldgsts")
    adds = ("sts",)
    after = ("unpipeline",)
    copy_removes = ("cp_async", "ldgsts")  # one copy site
    group_removes = ("cp_async_wait",)  # one commit/wait site

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        every = sites(parsed, include_sync=True)
        anchors = []
        for site in sites(parsed):
            anchor = _anchor_for(parsed, site, every)
            anchors.append(Anchor(anchor.function, anchor.kind, anchor.key,
                                  _snippet(parsed, [site.function.node])))
        for macro in self._macro_copies(parsed):
            anchors.append(Anchor("<file>", "macro", macro.name, parsed.text(macro.node).strip()))
        for group in group_sites(parsed):
            anchors.append(Anchor(group.anchor.function, group.anchor.kind, group.anchor.key,
                                  _snippet(parsed, [group.definition])))
        return anchors

    def _macro_copies(self, parsed: cp.ParsedSource) -> list[cp.Macro]:
        found = []
        for macro in cp.macros(parsed):
            body = cp.parse_fragment(macro.body)
            if COPY in direct_roles(body, body.root):
                found.append(macro)
        return found

    def _with(self, rewrite: Rewrite, removes: tuple[str, ...], adds: tuple[str, ...]) -> Rewrite:
        """What this one step takes away (a copy, or a commit/wait), in its direction."""
        if rewrite.direction is Direction.FORWARD:
            removes, adds = adds, removes
        return replace(rewrite, removes=removes, adds=adds)

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        if anchor.kind == "macro" and anchor.key in {m.name for m in self._macro_copies(parsed)}:
            raise NotApplicable(f"sync_copies: the cp.async in macro {anchor.key} is spliced where the macro is used; "
                                "rewrite the macro into a helper function first")
        group = next((g for g in group_sites(parsed) if g.anchor == anchor), None)
        if group is not None and not (anchor.kind == "function" and self._copy_at(parsed, anchor) is not None):
            return self._remove_group(state, parsed, group)
        site = _locate(parsed, anchor, want_sync=False)
        constants = state.constants
        spec = (_asm_spec(parsed, site.statement, constants) if site.form == "asm"
                else _call_spec(parsed, site.statement, constants))
        lines = sync_lines(parsed, site.function.node, spec, site.form)
        replacement = self._replacement(parsed, site, lines, anchor.kind == "function")
        source = splice(parsed.data, [replacement])[0].decode("utf-8")
        anchor = Anchor(anchor.function, anchor.kind, anchor.key, _snippet(parsed, [site.function.node]))
        what = {"asm": f"cp.async.{spec.cache} of {spec.size} bytes", "pipeline": "__pipeline_memcpy_async",
                "memcpy_async": "cuda::memcpy_async"}[site.form]
        note = f"{what} in {site.function.name} became a synchronous load and shared store"
        if spec.src_bytes is not None:
            note += " (zero-fill kept)"
        rewrite = self.rewrite(state, anchor, Direction.BACKWARD, source, note=note,
                               carrier={"copy_bytes": spec.size, "cache": spec.cache} if site.form == "asm" else {})
        return self._with(rewrite, self.copy_removes, self.adds)

    def _copy_at(self, parsed: cp.ParsedSource, anchor: Anchor) -> Site | None:
        try:
            return _locate(parsed, anchor, want_sync=False)
        except NotApplicable:
            return None

    def _remove_group(self, state: KernelState, parsed: cp.ParsedSource, group: GroupSite) -> Rewrite:
        copies = [s for s in sites(parsed)] + self._macro_copies(parsed)
        if copies:
            raise NotApplicable(f"sync_copies: {len(copies)} cp.async cop{'y' if len(copies) == 1 else 'ies'} still "
                                f"commit and wait through {group.anchor.key}; make them synchronous first")
        mixed = _mixed_groups(parsed)
        if mixed:
            raise NotApplicable(f"sync_copies: `{first_line(parsed, mixed[0])}` mixes cp.async commit/wait with other "
                                "instructions")
        data = parsed.data
        if group.macro is not None:
            value = group.definition.child_by_field_name("value")
            start = value.start_byte
            while start > 0 and data[start - 1:start] in (b" ", b"\t"):
                start -= 1
            edits = [Edit(start, value.end_byte)]
        else:
            edits = [Edit(*(own_lines(parsed, s) or (s.start_byte, s.end_byte))) for s in group.statements]
        anchor = Anchor(group.anchor.function, group.anchor.kind, group.anchor.key,
                        _snippet(parsed, [group.definition]))
        what = ("the body of " + group.anchor.key if group.anchor.kind in ("function", "macro")
                else f"`{first_line(parsed, group.statements[0])}` in {group.anchor.function}")
        rewrite = self.rewrite(state, anchor, Direction.BACKWARD, splice(data, edits)[0].decode("utf-8"),
                               note=f"no cp.async copies are left: {what} (a cp.async commit/wait) went")
        return self._with(rewrite, self.group_removes, ())

    def _replacement(self, parsed: cp.ParsedSource, site: Site, lines: list[str], helper: bool) -> Edit:
        data = parsed.data
        statement = site.statement
        span = own_lines(parsed, statement)
        indent = indentation(data, statement.start_byte)
        if helper or len(lines) == 1:
            if span is None:
                return Edit(statement.start_byte, statement.end_byte, _one_line(lines))
            return Edit(span[0], span[1], _indent_lines(lines, indent))
        if span is None:
            return Edit(statement.start_byte, statement.end_byte, "{ " + _one_line(lines) + " }")
        block = [indent + "{\n", _indent_lines(lines, indent + "    "), indent + "}\n"]
        return Edit(span[0], span[1], "".join(block))

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        if anchor.snippet.strip():
            restored = self._restore(parsed, anchor)
            if restored is not None:
                source, copies = restored
                rewrite = self.rewrite(state, anchor, Direction.FORWARD, source,
                                       note="restored the definition recorded by backward")
                return self._with(rewrite, self.copy_removes if copies else self.group_removes,
                                  self.adds if copies else ())
        if _KEY.match(anchor.key) is None and anchor.kind != "function":
            raise NotApplicable(f"sync_copies: putting back a cp.async commit or wait at {anchor} needs the "
                                "definition backward recorded in the anchor's snippet")
        site = _locate(parsed, anchor, want_sync=True)
        unit = (_helper_sync_unit(parsed, site.function) if anchor.kind == "function"
                else _sync_unit(parsed, site.statement))
        if unit is None or unit.form != "asm":
            raise NotApplicable(f"sync_copies: no synchronous copy in the form backward writes at {anchor} "
                                "(forward without a recorded snippet rewrites st.shared units only)")
        spec = unit.spec
        operands = [f'"{spec.dst_constraint}"({spec.dst})', f'"l"({spec.src})']
        tail = ""
        if spec.src_bytes is not None:
            operands.append(f'"r"({spec.src_bytes})')
            tail = ", %2"
        lines = [f'asm volatile("cp.async.{spec.cache}.shared.global [%0], [%1], {spec.size}{tail};\\n" :: '
                 f'{", ".join(operands)} : "memory");']
        if not self._waits(parsed):  # nothing else would wait for it: commit and wait right here
            lines += ['asm volatile("cp.async.commit_group;\\n" ::: "memory");',
                      'asm volatile("cp.async.wait_group 0;\\n" ::: "memory");']
        if anchor.kind == "function":
            start = own_lines(parsed, unit.first)
            end = own_lines(parsed, unit.last)
            if start is None or end is None:
                raise NotApplicable(f"sync_copies: the synchronous copy at {anchor} shares lines with other code")
            edit = Edit(start[0], end[1], _indent_lines(lines, indentation(parsed.data, unit.first.start_byte)))
        else:
            span = own_lines(parsed, site.statement)
            indent = indentation(parsed.data, site.statement.start_byte)
            edit = (Edit(span[0], span[1], _indent_lines(lines, indent)) if span is not None
                    else Edit(site.statement.start_byte, site.statement.end_byte, "{ " + _one_line(lines) + " }"))
        rewrite = self.rewrite(state, anchor, Direction.FORWARD, splice(parsed.data, [edit])[0].decode("utf-8"),
                               note="the synchronous copy became a cp.async again")
        return self._with(rewrite, self.copy_removes, self.adds)

    def _waits(self, parsed: cp.ParsedSource) -> bool:
        """Whether any code of the file waits for cp.async groups."""
        roles = async_roles(parsed)
        return WAIT in direct_roles(parsed, parsed.root) or any(
            WAIT in roles.of(parsed, call) for call in cp.nodes_of_type(parsed.root, "call_expression"))

    def _restore(self, parsed: cp.ParsedSource, anchor: Anchor) -> tuple[str, bool] | None:
        """Put back the definition the anchor's snippet recorded: (source, whether it copies), or
        None if the snippet holds no definition."""
        recorded = cp.parse(anchor.snippet)
        wanted = _definitions(recorded)
        if not wanted:
            return None
        current = {(kind, name, n): node for kind, name, n, node in _definitions(parsed)}
        edits, copies = [], False
        for kind, name, n, node in wanted:
            target = current.get((kind, name, n))
            if target is None:
                raise NotApplicable(f"sync_copies: {kind} {name} recorded in the anchor is not in the source")
            if kind == "function" and _signature(recorded, node) != _signature(parsed, target):
                # another kernel's helper of the same name: its callers would pass what this one's do not take
                raise NotApplicable(f"sync_copies: the recorded {name} is declared `{_signature(recorded, node)}`, "
                                    f"this one `{_signature(parsed, target)}`: the recording is another kernel's")
            start, end = _definition_span(parsed, target)
            r_start, r_end = _definition_span(recorded, node)
            text = recorded.data[r_start:r_end].decode("utf-8")
            if parsed.data[start:end].decode("utf-8") == text:
                raise NotApplicable(f"sync_copies: {name} is already as recorded; nothing to put back")
            edits.append(Edit(start, end, text))
            body = cp.parse_fragment(text) if kind == "macro" else recorded
            copies |= bool(sites(recorded)) or (kind == "macro" and COPY in direct_roles(body, node))
        grouped = any(site.form in ("asm", "pipeline") for site in sites(recorded))  # cuda:: copies use barriers
        source = splice(parsed.data, edits)[0].decode("utf-8")
        if grouped and not self._waits(cp.parse(source)):
            raise NotApplicable("sync_copies: the cp.async copy would have nothing waiting for it; put the "
                                "commit/wait helpers back first (forward their steps)")
        return source, copies


register(SyncCopies())
