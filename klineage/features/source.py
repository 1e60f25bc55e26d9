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
    found |= {(function, "xor_swizzle") for function in _swizzle_helpers(parsed)}
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
    return _phase_xor(parsed, node) or bool(_names(parsed, node) & xor_names)


# A swizzle XORs a row PHASE into a chunk or column: `c ^ (r % 8)`, `c ^ (r & 7)`, `(2 * ks + h) ^
# fa.phase` where `phase` is only ever assigned such a value. XORs without a phase operand are
# algorithms, not layouts: a butterfly partner (`lane ^ offset`, `threadIdx.x ^ 1`), a bitonic
# partner (`i ^ j`). A lane id (`x & 31`, `x % 32`, `x % warpSize`) is not a row phase either: it is
# the index of a shuffle's scratch exchange.
_LANE_MASKS = {"&": {31}, "%": {32}}


def _phase_xor(parsed: cp.ParsedSource, node: Node) -> bool:
    """`node` contains a `^` one of whose operands is a row phase."""
    context = _phase_context(parsed)
    for xor in cp.captures(node, _XOR).get("xor", []):
        if any(_is_phase(parsed, xor.child_by_field_name(side), context) for side in ("left", "right")):
            return True
    return False


def _phase_context(parsed: cp.ParsedSource) -> tuple[dict, set[str]]:
    """The file's constants and the names (variables, struct fields) only ever assigned a phase."""
    cached = _PHASE_CACHE.get(id(parsed))
    if cached is not None and cached[0] is parsed:
        return cached[1]
    constants = parse_constants(parsed.source)
    values: dict[str, list[Node]] = {}
    for node in cp.nodes_of_type(parsed.root, "init_declarator", "assignment_expression"):
        if node.type == "init_declarator":
            target, value = node.child_by_field_name("declarator"), node.child_by_field_name("value")
        else:
            target, value = node.child_by_field_name("left"), node.child_by_field_name("right")
            if parsed.text(node)[len(parsed.text(target)):].lstrip()[:1] != "=":
                continue  # a compound assignment (`x ^= m`) is not a definition
        name = _target_name(parsed, target)
        if name and value is not None:
            values.setdefault(name, []).append(value)
    context: tuple[dict, set[str]] = (constants, set())
    context[1].update(name for name, found in values.items()
                      if all(_is_phase(parsed, v, context, names=False) for v in found))
    if len(_PHASE_CACHE) > 16:
        _PHASE_CACHE.clear()
    _PHASE_CACHE[id(parsed)] = (parsed, context)
    return context


_PHASE_CACHE: dict[int, tuple[cp.ParsedSource, tuple[dict, set[str]]]] = {}


def _target_name(parsed: cp.ParsedSource, node: Node | None) -> str:
    """The name a declarator or an assignment's left side defines: `x`, `fa.phase` -> `phase`."""
    while node is not None and node.type in ("pointer_declarator", "reference_declarator", "parenthesized_expression"):
        node = node.child_by_field_name("declarator") or (node.named_children[-1] if node.named_children else None)
    if node is None:
        return ""
    if node.type == "field_expression":
        field = node.child_by_field_name("field")
        return parsed.text(field) if field is not None else ""
    return parsed.text(node) if node.type == "identifier" else ""


def _strip(node: Node | None) -> Node | None:
    while node is not None and node.type in ("parenthesized_expression", "cast_expression"):
        node = node.child_by_field_name("value") if node.type == "cast_expression" else \
            (node.named_children[0] if node.named_children else None)
    return node


def _is_phase(parsed: cp.ParsedSource, node: Node | None, context: tuple[dict, set[str]], names: bool = True) -> bool:
    node = _strip(node)
    if node is None:
        return False
    constants, phase_names = context
    if node.type == "binary_expression":
        op = node.child_by_field_name("operator")
        op = parsed.text(op) if op is not None else ""
        right = _strip(node.child_by_field_name("right"))
        if op not in _LANE_MASKS or right is None:
            return False
        text = parsed.text(right)
        if right.type == "number_literal":
            value = _literal(text)
        elif right.type == "identifier" and (text in constants or text.isupper()):
            value = constants.get(text)
        else:
            return False  # `i % j` with j a variable is no fixed phase
        if text == "warpSize" or (isinstance(value, int) and value in _LANE_MASKS[op]):
            return False
        return True
    if names and node.type in ("identifier", "field_expression"):
        return _target_name(parsed, node) in phase_names
    return False


def _literal(text: str) -> int | None:
    try:
        return int(_C_SUFFIX.sub(r"\1", text).rstrip("uUlL"), 0)
    except ValueError:
        return None


