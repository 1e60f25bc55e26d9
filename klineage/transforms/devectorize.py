"""devectorize: one vectorized access of global memory becomes the equivalent scalar accesses.

A vector access is a load or store of a CUDA vector type (`float4`, `uint2`, `__half2`, ...) through a
pointer of that type: a view variable (`const float4* xv = reinterpret_cast<const float4*>(xr)`, then
`xv[j]`, `__ldg(xv + j)`, `*xv`), a pointer parameter of that type, or a cast expression used in place
(`*reinterpret_cast<uint4*>(dst) = v`). Backward turns ONE such access into one scalar access per
component, in component order, of the same bytes:

    v[b] = __ldg(xv + j);            ->   v[b].x = __ldg(xr + 4 * j); v[b].y = __ldg(xr + 4 * j + 1); ...
    *reinterpret_cast<uint4*>(d) = v ->   reinterpret_cast<unsigned int*>(d)[0] = v.x; ...[1] = v.y; ...

Where the view was made by casting a scalar pointer of the component type, the scalar accesses go
through that pointer (`xr[4 * j + 1]`); otherwise through the same address viewed as components
(`reinterpret_cast<const float*>(xv + j)[1]`). A view of a dependent type (`using Vec = typename
VecOf<V>::type`, one of whose specializations is float4) is accessed component by component in a
loop over `sizeof(Vec) / sizeof(float)` components, so every instantiation stays correct. A load in a
larger expression becomes `make_float4(...)` of the scalar loads (or, for a dependent type, a
temporary filled before the statement).

Only global memory is devectorized: the address is traced back (through casts, offsets, locals and the
arguments at every call site of a device function) to a kernel pointer parameter, or the access is an
`__ldg`-style load. Shared-memory vector accesses are not sites.

Anchor: the function, kind "access", key `<view>#<n> {...}` where `<view>` is the vector pointer
variable (or the cast expression's pointer name) and n its ordinal among that view's vector accesses
in the function; the JSON payload records what the forward needs: the vector access text it replaced,
the scalar text it wrote, where that text sits, and the view declaration that carries the alignment
fact (a `float4*` is 16-byte aligned). Forward re-vectorizes only that scalar text, only while the
aligned view it came from is still declared.

This module also holds the small data-flow helpers the shared-memory transforms reuse: which memory
space an address points into, a function's parameters, byte splicing and occurrence counting.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._edit import (
    CASTS,
    LOAD_INTRINSICS,
    MAX_DEPTH,
    Scope,
    call_arguments,
    cast_name,
    contains,
    fresh_name,
    function_feature_names,
    function_ranges,
    functions_named,
    make_key,
    occurrences,
    operator,
    outer_parens,
    params,
    payload,
    splice,
    unparen,
    unwrap,
)
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Role, Transform

# Concrete vector type -> (component type, lanes, bits, make function).
VECTORS: dict[str, tuple[str, int, int, str]] = {
    "float4": ("float", 4, 128, "make_float4"),
    "float2": ("float", 2, 64, "make_float2"),
    "int4": ("int", 4, 128, "make_int4"),
    "uint4": ("unsigned int", 4, 128, "make_uint4"),
    "int2": ("int", 2, 64, "make_int2"),
    "uint2": ("unsigned int", 2, 64, "make_uint2"),
    "half2": ("__half", 2, 32, "make_half2"),
    "__half2": ("__half", 2, 32, "make_half2"),
    "__nv_bfloat162": ("__nv_bfloat16", 2, 32, "make_bfloat162"),
    "nv_bfloat162": ("__nv_bfloat16", 2, 32, "make_bfloat162"),
}
COMPONENTS = ("x", "y", "z", "w")
VECTOR_FEATURES = {"float4": "vector_type_float4", "float2": "vector_type_float2", "int4": "vector_type_int4",
                   "uint4": "vector_type_int4", "int2": "vector_type_int2", "uint2": "vector_type_int2",
                   "half2": "vector_type_half2", "__half2": "vector_type_half2",
                   "__nv_bfloat162": "vector_type_bf162", "nv_bfloat162": "vector_type_bf162"}
_SCALAR_SYNONYMS = {"unsigned": "unsigned int", "uint32_t": "unsigned int", "uint": "unsigned int",
                    "int32_t": "int", "signed": "int", "half": "__half", "nv_bfloat16": "__nv_bfloat16"}
_BODY_PARENTS = frozenset({"if_statement", "else_clause", "for_statement", "for_range_loop", "while_statement",
                           "do_statement"})
_INDENT_UNIT = "    "  # where the function's own indentation cannot be read
_LINE_LIMIT = 100  # a rebuilt vector longer than this gets one scalar load per line


# ------------------------------------------------------------------------------------------------
# Shared helpers: parameters, memory spaces, splicing (also used by unswizzle_shared, unpad_shared)
# ------------------------------------------------------------------------------------------------


def cast_target(parsed: cp.ParsedSource, call: Node) -> tuple[str, str] | None:
    """For `reinterpret_cast<const T*>(x)`: ("T", "const "); None unless a cast to a pointer."""
    if call.type != "call_expression" or cast_name(call) not in CASTS:
        return None
    arguments = call.child_by_field_name("function").child_by_field_name("arguments")
    descriptor = next((c for c in arguments.named_children if c.type == "type_descriptor"), None) if arguments else None
    if descriptor is None:
        return None
    declarator = descriptor.child_by_field_name("declarator")
    if declarator is None or declarator.type != "abstract_pointer_declarator" or declarator.named_child_count:
        return None  # not a single-level pointer
    type_node = descriptor.child_by_field_name("type")
    qualifiers = " ".join(parsed.text(c) for c in descriptor.children if c.type == "type_qualifier")
    return parsed.text(type_node), (qualifiers + " " if qualifiers else "")


def line_indent(data: bytes, offset: int) -> str:
    start = data.rfind(b"\n", 0, offset) + 1
    line = data[start:offset]
    return line[:len(line) - len(line.lstrip(b" \t"))].decode("utf-8")


def identifiers(parsed: cp.ParsedSource, node: Node) -> set[str]:
    return {parsed.text(n) for n in cp.nodes_of_type(node, "identifier", "type_identifier", "field_identifier")}


# ------------------------------------------------------------------------------------------------
# Vector types
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VectorType:
    spelled: str  # as the code names it: "float4", "Vec"
    vector: str  # the concrete vector type; for a dependent type its (widest) vector specialization
    component: str
    lanes: int
    bits: int
    dependent: bool = False

    @property
    def make(self) -> str:
        return VECTORS[self.vector][3]


def _concrete(spelled: str, vector: str) -> VectorType:
    component, lanes, bits, _ = VECTORS[vector]
    return VectorType(spelled, vector, component, lanes, bits)


def scalar_type(parsed: cp.ParsedSource, text: str) -> str:
    text = " ".join(text.replace("const", " ").split())
    for _ in range(MAX_DEPTH):
        alias = _aliases(parsed).get(text)
        if alias is None:
            break
        text = alias
    return _SCALAR_SYNONYMS.get(text, text)


@lru_cache(maxsize=16)  # asked once per vector access of every proposal: one tree-sitter query each
def _aliases(parsed: cp.ParsedSource) -> Mapping[str, str]:
    """`using A = T;` and `typedef T A;` outside structs: name -> aliased type text."""
    found = {}
    for node in cp.nodes_of_type(parsed.root, "alias_declaration", "type_definition"):
        if node.parent is not None and node.parent.type == "field_declaration_list":
            continue
        if node.type == "alias_declaration":
            found[parsed.text(node.child_by_field_name("name"))] = parsed.text(node.child_by_field_name("type"))
        else:
            for declarator in node.children_by_field_name("declarator"):
                found[parsed.text(declarator)] = parsed.text(node.child_by_field_name("type"))
    return MappingProxyType(found)


def _specializations(parsed: cp.ParsedSource, template: str) -> list[str]:
    """The `type` member of every explicit specialization `struct template<...> { using type = T; }`."""
    found = []
    for struct in cp.nodes_of_type(parsed.root, "struct_specifier", "class_specifier"):
        name = struct.child_by_field_name("name")
        body = struct.child_by_field_name("body")
        if name is None or body is None or name.type != "template_type":
            continue
        if parsed.text(name.child_by_field_name("name")) != template:
            continue
        for member in body.named_children:
            if member.type == "alias_declaration" and parsed.text(member.child_by_field_name("name")) == "type":
                found.append(parsed.text(member.child_by_field_name("type")).strip())
            elif member.type == "type_definition" and any(
                    parsed.text(d) == "type" for d in member.children_by_field_name("declarator")):
                found.append(parsed.text(member.child_by_field_name("type")).strip())
    return found


_DEPENDENT = re.compile(r"^(?:typename\s+)?([A-Za-z_]\w*)\s*<.*>\s*::\s*type$", re.DOTALL)


def vector_type(parsed: cp.ParsedSource, spelled: str) -> VectorType | None:
    spelled = " ".join(spelled.replace("const", " ").split())
    text = spelled
    aliases = _aliases(parsed)
    for _ in range(MAX_DEPTH):
        if text in VECTORS:
            return _concrete(spelled, text)
        match = _DEPENDENT.match(text)
        if match:
            variants = [" ".join(t.replace("const", " ").split()) for t in _specializations(parsed, match.group(1))]
            vectors = [t for t in variants if t in VECTORS]
            if not vectors:
                return None
            components = {VECTORS[t][0] for t in vectors}
            scalars = {scalar_type(parsed, t) for t in variants if t not in VECTORS}
            if len(components) != 1 or not scalars <= components:
                return None  # specializations of different element types: no single component view
            widest = max(vectors, key=lambda t: VECTORS[t][2])
            component, lanes, bits, _ = VECTORS[widest]
            return VectorType(spelled, widest, component, lanes, bits, dependent=True)
        if text not in aliases:
            return None
        text = " ".join(aliases[text].split())
    return None


# ------------------------------------------------------------------------------------------------
# Sites
# ------------------------------------------------------------------------------------------------

@dataclass
class Site:
    function: str
    function_node: Node
    view: str  # the vector pointer variable, or the cast expression's pointer name
    direction: str  # "load" or "store"
    vtype: VectorType
    access: Node  # load: the loaded expression; store: the assignment
    deref: Node | None  # store target / loaded lvalue (`xv[j]`, `*p`); None for an intrinsic load
    intrinsic: str  # "__ldg" ... for an intrinsic load, else ""
    pointer: str  # text of the vector pointer: "xv" or the cast expression
    index: str | None  # element index text, None for index 0
    base: str | None  # scalar pointer of the component type the view was cast from (base form)
    cast_operand: str | None  # for a cast expression site: the pointer text inside the cast
    view_decl: str  # the declarator text of the view variable ("" for a cast site)
    space: str | None = None
    ordinal: int = 0
    problem: str = ""  # why it cannot be rewritten ("" when it can)


class _Finder:
    def __init__(self, state: KernelState):
        self.source = state.source
        self.parsed = cp.parse(state.source)
        self.scope = Scope(self.parsed)

    def text(self, node: Node) -> str:
        return self.parsed.text(node)

    def sites(self) -> list[Site]:
        """Every vector access, numbered per (function name, view) in source order, so that the
        overloads of one name (`vec_max(float)`, `vec_max(float4)`) never share an ordinal."""
        found: list[Site] = []
        counts: dict[tuple[str, str], int] = {}
        for function in self.scope.functions:
            body = function.node.child_by_field_name("body")
            if body is None:
                continue
            local: list[Site] = []
            for view in self._views(function.node):
                local += self._view_sites(function, body, *view)
            local += self._cast_sites(function, body)
            local.sort(key=lambda s: s.access.start_byte)
            for site in local:
                site.ordinal = counts.get((function.name, site.view), 0)
                counts[(function.name, site.view)] = site.ordinal + 1
            found += local
        return found

    # -- views: pointer variables and parameters of a vector type -----------------------------------
    def _views(self, function: Node) -> list[tuple[str, VectorType, str, str | None, Node]]:
        """(name, vector type, declarator text, base pointer or None, declaration node)."""
        views = []
        for param in params(self.parsed, function):
            vtype = vector_type(self.parsed, param.type) if param.indirection == "*" else None
            if vtype is not None:
                views.append((param.name, vtype, self.text(param.node), None, param.node))
        for declaration in self.scope.declarations:
            if not contains(function, declaration.node):
                continue
            if not declaration.indirection and len(declaration.dims) == 1:  # `__shared__ float4 s4[128]`
                vtype = vector_type(self.parsed, declaration.type)
                if vtype is not None:
                    views.append((declaration.name, vtype, declaration.name, None, declaration.node))
                continue
            if declaration.indirection != "*":
                continue
            vtype = vector_type(self.parsed, declaration.type)
            init = declaration.init
            if vtype is None and declaration.type == "auto" and init is not None:
                target = cast_target(self.parsed, unparen(init))
                vtype = vector_type(self.parsed, target[0]) if target else None
            if vtype is None:
                continue
            declarator = init.parent if init is not None else None
            text = self.text(declarator) if declarator is not None else declaration.name
            views.append((declaration.name, vtype, text, self._base(function, declaration, vtype), declaration.node))
        return views

    def _base(self, function: Node, declaration: cp.Declaration, vtype: VectorType) -> str | None:
        """The scalar pointer `p` when the view is `reinterpret_cast<T4*>(p)` of a `component*` p and
        neither is ever assigned again in the function: then element k of vector i is p[L * i + k]."""
        if vtype.dependent or declaration.init is None:
            return None
        init = unparen(declaration.init)
        if cast_target(self.parsed, init) is None:
            return None
        operand = unparen(call_arguments(init)[0])
        if operand.type != "identifier":
            return None
        name = self.text(operand)
        source_decl = self.scope.declaration(name, declaration.node)
        found_param = self.scope.param(name, declaration.node)
        if source_decl is not None and source_decl.function is not None:
            pointee, indirection = source_decl.type, source_decl.indirection
        elif found_param is not None:
            pointee, indirection = found_param[2].type, found_param[2].indirection
        else:
            return None
        if indirection != "*" or scalar_type(self.parsed, pointee) != scalar_type(self.parsed, vtype.component):
            return None
        if self._assigned(function, name) or self._assigned(function, declaration.name):
            return None
        return name

    def _assigned(self, function: Node, name: str) -> bool:
        for node in cp.nodes_of_type(function, "assignment_expression", "update_expression"):
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            if target is not None and unparen(target).type == "identifier" and self.text(unparen(target)) == name:
                return True
        return False

    def _view_sites(self, function: cp.Function, body: Node, name: str, vtype: VectorType, decl_text: str,
                    base: str | None, decl_node: Node) -> list[Site]:
        sites = []
        for ref in cp.nodes_of_type(body, "identifier"):
            if self.text(ref) != name or contains(decl_node, ref):
                continue
            site = self._classify(function, ref, vtype, name, pointer=name, base=base, cast_operand=None,
                                  view_decl=decl_text)
            if site is not None:
                sites.append(site)
        return sites

    def _cast_sites(self, function: cp.Function, body: Node) -> list[Site]:
        sites = []
        for call in cp.nodes_of_type(body, "call_expression"):
            target = cast_target(self.parsed, call)
            vtype = vector_type(self.parsed, target[0]) if target else None
            if vtype is None:
                continue
            holder = outer_parens(call).parent
            value_field = "value" if holder is not None and holder.type == "init_declarator" else "right"
            if holder is not None and holder.type in ("init_declarator", "assignment_expression") and \
                    holder.child_by_field_name(value_field) == outer_parens(call):
                continue  # makes a view variable: its accesses are sites of the view
            operand = call_arguments(call)[0]
            site = self._classify(function, call, vtype, self._root_name(operand), pointer=self.text(call), base=None,
                                  cast_operand=self.text(operand), view_decl="")
            if site is not None:
                sites.append(site)
        return sites

    def _root_name(self, node: Node) -> str:
        node = unwrap(node)
        while True:
            if node.type == "binary_expression":
                left = unwrap(node.child_by_field_name("left"))
                node = left if left.type != "number_literal" else unwrap(node.child_by_field_name("right"))
            elif node.type == "pointer_expression" or node.type == "subscript_expression":
                node = unwrap(node.child_by_field_name("argument"))
            else:
                break
        return self.text(node) if node.type in ("identifier", "field_expression") else "ptr"

    def _classify(self, function: cp.Function, pointer_node: Node, vtype: VectorType, view: str, *, pointer: str,
                  base: str | None, cast_operand: str | None, view_decl: str) -> Site | None:
        """The access `pointer_node` takes part in, or None when it is not a vector load or store."""
        holder = outer_parens(pointer_node)
        parent = holder.parent
        index: str | None = None
        address = holder
        if parent is None:
            return None
        if parent.type == "subscript_expression" and parent.child_by_field_name("argument") == holder:
            index = self._index_text(parent)
            return self._from_deref(function, parent, vtype, view, pointer, index, base, cast_operand, view_decl)
        if parent.type == "binary_expression" and operator(parent) == "+":
            other = parent.child_by_field_name("right" if parent.child_by_field_name("left") == holder else "left")
            index = self.text(other)
            address = outer_parens(parent)
            parent = address.parent
            if parent is None:
                return None
        if parent.type == "argument_list" and parent.parent.type == "call_expression" \
                and cp.call_name(parent.parent) in LOAD_INTRINSICS and len(call_arguments(parent.parent)) == 1:
            call = parent.parent
            return self._site(function, view, "load", vtype, call, None, cp.call_name(call), pointer, index, base,
                              cast_operand, view_decl)
        if parent.type == "pointer_expression" and operator(parent) == "*":
            return self._from_deref(function, parent, vtype, view, pointer, index, base, cast_operand, view_decl)
        return None

    def _index_text(self, subscript: Node) -> str | None:
        indices = subscript.child_by_field_name("indices")
        named = [n for n in indices.named_children if n.type != "comment"] if indices is not None else []
        return self.text(named[0]) if len(named) == 1 else None

    def _from_deref(self, function: cp.Function, deref: Node, vtype: VectorType, view: str, pointer: str,
                    index: str | None, base: str | None, cast_operand: str | None, view_decl: str) -> Site | None:
        holder = outer_parens(deref)
        parent = holder.parent
        if parent is None:
            return None
        if parent.type == "assignment_expression" and parent.child_by_field_name("left") == holder:
            site = self._site(function, view, "store", vtype, parent, deref, "", pointer, index, base, cast_operand,
                              view_decl)
            if operator(parent) != "=":
                site.problem = f"`{self.text(parent)[:60]}` is a compound assignment to vector memory"
            return site
        if parent.type == "field_expression" or (parent.type == "pointer_expression" and operator(parent) == "&"):
            if parent.type == "pointer_expression":
                call = outer_parens(parent).parent
                if call is not None and call.type == "argument_list" and call.parent.type == "call_expression" \
                        and cp.call_name(call.parent) in LOAD_INTRINSICS:
                    return self._site(function, view, "load", vtype, call.parent, None, cp.call_name(call.parent),
                                      pointer, index, base, cast_operand, view_decl)
            return None  # one component (`xv[j].x`, a scalar access) or an address taken
        if parent.type == "update_expression":
            return None
        return self._site(function, view, "load", vtype, deref, deref, "", pointer, index, base, cast_operand,
                          view_decl)

    def _site(self, function: cp.Function, view: str, direction: str, vtype: VectorType, access: Node,
              deref: Node | None, intrinsic: str, pointer: str, index: str | None, base: str | None,
              cast_operand: str | None, view_decl: str) -> Site:
        site = Site(function.name, function.node, view, direction, vtype, access, deref, intrinsic, pointer, index,
                    base, cast_operand, view_decl)
        if intrinsic:
            site.space = "global"  # ld.global.nc and friends read global memory whatever the pointer
        else:
            target = deref.child_by_field_name("argument") if deref is not None else None
            site.space = self.scope.memory_space(target) if target is not None else None
        return site


# ------------------------------------------------------------------------------------------------
# Rewriting one site
# ------------------------------------------------------------------------------------------------

def _indent_unit(parsed: cp.ParsedSource, function: Node) -> str:
    """One level of indentation as the function writes it: its first statement's indent beyond the
    function's own."""
    body = function.child_by_field_name("body")
    statements = [c for c in body.named_children if c.type != "comment"] if body is not None else []
    if statements and statements[0].start_point.row != function.start_point.row:
        outer = line_indent(parsed.data, function.start_byte)
        inner = line_indent(parsed.data, statements[0].start_byte)
        if inner.startswith(outer) and len(inner) > len(outer):
            return inner[len(outer):]
    return _INDENT_UNIT


