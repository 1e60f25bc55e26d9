"""Source features: which CUDA techniques a kernel uses, and in which function.

Everything is read from the parse tree; regexes run only over identifiers the tree names and over
inline-asm strings, where the PTX mnemonic lives. A macro's features are read from its parsed
body and credited to each function that uses the macro.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.features.feature import Feature

FILE_LOCUS = "<file>"
FEATURE_NAMES = (
    "global_fn", "launch_bounds", "restrict_ptr", "ldg", "unroll_pragma", "vector_type_float4", "vector_type_float2",
    "vector_type_int4", "vector_type_int2", "vector_type_half2", "vector_type_bf162", "shared_array", "dynamic_shared",
    "syncthreads", "syncwarp", "cp_async", "cp_async_wait", "ldmatrix", "mma_sync", "wmma", "wgmma", "tma", "mbarrier",
    "shfl", "fast_math", "atomic", "xor_swizzle", "printf",
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