# A swizzle helper: a device function that RETURNS a phase XOR (a byte offset or an index) whose
# value reaches shared-memory addressing: followed through the names it is stored in (variables,
# struct fields), the parameters it is passed to and the functions that return it, it ends in an
# operand of an inline asm that addresses shared memory (`ldmatrix`, `cp.async`, `ld/st.shared`), in
# the index of a shared array or pointer, or added to one. The helper itself is credited, so every
# helper of a swizzle family carries the feature.
_SHARED_ASM = re.compile(r"\.shared\b|\bldmatrix\.|\bstmatrix\.|\bcp\.async\.c[ag]\b")
_MENTIONS = "[(identifier) (field_identifier)] @name"


def _mentions(parsed: cp.ParsedSource, node: Node | None) -> set[str]:
    if node is None:
        return set()
    return {parsed.text(n) for n in cp.captures(node, _MENTIONS).get("name", [])}


def _swizzle_helpers(parsed: cp.ParsedSource) -> set[str]:
    definitions = {}
    helpers = set()
    for function in cp.functions(parsed):
        short = function.name.rsplit("::", 1)[-1]
        definitions.setdefault(short, function.node)
        if function.is_kernel:
            continue
        returns = cp.nodes_of_type(function.node, "return_statement")
        if any(_phase_xor(parsed, r) for r in returns):
            helpers.add(function.name)
    if not helpers:
        return set()
    tainted = {h.rsplit("::", 1)[-1] for h in helpers}
    flows = []  # (sources, target name)
    for node in cp.nodes_of_type(parsed.root, "init_declarator", "assignment_expression"):
        target = node.child_by_field_name("declarator" if node.type == "init_declarator" else "left")
        value = node.child_by_field_name("value" if node.type == "init_declarator" else "right")
        name = _target_name(parsed, target)
        if name and value is not None:
            flows.append((_mentions(parsed, value), name))
    for call in cp.nodes_of_type(parsed.root, "call_expression"):
        definition = definitions.get(cp.call_name(call).rsplit("::", 1)[-1])
        arguments = call.child_by_field_name("arguments")
        if definition is None or arguments is None:
            continue
        listed = [a for a in arguments.named_children if a.type != "comment"]
        for argument, param in zip(listed, _parameter_names(definition)):
            flows.append((_mentions(parsed, argument), parsed.text(param)))
    for short, definition in definitions.items():
        for ret in cp.nodes_of_type(definition, "return_statement"):
            flows.append((_mentions(parsed, ret), short))
    changed = True
    while changed:
        changed = False
        for sources, target in flows:
            if target not in tainted and sources & tainted:
                tainted.add(target)
                changed = True
    return helpers if _reaches_shared(parsed, tainted) else set()


def _reaches_shared(parsed: cp.ParsedSource, tainted: set[str]) -> bool:
    for block in cp.asm_blocks(parsed):
        if not _SHARED_ASM.search(block.code):
            continue
        for field in ("input_operands", "output_operands"):
            listing = block.node.child_by_field_name(field)
            if listing is not None and _mentions(parsed, listing) & tainted:
                return True
    shared: set[str] = set()
    for declaration in cp.declarations(parsed):
        init = declaration.init
        if "__shared__" in declaration.specifiers or (
                init is not None and declaration.indirection and _names(parsed, init) & shared):
            shared.add(declaration.name)
    if not shared:
        return False
    for subscript in cp.nodes_of_type(parsed.root, "subscript_expression"):
        if _names(parsed, subscript.child_by_field_name("argument")) & shared and \
                _mentions(parsed, subscript.child_by_field_name("indices")) & tainted:
            return True
    for binary in cp.nodes_of_type(parsed.root, "binary_expression"):
        op = binary.child_by_field_name("operator")
        if op is None or parsed.text(op) != "+":
            continue
        left, right = binary.child_by_field_name("left"), binary.child_by_field_name("right")
        for a, b in ((left, right), (right, left)):
            if _strip(a) is not None and _strip(a).type == "identifier" and parsed.text(_strip(a)) in shared \
                    and _mentions(parsed, b) & tainted:
                return True
    return False


def _names(parsed: cp.ParsedSource, node: Node) -> set[str]:
    return {parsed.text(n) for n in cp.captures(node, _NAMES).get("name", [])}


def _xor_callables(parsed: cp.ParsedSource, macro_bodies: dict[str, list[cp.ParsedSource]]) -> set[str]:
    """Macros whose body, and functions whose return value, computes a `^`."""
    names = {name for name, bodies in macro_bodies.items() if any(_phase_xor(b, b.root) for b in bodies)}
    for function in cp.functions(parsed):
        returns = cp.nodes_of_type(function.node, "return_statement")
        if any(_phase_xor(parsed, r) for r in returns):
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