def _paren(text: str) -> str:
    stripped = text.strip()
    if re.fullmatch(r"[A-Za-z_]\w*|\d+[uUlL]*|[A-Za-z_][\w.]*(?:\[[^\[\]]*\])*|\([^()]*\)", stripped):
        return stripped
    return f"({stripped})"


class _Writer:
    """The scalar text for one site."""

    def __init__(self, finder: _Finder, site: Site):
        self.finder = finder
        self.parsed = finder.parsed
        self.site = site
        self.vtype = site.vtype
        self.statement: Node | None = None
        self.temps: set[str] = set()
        self.unit = _indent_unit(self.parsed, site.function_node)

    # element addresses ---------------------------------------------------------------------------
    def _offset(self, k: str | int) -> str:
        s, lanes = self.site, self.vtype.lanes
        if s.index is None:
            return str(k)
        scaled = f"{lanes} * {_paren(s.index)}"
        return scaled if k == 0 else f"{scaled} + {k}"

    def _pointer_and_offset(self, k: str | int, load: bool) -> tuple[str, str]:
        s, v = self.site, self.vtype
        const = "const " if load else ""
        if s.base is not None:
            return s.base, self._offset(k)
        if s.cast_operand is not None:
            return f"reinterpret_cast<{const}{v.component}*>({s.cast_operand})", self._offset(k)
        address = s.pointer if s.index is None else f"{s.pointer} + {_paren(s.index)}"
        return f"reinterpret_cast<{const}{v.component}*>({address})", str(k)

    def element(self, k: str | int, load: bool) -> str:
        """An lvalue (store) or rvalue (load) of component k in memory."""
        pointer, offset = self._pointer_and_offset(k, load)
        if self.site.intrinsic:
            address = pointer if offset == "0" else f"{pointer} + {offset}"
            return f"{self.site.intrinsic}({address})"
        return f"{pointer}[{offset}]"

    def lanes_expression(self) -> str:
        return f"static_cast<int>(sizeof({self.vtype.spelled}) / sizeof({self.vtype.component}))"

    # the rewrite ---------------------------------------------------------------------------------
    def edit(self) -> tuple[int, int, str]:
        s = self.site
        if s.problem:
            raise NotApplicable(s.problem)
        statement = self.statement = self._statement(s.access)
        if s.direction == "store":
            if statement.type != "expression_statement" or unparen(statement.named_children[0]) != s.access:
                raise NotApplicable(f"the store `{self.finder.text(s.access)[:60]}` is not a statement of its own")
            return self._emit(statement, self._store_lines())
        assignment = unparen(statement.named_children[0]) if statement.type == "expression_statement" else None
        if assignment is not None and assignment.type == "assignment_expression" and operator(assignment) == "=" \
                and outer_parens(s.access) == assignment.child_by_field_name("right") \
                and self._register_lvalue(assignment.child_by_field_name("left")):
            return self._emit(statement, self._load_into(self.finder.text(assignment.child_by_field_name("left"))))
        declared = self._declared_from(statement)
        if declared is not None:  # `float4 v = p4[i];` -> `float4 v;` and one load per component into v
            head = self.parsed.data[statement.start_byte:declared.start_byte].decode("utf-8")
            name = self.finder.text(declared.child_by_field_name("declarator"))
            return self._emit(statement, [(0, f"{head}{name};"), *self._load_into(name)])
        if not self.vtype.dependent:
            loads = [self.element(k, True) for k in range(self.vtype.lanes)]
            text = f"{self.vtype.make}({', '.join(loads)})"
            if len(text) > _LINE_LIMIT:  # one scalar load per line
                continuation = ",\n" + line_indent(self.parsed.data, statement.start_byte) + self.unit * 2
                text = f"{self.vtype.make}({continuation.join(loads)})"
            return s.access.start_byte, s.access.end_byte, text
        return self._hoist(statement)

    def _statement(self, node: Node) -> Node:
        """The plain statement (expression statement, declaration, return) whose expression holds `node`."""
        parent = node.parent
        while parent is not None:
            if parent.type in ("expression_statement", "return_statement") or (
                    parent.type == "declaration" and parent.parent is not None
                    and parent.parent.type not in ("for_statement", "condition_clause")):
                return parent
            if parent.type in ("lambda_expression", "function_definition", "compound_statement", "condition_clause",
                               "declaration") or parent.type.endswith("_statement"):
                break
            parent = parent.parent
        where = parent.type.replace("_", " ") if parent is not None else "file"
        raise NotApplicable(f"`{self.finder.text(node)[:60]}` is not inside a plain statement (it sits in a {where})")

    def _declared_from(self, statement: Node) -> Node | None:
        """The init_declarator of `T v = <access>;`: one plain variable of the vector type, not const,
        initialised by exactly the access."""
        if statement.type != "declaration" or self._braceless_body(statement):
            return None
        declarators = statement.children_by_field_name("declarator")
        if len(declarators) != 1 or declarators[0].type != "init_declarator":
            return None
        declarator = declarators[0]
        if declarator.child_by_field_name("declarator").type != "identifier" or \
                outer_parens(self.site.access) != declarator.child_by_field_name("value"):
            return None
        words = self.parsed.data[statement.start_byte:declarator.start_byte].decode("utf-8").split()
        if any(w in ("const", "constexpr", "static", "extern", "auto", "__shared__") for w in words) or \
                " ".join(words) != self.vtype.spelled:
            return None
        return declarator

    def _register_lvalue(self, node: Node) -> bool:
        """A side-effect-free lvalue of a local (register) variable or a by-value parameter: `v`,
        `cache[i]`, `v[b]`; its indices read no memory, so naming it once per component reads and
        writes nothing but registers."""
        node = unparen(node)
        if cp.nodes_of_type(node, "call_expression", "assignment_expression", "update_expression"):
            return False
        root = node
        reads = ("subscript_expression", "pointer_expression", "field_expression")
        while root.type in ("subscript_expression", "field_expression"):
            if root.type == "subscript_expression" and cp.nodes_of_type(root.child_by_field_name("indices"), *reads):
                return False
            root = unparen(root.child_by_field_name("argument"))
        if root.type != "identifier":
            return False
        name = self.finder.text(root)
        declaration = self.finder.scope.declaration(name, root)
        if declaration is not None and declaration.function is not None:
            return not declaration.indirection and not {"__shared__", "static", "extern"} & set(declaration.specifiers)
        found = self.finder.scope.param(name, root)
        return found is not None and not found[2].indirection

    def _loop_variable(self) -> str:
        """A name for the component loop: the loop body holds only text of the statement and the
        temporaries, so it must differ from those names alone (shadowing anything else is harmless)."""
        return fresh_name(identifiers(self.parsed, self.statement) | self.temps, "e")

    def _temporary(self) -> str:
        """A name for a temporary declared before the statement: new to the block it is declared in
        (the braces this rewrite adds, or the statement's enclosing block), so it shadows nothing
        that the rest of that block uses."""
        block = self.statement if self._braceless_body(self.statement) else self.statement.parent
        base = f"{self.site.view}_val" if self.site.view != "ptr" else "vec_val"
        name = fresh_name(identifiers(self.parsed, block) | self.temps, base)
        self.temps.add(name)
        return name

    def _load_into(self, target: str) -> list[tuple[int, str]]:
        v = self.vtype
        if not v.dependent:
            return [(0, f"{target}.{COMPONENTS[k]} = {self.element(k, True)};") for k in range(v.lanes)]
        e = self._loop_variable()
        return [(0, f"for (int {e} = 0; {e} < {self.lanes_expression()}; ++{e})"),
                (1, f"reinterpret_cast<{v.component}*>(&{target})[{e}] = {self.element(e, True)};")]

    def _store_lines(self) -> list[tuple[int, str]]:
        v, value_node = self.vtype, self.site.access.child_by_field_name("right")
        value = self.finder.text(value_node)
        lines: list[tuple[int, str]] = []
        if not self._register_lvalue(value_node):  # a value read from memory or computed: read it once
            temp = self._temporary()
            lines.append((0, f"const {v.spelled} {temp} = {value};"))
            value = temp
        if not v.dependent:
            return lines + [(0, f"{self.element(k, False)} = {_paren(value)}.{COMPONENTS[k]};") for k in range(v.lanes)]
        e = self._loop_variable()
        component = f"reinterpret_cast<const {v.component}*>(&{_paren(value)})[{e}]"
        return lines + [(0, f"for (int {e} = 0; {e} < {self.lanes_expression()}; ++{e})"),
                        (1, f"{self.element(e, False)} = {component};")]

    def _hoist(self, statement: Node) -> tuple[int, int, str]:
        """Load a dependent-type vector into a temporary before the statement that uses it."""
        s = self.site
        node, parent = s.access, s.access.parent
        while node != statement:
            if parent.type == "conditional_expression" and node != parent.child_by_field_name("condition") or \
                    parent.type == "binary_expression" and operator(parent) in ("&&", "||") and \
                    node == parent.child_by_field_name("right") or parent.type == "comma_expression":
                raise NotApplicable(f"`{self.finder.text(s.access)}` is evaluated only conditionally: "
                                    f"its load cannot move before the statement")
            node, parent = parent, parent.parent
        effects = [n for n in cp.nodes_of_type(statement, "assignment_expression", "update_expression")
                   if not (statement.type == "expression_statement" and n == unparen(statement.named_children[0]))]
        if effects:
            raise NotApplicable(f"the statement around `{self.finder.text(s.access)}` has side effects; "
                                f"its load cannot move before it")
        if statement.type == "declaration" and self._braceless_body(statement):
            raise NotApplicable("a declaration as the body of a control statement")
        v = self.vtype
        temp = self._temporary()
        data = self.parsed.data
        rest = (data[statement.start_byte:s.access.start_byte].decode() + temp
                + data[s.access.end_byte:statement.end_byte].decode())
        return self._emit(statement, [(0, f"{v.spelled} {temp};"), *self._load_into(temp), (0, rest)])

    def _braceless_body(self, statement: Node) -> bool:
        parent = statement.parent
        return parent is not None and parent.type in _BODY_PARENTS and statement.type != "compound_statement" \
            and (parent.type == "else_clause" or statement != parent.child_by_field_name("condition"))

    def _emit(self, statement: Node, lines: list[tuple[int, str]]) -> tuple[int, int, str]:
        data = self.parsed.data
        if self._braceless_body(statement):
            owner = statement.parent
            header = line_indent(data, owner.start_byte)
            inner = header + self.unit
            before = statement.prev_sibling
            body = "\n".join(inner + self.unit * depth + text for depth, text in lines)
            return before.end_byte, statement.end_byte, " {\n" + body + "\n" + header + "}"
        indent = line_indent(data, statement.start_byte)
        first, *rest = lines
        text = self.unit * first[0] + first[1] + "".join(
            "\n" + indent + self.unit * depth + line for depth, line in rest)
        return statement.start_byte, statement.end_byte, text


