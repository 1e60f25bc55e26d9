"""Source features: which CUDA techniques a kernel uses, and in which function.

Everything is read from the parse tree; regexes run only over identifiers the tree names and over
inline-asm strings, where the PTX mnemonic lives. A macro's features are read from its parsed
body and credited to each function that uses the macro.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.features.feature import Feature
from klineage.kernel import parse_constants

FILE_LOCUS = "<file>"
FEATURE_NAMES = (
    "global_fn", "launch_bounds", "restrict_ptr", "ldg", "unroll_pragma", "vector_type_float4", "vector_type_float2",
    "vector_type_int4", "vector_type_int2", "vector_type_half2", "vector_type_bf162", "shared_array", "dynamic_shared",
    "syncthreads", "syncwarp", "cp_async", "cp_async_wait", "ldmatrix", "mma_sync", "wmma", "wgmma", "tma", "mbarrier",
    "shfl", "fast_math", "atomic", "xor_swizzle", "printf", "multistage_pipeline",
)

# Called names (scope and template arguments dropped: `wmma::mma_sync` is `mma_sync`).
_CALLS = tuple((name, re.compile(pattern)) for name, pattern in (
    ("ldg", r"__ldg"),
    ("syncthreads", r"__syncthreads(?:_count|_and|_or)?"),
    ("syncwarp", r"__syncwarp"),
    ("cp_async", r"__pipeline_memcpy_async|memcpy_async"),
    ("cp_async_wait", r"__pipeline_commit|__pipeline_wait_prior"),
    ("mma_sync", r"mma_sync"),
    ("mbarrier", r"\w*mbarrier\w*"),
    ("shfl", r"__shfl(?:_up|_down|_xor)?(?:_sync)?"),
    ("fast_math", r"__(?:expf|exp10f|logf|log2f|log10f|fdividef|sinf|cosf|tanf|sincosf|powf)"),
    ("atomic", r"atomic[A-Z]\w*"),
    ("printf", r"printf"),
))

# PTX mnemonics inside inline asm.
_ASM = tuple((name, re.compile(pattern)) for name, pattern in (
    ("cp_async", r"\bcp\.async\.c[ag]\b"),
    ("cp_async_wait", r"\bcp\.async\.(?:bulk\.)?(?:wait_group|wait_all|commit_group)\b"),
    ("tma", r"\bcp(?:\.reduce)?\.async\.bulk\.(?!wait_group|commit_group)"),
    ("ldmatrix", r"\bldmatrix\."),
    ("mma_sync", r"\bmma\.sync\."),
    ("wmma", r"\bwmma\."),
    ("wgmma", r"\bwgmma\."),
    ("mbarrier", r"\bmbarrier\."),
    ("shfl", r"\bshfl\.sync\."),
    ("fast_math", r"\b(?:ex2|lg2|sin|cos|tanh)\.approx\."),
    ("atomic", r"\b(?:atom|red)\."),
    ("syncthreads", r"\b(?:bar|barrier)(?:\.cta)?\.sync\b"),
    ("syncwarp", r"\bbar\.warp\.sync\b"),
    ("ldg", r"\bld\.global\.nc\b"),
))

_VECTOR_TYPES = {
    "float4": "vector_type_float4", "float2": "vector_type_float2",
    "int4": "vector_type_int4", "uint4": "vector_type_int4",
    "int2": "vector_type_int2", "uint2": "vector_type_int2",
    "half2": "vector_type_half2", "__half2": "vector_type_half2",
    "__nv_bfloat162": "vector_type_bf162", "nv_bfloat162": "vector_type_bf162",
}

_QUERY = """
(function_definition "__global__") @global_fn
(launch_bounds) @launch_bounds
((type_qualifier) @restrict_ptr (#any-of? @restrict_ptr "__restrict__" "__restrict"))
((namespace_identifier) @wmma (#eq? @wmma "wmma"))
(using_declaration (qualified_identifier name: (identifier) @wmma (#eq? @wmma "wmma")))
(call_expression) @_call
(type_identifier) @_type
(preproc_call) @_pragma
"""
_NAMES = "[(identifier) (type_identifier)] @name"
_XOR = '(binary_expression operator: "^") @xor'

Found = set[tuple[str | None, str]]  # (function or None for namespace scope, feature or macro name)


def source_features(source: str) -> tuple[Feature, ...]:
    parsed = cp.parse(source)
    macro_bodies: dict[str, list[cp.ParsedSource]] = {}
    for macro in cp.macros(parsed):
        macro_bodies.setdefault(macro.name, []).append(cp.parse_fragment(macro.body))
    found = _direct(parsed, _xor_callables(parsed, macro_bodies))
    found |= {(function, "multistage_pipeline") for function in _multistage_pipelines(parsed)}
    memo: dict[str, set[str]] = {}
    for function, macro in _macro_uses(parsed, macro_bodies):
        found |= {(function, name) for name in _macro_features(macro, macro_bodies, memo, set())}
    return tuple(sorted({Feature(function or FILE_LOCUS, name) for function, name in found}))


def _direct(parsed: cp.ParsedSource, xor_callables: set[str]) -> Found:
    found: Found = set()
    for capture, nodes in cp.captures(parsed.root, _QUERY).items():
        for node in nodes:
            function = cp.function_of(node)
            if not capture.startswith("_"):
                found.add((function, capture))
            elif capture == "_call":
                called = cp.call_name(node)
                found |= {(function, name) for name, pattern in _CALLS if pattern.fullmatch(called)}
            elif capture == "_type" and parsed.text(node) in _VECTOR_TYPES:
                found.add((function, _VECTOR_TYPES[parsed.text(node)]))
            elif capture == "_pragma" and re.match(r"unroll\b", cp.pragma_text(node)):
                found.add((function, "unroll_pragma"))
    for block in cp.asm_blocks(parsed):
        found |= {(block.function, name) for name, pattern in _ASM if pattern.search(block.code)}
    for declaration in cp.declarations(parsed):
        if "__shared__" in declaration.specifiers:
            if "extern" in declaration.specifiers:
                found.add((declaration.function, "dynamic_shared"))
            elif declaration.dims:
                found.add((declaration.function, "shared_array"))
    found |= {(function, "xor_swizzle") for function in _xor_swizzles(parsed, xor_callables)}
    return found


def _xor_swizzles(parsed: cp.ParsedSource, xor_callables: set[str]) -> set[str | None]:
    """Functions that subscript shared memory with an index built by `^`: directly, through
    local variables initialised from one, or through a macro or helper function that returns one."""
    shared: dict[str | None, set[str]] = {}
    xor_names: dict[str | None, set[str]] = {}
    for declaration in cp.declarations(parsed):
        names = shared.setdefault(declaration.function, set())
        visible = names | shared.get(None, set())
        init = declaration.init
        alias = init is not None and (declaration.indirection or declaration.type == "auto")
        if "__shared__" in declaration.specifiers or (alias and _names(parsed, init) & visible):
            names.add(declaration.name)  # a shared array, or a pointer into one
        local_xor = xor_names.setdefault(declaration.function, set())
        if init is not None and _uses_xor(parsed, init, xor_callables | local_xor):
            local_xor.add(declaration.name)
    found = set()
    for subscript in cp.nodes_of_type(parsed.root, "subscript_expression"):
        function = cp.function_of(subscript)
        visible = shared.get(function, set()) | shared.get(None, set())
        if not _names(parsed, subscript.child_by_field_name("argument")) & visible:
            continue
        indices = subscript.child_by_field_name("indices")
        if _uses_xor(parsed, indices, xor_callables | xor_names.get(function, set())):
            found.add(function)
    return found


def _uses_xor(parsed: cp.ParsedSource, node: Node, xor_names: set[str]) -> bool:
    return bool(cp.captures(node, _XOR)) or bool(_names(parsed, node) & xor_names)


def _names(parsed: cp.ParsedSource, node: Node) -> set[str]:
    return {parsed.text(n) for n in cp.captures(node, _NAMES).get("name", [])}


def _xor_callables(parsed: cp.ParsedSource, macro_bodies: dict[str, list[cp.ParsedSource]]) -> set[str]:
    """Macros whose body, and functions whose return value, computes a `^`."""
    names = {name for name, bodies in macro_bodies.items() if any(cp.captures(b.root, _XOR) for b in bodies)}
    for function in cp.functions(parsed):
        returns = cp.nodes_of_type(function.node, "return_statement")
        if any(cp.captures(r, _XOR) for r in returns):
            names.add(function.name)
    return names


def _macro_uses(parsed: cp.ParsedSource, macro_bodies: dict[str, list[cp.ParsedSource]]) -> Found:
    return {(cp.function_of(node), parsed.text(node)) for node in cp.captures(parsed.root, _NAMES).get("name", [])
            if parsed.text(node) in macro_bodies and not _is_macro_name_itself(node)}


def _is_macro_name_itself(node: Node) -> bool:
    """The name in `#define X`, `#ifdef X` or `defined(X)`: a mention, not a use."""
    return node.parent is not None and node.parent.type in (
        "preproc_def", "preproc_function_def", "preproc_ifdef", "preproc_defined")


def _macro_features(macro: str, bodies: dict[str, list[cp.ParsedSource]], memo: dict[str, set[str]],
                    expanding: set[str]) -> set[str]:
    if macro in memo:
        return memo[macro]
    if macro in expanding:  # a macro that names itself does not expand again
        return set()
    expanding.add(macro)
    names: set[str] = set()
    for body in bodies[macro]:
        names |= {name for _, name in _direct(body, set())}
        for _, inner in _macro_uses(body, bodies):
            names |= _macro_features(inner, bodies, memo, expanding)
    expanding.discard(macro)
    memo[macro] = names
    return names


# A multi-stage cp.async pipeline: a wait that leaves groups in flight (`cp.async.wait_group N`,
# N > 0) or whose count is written over a stage count above one (`wait_group(STAGES - 2)` with
# STAGES = 2 waits for all, yet copies of the next stage are in flight while the current one is
# read). The count may be the asm's immediate, `__pipeline_wait_prior(N)`, or the argument of a
# helper function or macro that passes it to the asm as "n"(param). Credited to the function
# whose code names the count: the caller of such a helper.
_WAIT_COUNT = re.compile(r"\bcp\.async\.wait_group\s+(\d+|%\d+)")
_C_SUFFIX = re.compile(r"(?<![\w.])(0[xX][0-9a-fA-F]+|\d+)(?:[uU][lL]{0,2}|[lL]{1,2}[uU]?)\b")


def _multistage_pipelines(parsed: cp.ParsedSource) -> set[str | None]:
    constants = parse_constants(parsed.source)
    helpers: dict[str, tuple[str, int]] = {}  # wait helper -> ("template" | "argument", index)
    found: set[str | None] = set()
    for block in cp.asm_blocks(parsed):
        count = _asm_count(parsed, block.node)
        if count is None:
            continue
        definition = cp.enclosing_function(block.node)
        helper = _helper_parameter(parsed, definition, count) if definition is not None else None
        if helper is not None:
            helpers[cp.function_name(definition).rsplit("::", 1)[-1]] = helper
        elif _pipelined(count, constants):
            found.add(block.function)
    for macro in cp.macros(parsed):
        body = cp.parse_fragment(macro.body)
        for block in cp.asm_blocks(body):
            count = _asm_count(body, block.node)
            if count is not None and macro.params and count in macro.params:
                helpers[macro.name] = ("argument", macro.params.index(count))
    for call in cp.nodes_of_type(parsed.root, "call_expression"):
        name = cp.call_name(call)
        where = ("argument", 0) if name == "__pipeline_wait_prior" else helpers.get(name)
        argument = _argument(call, *where) if where is not None else None
        if argument is not None and _pipelined(parsed.text(argument), constants):
            found.add(cp.function_of(call))
    return found


def _asm_count(parsed: cp.ParsedSource, block: Node) -> str | None:
    """The text of a wait_group's count: its immediate, or the expression of its "n" operand."""
    code = block.child_by_field_name("assembly_code")
    match = _WAIT_COUNT.search(cp.string_value(parsed, code) if code is not None else "")
    if match is None:
        return None
    if not match.group(1).startswith("%"):
        return match.group(1)
    operands = []
    for field in ("output_operands", "input_operands"):
        listing = block.child_by_field_name(field)
        operands += [o for o in listing.named_children if o.child_by_field_name("value") is not None] \
            if listing is not None else []
    index = int(match.group(1)[1:])
    return parsed.text(operands[index].child_by_field_name("value")).strip() if index < len(operands) else None


def _parameter_names(definition: Node) -> list[Node]:
    declarator = definition.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    params = declarator.child_by_field_name("parameters") if declarator is not None else None
    names = []
    for param in params.named_children if params is not None else []:
        identifiers = cp.nodes_of_type(param, "identifier")
        if identifiers:
            names.append(identifiers[-1])
    return names


def _helper_parameter(parsed: cp.ParsedSource, definition: Node, count: str) -> tuple[str, int] | None:
    template = definition.parent if definition.parent is not None and \
        definition.parent.type == "template_declaration" else None
    if template is not None:
        params = template.child_by_field_name("parameters")
        names = [parsed.text(p).split()[-1] for p in params.named_children if parsed.text(p).split()]
        if count in names:
            return "template", names.index(count)
    names = [parsed.text(n) for n in _parameter_names(definition)]
    return ("argument", names.index(count)) if count in names else None


def _argument(call: Node, kind: str, index: int) -> Node | None:
    holder = call.child_by_field_name("function") if kind == "template" else call
    if holder is None or (kind == "template" and holder.type != "template_function"):
        return None
    arguments = holder.child_by_field_name("arguments")
    listed = [a for a in arguments.named_children if a.type != "comment"] if arguments is not None else []
    return listed[index] if index < len(listed) else None


def _pipelined(count: str, constants: dict) -> bool:
    """A pending count above zero, or one written over a named constant above one."""
    text = re.sub(r"(?<!/)/(?!/)", "//", _C_SUFFIX.sub(r"\1", count))
    try:
        value = expr.evaluate(text, constants)
    except (ExpressionError, RecursionError, TypeError, ValueError, ZeroDivisionError):
        return False
    if isinstance(value, (int, float)) and value > 0:
        return True
    return any(isinstance(constants.get(name), int) and constants[name] > 1
               for name in re.findall(r"[A-Za-z_]\w*", text))
