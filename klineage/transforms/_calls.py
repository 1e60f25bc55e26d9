"""Calls a forward may move between threads, lanes, iterations or chunks: those with no effect but their value.

A forward that shares a thread's loop among lanes, or packs elements into vectors, evaluates a call in another
thread, another order or more or fewer times than the naive kernel did. That is sound only for a call whose value
depends on its arguments alone and which writes nothing: the math library's functions (`MATH_CALLS`), and a
`__device__` function of the same source whose definition shows it (`pure_functions`):
- every parameter is taken by value, as a plain scalar (no pointer, reference or array);
- its body names no thread coordinate, shared or volatile memory, atomic, barrier, shuffle, `asm`, `printf` or
  allocation, and declares nothing `static`;
- it assigns only to names it declares (its parameters and locals), never through a subscript, a field or a
  pointer, and reads no memory but its own: a subscript only of an array it declares, and no `__device__` or
  `__managed__` variable of the source (a kernel may write those, and the forwards see only the kernel's own
  reads and writes; a `__constant__` table, which no kernel writes, may be read);
- it calls only math functions and functions that pass these same rules (a call cycle never passes: each function
  is admitted only once every function it calls was).
A name defined more than once (overloads, templates' specializations) is pure only where every definition is.
Anything else may have an effect, and the forwards find no site where a kernel calls it.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp

MATH_CALLS = frozenset({
    "expf", "__expf", "exp", "exp2f", "expm1f", "exp10f", "logf", "__logf", "log", "log1pf", "log2f", "log10f",
    "sqrtf", "sqrt", "rsqrtf", "cbrtf", "hypotf", "fabsf", "fabs", "abs", "tanhf", "tanh", "erff", "erf", "erfcf",
    "normcdff", "powf", "pow", "sinf", "cosf", "tanf", "__sinf", "__cosf", "atanf", "atan2f", "fmaxf", "fminf", "fmax",
    "fmin", "max", "min", "fmaf", "fmodf", "__fdividef", "__frcp_rn", "__saturatef", "floorf", "ceilf", "roundf",
    "truncf", "rintf", "nearbyintf", "floor", "ceil", "round", "trunc", "copysignf", "__ldg", "static_cast",
    # conversions and reinterpretations, rounded as named: a value of their argument alone
    "__float2int_rn", "__float2int_rz", "__float2int_rd", "__float2int_ru", "__float2uint_rn", "__float2uint_rz",
    "__int2float_rn", "__uint2float_rn", "__float2ll_rn", "__ll2float_rn", "__double2float_rn", "__float_as_int",
    "__int_as_float", "__float_as_uint", "__uint_as_float",
    # the same functions on doubles, and C++'s float overloads of their names (`fmax(a, b)` on floats)
    "exp2", "exp10", "expm1", "log1p", "log2", "log10", "rsqrt", "cbrt", "rcbrt", "hypot", "erfc", "erfinv", "erfcinv",
    "normcdf", "normcdfinv", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh",
    "atanh", "fma", "fmod", "remainder", "fdim", "rint", "nearbyint", "copysign", "lgamma", "tgamma", "ldexp",
    "__double2int_rn", "__double2int_rz", "__double2ll_rn", "__int2double_rn", "__ll2double_rn",
    "__double_as_longlong", "__longlong_as_double", "__dadd_rn", "__dmul_rn", "__fma_rn", "__drcp_rn", "__ddiv_rn",
    # more of the float math library and its intrinsics
    "sinhf", "coshf", "asinf", "acosf", "asinhf", "acoshf", "atanhf", "erfinvf", "erfcinvf", "normcdfinvf", "rcbrtf",
    "fdimf", "remainderf", "lgammaf", "tgammaf", "ldexpf", "__powf", "__tanf", "__log2f", "__log10f", "__exp10f",
    "__fadd_rn", "__fsub_rn", "__fmul_rn", "__fdiv_rn", "__fsqrt_rn", "__frsqrt_rn", "__fmaf_rn",
    # functional casts (`float(1)`, `scalar_t(0)` of a template's instance): a conversion of the argument alone
    "float", "double", "int", "unsigned", "bool", "long", "short", "char", "size_t", "int32_t", "int64_t", "uint32_t",
    "uint64_t",
    # integer functions of their arguments alone
    "labs", "llabs", "umin", "umax", "llmin", "llmax", "ullmin", "ullmax", "__popc", "__popcll", "__clz", "__clzll",
    "__ffs", "__ffsll", "__brev", "__mulhi", "__umulhi", "__sad", "__usad"})
_EFFECTS = re.compile(r"\b(?:threadIdx|blockIdx|blockDim|gridDim|__shared__|volatile|static|atomic\w*|__sync\w*|"
                      r"__shfl\w*|__ballot\w*|__activemask|asm|printf|malloc|free|new|delete|goto|extern)\b")
_SCALAR_PARAMETER = re.compile(r"^(?:const\s+)?[A-Za-z_][\w:]*(?:\s+[A-Za-z_]\w*)*\s+[A-Za-z_]\w*$")


def pure_functions(parsed: cp.ParsedSource, math: frozenset[str] = MATH_CALLS) -> frozenset[str]:
    """The names of the source's `__device__` functions that have no effect but their value (the module's rules),
    given that the calls in `math` have none."""
    definitions: dict[str, list[cp.Function]] = {}
    for function in cp.functions(parsed):
        definitions.setdefault(function.name, []).append(function)
    shared, constant = _file_variables(parsed, "__device__|__managed__"), _file_variables(parsed, "__constant__")
    candidates = {name: defs for name, defs in definitions.items()
                  if all(_self_contained(parsed, f, shared, constant) for f in defs)}
    pure: set[str] = set()
    grown = True
    while grown:  # admit a function once all it calls are admitted: a fixed point, so cycles never enter
        grown = False
        for name, defs in candidates.items():
            if name not in pure and all(cp.call_name(call) in math or cp.call_name(call) in pure
                                        for f in defs for call in cp.nodes_of_type(f.node, "call_expression")):
                pure.add(name)
                grown = True
    return frozenset(pure)


def first_effect(parsed: cp.ParsedSource, node: Node, math: frozenset[str] = MATH_CALLS,
                 besides: tuple[Node, ...] = ()) -> str | None:
    """The name of the first call under `node` (and outside the nodes `besides`, effects the caller has vetted) that
    may have an effect (neither in `math` nor a pure function of the source), or None when every call is pure."""
    calls = [cp.call_name(call) for call in cp.nodes_of_type(node, "call_expression")
             if not any(other.start_byte <= call.start_byte < other.end_byte for other in besides)]
    unknown = [name for name in calls if name not in math]
    if not unknown:
        return None
    pure = pure_functions(parsed, math)
    return next((name for name in unknown if name not in pure), None)


def _file_variables(parsed: cp.ParsedSource, qualifiers: str) -> set[str]:
    """The names of the source's file-scope variables declared with one of `qualifiers` (a regex alternation)."""
    names = set()
    for declaration in parsed.root.named_children:
        if declaration.type != "declaration" or not re.search(rf"\b(?:{qualifiers})\b", parsed.text(declaration)):
            continue
        for declarator in declaration.children_by_field_name("declarator"):
            if declarator.type == "function_declarator":  # a function's prototype declares no memory
                continue
            while declarator.child_by_field_name("declarator") is not None:
                declarator = declarator.child_by_field_name("declarator")
            names.add(parsed.text(declarator))
    return names