# ------------------------------------------------------------------------------------------------
# The transform
# ------------------------------------------------------------------------------------------------

SASS_NAMES = {("load", 128): "ldg_128", ("load", 64): "ldg_64", ("store", 128): "stg_128", ("store", 64): "stg_64"}


class Devectorize(Transform):
    name = "devectorize"
    intent = ("Move global memory in the widest aligned vector accesses the data allows (128-bit float4/uint4, "
              "64-bit float2/uint2), through an aligned vector view of the scalar buffer.")
    role = Role.MECHANISM
    removes = ("ldg_128", "stg_128", "ldg_64", "stg_64", *sorted(set(VECTOR_FEATURES.values())))
    adds = ()

    # -- find -------------------------------------------------------------------------------------
    def _plans(self, state: KernelState) -> list[tuple[Site, Anchor | None, str, tuple[int, int, str] | None]]:
        """Every vector access with its anchor (None with a reason where it cannot be rewritten)."""
        finder = _Finder(state)
        planned = []
        for site in finder.sites():
            head = f"{site.view}#{site.ordinal}"
            if site.space != "global":
                where = "shared memory" if site.space == "shared" else (
                    f"{site.space} memory" if site.space else "memory it cannot trace to a global pointer")
                planned.append((site, None, f"{head} in {site.function} accesses {where}; devectorize acts on "
                                            f"global memory only", None))
                continue
            try:
                start, end, text = _Writer(finder, site).edit()
            except NotApplicable as exc:
                planned.append((site, None, f"{head} in {site.function}: {exc}", None))
                continue
            data = finder.parsed.data
            new_data, (new_start,) = splice(data, [(start, end, text)])
            new_parsed = cp.parse(new_data.decode("utf-8"))
            places = occurrences(new_data, text, function_ranges(new_parsed, site.function))
            if new_start not in places:
                planned.append((site, None, f"{head} in {site.function}: its scalar form cannot be found again", None))
                continue
            at = places.index(new_start)
            vector_text = data[start:end].decode("utf-8")
            facts = {"dir": site.direction, "type": site.vtype.vector, "bits": site.vtype.bits,
                     "align": site.vtype.bits // 8, "view": site.view_decl, "from": vector_text, "to": text, "at": at}
            snippet = finder.text(site.access).splitlines()[0].strip()
            planned.append((site, Anchor(site.function, "access", make_key(head, facts), snippet), "",
                            (start, end, text)))
        return planned

    def find(self, state: KernelState) -> list[Anchor]:
        return [anchor for _, anchor, _, _ in self._plans(state) if anchor is not None]

    # -- backward ---------------------------------------------------------------------------------
    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        head, facts = payload(anchor.key)
        planned = [p for p in self._plans(state) if p[0].function == anchor.function
                   and f"{p[0].view}#{p[0].ordinal}" == head]
        if not planned:
            raise NotApplicable(f"no vector access {head} in {anchor.function}")
        site, found, reason, edit = next((p for p in planned if p[1] == anchor), planned[0])
        if found is None or edit is None:
            raise NotApplicable(reason)
        if facts and payload(found.key)[1] != facts:
            raise NotApplicable(f"the vector access {head} in {anchor.function} is not the one the anchor names")
        source = splice(cp.parse(state.source).data, [edit])[0].decode("utf-8")
        return self._result(state, found, source, Direction.BACKWARD, site.vtype, site.direction)

    # -- forward ----------------------------------------------------------------------------------
    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        head, facts = payload(anchor.key)
        if not {"from", "to", "at", "view", "type", "dir"} <= set(facts):
            raise NotApplicable(f"anchor {head} does not record the vector access to restore "
                                f"(take anchors from devectorize.find on the vectorized kernel)")
        parsed = cp.parse(state.source)
        if not functions_named(parsed, anchor.function):
            raise NotApplicable(f"no function {anchor.function}")
        if facts["view"]:
            declared = {self._declarator_text(parsed, d) for d in cp.declarations(parsed)
                        if d.function == anchor.function}
            declared |= {parsed.text(p.node) for f in functions_named(parsed, anchor.function)
                         for p in params(parsed, f)}
            if facts["view"] not in declared:
                raise NotApplicable(f"the aligned vector view `{facts['view']}` is no longer declared in "
                                    f"{anchor.function}: nothing vouches for {facts['align']}-byte alignment")
        source = _replace(state.source, anchor.function, facts["to"], facts["from"], facts["at"])
        vtype = _concrete(facts["type"], facts["type"])
        return self._result(state, anchor, source, Direction.FORWARD, vtype, facts["dir"])

    @staticmethod
    def _declarator_text(parsed: cp.ParsedSource, declaration: cp.Declaration) -> str:
        return parsed.text(declaration.init.parent) if declaration.init is not None else declaration.name

    def _result(self, state: KernelState, anchor: Anchor, source: str, direction: Direction, vtype: VectorType,
                access: str) -> Rewrite:
        new_state = KernelState(source=source, plan=state.plan)
        vectorized, scalar = (state.source, source) if direction is Direction.BACKWARD else (source, state.source)
        names = sorted(function_feature_names(vectorized, anchor.function)
                       - function_feature_names(scalar, anchor.function))
        taken = [n for n in names if n in VECTOR_FEATURES.values()]
        sass = SASS_NAMES.get((access, vtype.bits))
        changed = tuple(([sass] if sass else []) + taken)
        note = (f"{access} of {vtype.bits}-bit {vtype.vector} "
                + ("split into per-component scalar accesses" if direction is Direction.BACKWARD
                   else "restored as one vector access"))
        return Rewrite(self.name, direction, anchor, new_state,
                       removes=changed if direction is Direction.BACKWARD else (),
                       adds=changed if direction is Direction.FORWARD else (),
                       carrier={"vector_bits": vtype.bits, "lanes": vtype.lanes, "vector_type": vtype.vector},
                       note=note)


def _replace(source: str, function: str, old: str, new: str, at: int) -> str:
    """Replace the at-th occurrence of `old` inside the named function by `new`."""
    parsed = cp.parse(source)
    found = occurrences(parsed.data, old, function_ranges(parsed, function))
    if at >= len(found):
        raise NotApplicable(f"the de-vectorized accesses of this anchor are not in {function} "
                            f"(found {len(found)} matching places, need #{at})")
    start = found[at]
    new_data, _ = splice(parsed.data, [(start, start + len(old.encode("utf-8")), new)])
    result = new_data.decode("utf-8")
    if result == source:
        raise NotApplicable("devectorize changed nothing")
    return result


register(Devectorize())