def _self_contained(parsed: cp.ParsedSource, function: cp.Function, shared: set[str], constant: set[str]) -> bool:
    """A `__device__` definition whose parameters are scalars by value, whose body has no effect the module lists,
    which assigns only to the names it declares and reads no memory but its own arrays and `constant` tables
    (`shared`: the source's device variables, which it may not name)."""
    body = function.node.child_by_field_name("body")
    if body is None or function.is_kernel or "__device__" not in function.qualifiers:
        return False
    declarator = function.node.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    if declarator is None:
        return False
    names = set()
    for parameter in declarator.child_by_field_name("parameters").named_children:
        text = " ".join(parsed.text(parameter).split())
        if parameter.type != "parameter_declaration" or not _SCALAR_PARAMETER.match(text):
            return False
        names.add(text.rsplit(" ", 1)[1])
    if _EFFECTS.search(parsed.text(body)):
        return False
    for declaration in cp.nodes_of_type(body, "declaration"):
        for declarator in declaration.children_by_field_name("declarator"):
            while declarator.child_by_field_name("declarator") is not None:
                declarator = declarator.child_by_field_name("declarator")
            names.add(parsed.text(declarator))
    if any(parsed.text(node) in shared for node in cp.nodes_of_type(body, "identifier")):
        return False
    for subscript in cp.nodes_of_type(body, "subscript_expression"):
        if parsed.text(subscript.child_by_field_name("argument")) not in names | constant:
            return False
    for change in cp.nodes_of_type(body, "assignment_expression", "update_expression"):
        target = change.child_by_field_name("left") if change.type == "assignment_expression" else \
            change.child_by_field_name("argument")
        if target is None or target.type != "identifier" or parsed.text(target) not in names:
            return False
    return True
