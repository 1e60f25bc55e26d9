"""Calls of the source's own `__device__` helpers written out in the kernels that make them, so that the analysis
forwards read a kernel whose row loop, reduction or element's arithmetic its author put in a helper.

The forwards read what a kernel does by its statements: a row's loop, its accumulator, the store of one element. A
helper hides them (`y[row] = dot(a + row * k, x + (row / m) * k, k);`, `adam_step(p[i], g[i], m[i], v[i], pn, m1,
v1);`), and a forward that cannot see what a call does refuses it ("calls dot, which may have effects"). A helper
`_calls.pure_functions` admits (scalars in, a value out, no memory) is read as a math function already and stays
called; `inlined_calls` writes each call of another helper out where the call stood:

    if (row < outputs) y[row] = dot(a + (long long)row * k, x, k);
->  if (row < outputs) {
        const float* dot_u = a + (long long)row * k;
        float dot_s = 0.0f;
        for (int dot_j = 0; dot_j < k; ++dot_j) dot_s += dot_u[dot_j] * x[dot_j];
        y[row] = dot_s;
    }

The helper: defined once, at file scope and before the kernel (no overload, no declaration of another arity or with
a default argument, no template), each parameter a name taken by value, by pointer or by reference (no array, no
pointer to a pointer, nothing variadic); its body a block whose only `return` is its last statement (`return e;`, or
none or a bare one for a void helper), with no `goto` or label, `asm`, `static`, `extern`, `__shared__` or `volatile`
local, lambda, local type or preprocessor line but `#pragma`. Every call it makes is the math library's, a pure
helper's or another such helper's (each defined once; a helper is admitted only once all it calls are, so a call
cycle never enters): a helper calling what may have an effect (`printf`, an atomic, a barrier, a function the source
does not show) would bring that call into the kernel, where the forwards refuse it anyway, and stays called. The
names it reads from the file (functions, constant tables, types) mean the same in the kernel: the kernel declares
none of them, and none is a macro defined after the helper begins, defined twice or `#undef`ined. A call that a
written-out body brings into the kernel is written out on a later pass by the same rules (outer calls first).

The call: a statement of a kernel's block (a branch's or a loop's lone statement is braced first: a block of one
statement runs as that statement) that is `T x = f(args);` (one local, not `static` nor `constexpr`), `x = f(args);`,
`y[k] = f(args);` (a target that assigns nothing and calls nothing with an effect) or `f(args);`, passing as many
arguments as the helper has parameters. The helper's statements take the statement's place and run where the call
ran, once each time the statement runs; the value goes where the call's value went (C++17 evaluates an assignment's
right side, the call, before its target). A call nested in a larger expression of such a statement (`y[row] = m +
logf(row_sumexp(xr, cols, m));`) is hoisted: the helper's statements go just before the statement and its value
takes the call's place. That runs the helper before the rest of the statement rather than somewhere inside it, the
same wherever the order cannot be seen: the helper is quiet (writes nothing but its own locals, has no reference
parameter, and calls only the math library, pure helpers and quiet helpers; it may read memory, which nothing in
the statement writes before its store); only parentheses, arithmetic, casts, subscripts, fields and other calls'
argument lists stand between the call and its statement (no `&&`, `||`, `?:`, comma or `sizeof`), so the call ran
exactly once each time the statement ran; and the rest of the statement assigns nothing but its own target,
increments nothing and calls only what has no effect. A call in a condition, a `for` header, a `return`, a lambda or
an initializer list is left as written.

The arguments are evaluated once each, before the body, as a call evaluates them (in order: C++ leaves their order
unspecified, and this is one order a call may take):
- a by-value or pointer parameter becomes a local initialized by its argument (`const float adam_step_p = p[i];`,
  `const float* dot_u = a + row * k;`): the parameter's declaration renamed, `__restrict__` dropped (its promise
  would reach past the helper's body), `const` added to a scalar the helper never changes. Copy-initializing the local
  is what passing the argument did: the same conversion to the parameter's type.
- Such a parameter the helper never changes (never assigns nor increments, never takes its address, never passes it
  to a call that may take it by reference) is replaced by its argument instead where the argument is a name or a
  literal of exactly the parameter's type, or integer arithmetic (`+`, `-`, `*`, casts, parenthesized) on such names
  and literals of that type: the body reads the value the argument had. Its names are the kernel's plain locals or
  parameters (no array, reference, `__shared__`, `static` or `volatile` one, none whose address the kernel takes),
  which nothing can change before the body's last read: the body names nothing the kernel declares, a reference
  argument is named by no other argument, and no argument assigns or calls what may have an effect (else every
  argument gets its local). Float arithmetic is never substituted: a larger expression may contract `a * b + c` into
  one rounding where the helper's separate statement could not.
- A reference parameter `T& p` needs a plain local or by-value parameter of the kernel of type T, named by no other
  argument and not aliased: the body's uses of p become that name, read and written as through the reference.
The helper's own locals are renamed `<helper>_<name>` (numbered `<helper>2_<name>`, ... where any such name is taken
in the source), so they stand in the caller's block without braces and hide nothing of the kernel; a local
declared in an inner block of the helper keeps its block.

The value: `return e;` becomes what the call site wanted of the call, e renamed: `T x = e;`, `x = e;`, `y[k] = e;`,
`(void)(e);` (nothing for a name or a literal), or, hoisted, a local `<helper>_value` of the return type R
initialized by e in the call's place. A return converts e to R and the call site converts that on to its own type:
e stands as written where its type is known to be R (a local or parameter the helper declares R, a cast to R) or
the site's own type is R; otherwise it is `(R)(e)`, a cast that converts as the return did for an arithmetic R (for
another R the call stays). A local of the helper declared R and returned is the value itself: `T x = f(...)`, T the
local's declared type and R, declares it as x (`float m = row_max(xr, cols);` -> `float m = -INFINITY; for (...) m
= fmaxf(m, xr[row_max_j]);`), and a hoisted call reads it in the call's place.
Anything else is left as written, and the forwards refuse the call as before.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._calls import MATH_CALLS, pure_functions
from klineage.transforms._edit import call_arguments, indentation, is_written, operator, reindent, splice, unparen

_PASSES = 8  # calls a written-out body brings into a kernel are written out on the next pass, this deep at most
_QUALIFIERS = re.compile(r"\b(?:__restrict__|__restrict|restrict)\b\s*")
_BARRED_WORDS = re.compile(r"\b(?:asm|__asm__|__asm|goto|static|extern|thread_local|__shared__|__constant__|"
                           r"__device__|__managed__|volatile)\b")
_BARRED_NODES = ("goto_statement", "labeled_statement", "lambda_expression", "gnu_asm_expression", "for_range_loop",
                 "structured_binding_declarator", "type_definition", "alias_declaration", "field_declaration_list",
                 "enumerator_list", "template_declaration", "throw_statement", "try_statement")
_RETURN_TYPES = ("primitive_type", "sized_type_specifier", "type_identifier")
# integer types: arithmetic on them gives one value however often it is evaluated (floats may contract)
_INTEGERS = frozenset({"int", "unsigned", "unsigned int", "long", "long int", "long long", "long long int",
                       "unsigned long", "unsigned long long", "size_t", "int32_t", "int64_t", "uint32_t", "uint64_t",
                       "ptrdiff_t"})
_WIDE_SIGNED = frozenset({"long long", "long long int", "int64_t", "long", "long int", "ptrdiff_t"})
_ARITHMETIC = frozenset({"+", "-", "*"})
_UNHIDDEN = frozenset({"__shared__", "volatile", "static", "extern", "__constant__", "__device__", "__managed__"})
# the expressions a hoisted call may stand inside: each evaluates it exactly once, before its own value
_HOISTABLE_PATH = frozenset({"parenthesized_expression", "unary_expression", "cast_expression", "argument_list",
                             "call_expression", "subscript_argument_list", "subscript_expression", "field_expression",
                             "binary_expression", "init_declarator", "assignment_expression"})


@dataclass(frozen=True)
class _Variable:
    """One declared name: a local, a parameter."""

    name: str
    type: str  # `float`, `const float*` (a pointee's `const` kept, the variable's own dropped), `auto`
    form: str  # "value", "pointer", "reference", "array" or "other"
    specifiers: frozenset[str]  # `const`, `static`, `__shared__`, ... of its declaration
    node: Node  # its name in its declarator
    owner: Node  # the declaration or parameter_declaration
    scope: Node | None  # where it is visible (None: a place this module does not read)


@dataclass(frozen=True)
class _Helper:
    name: str
    returns: str  # "void" or the return type
    parameters: tuple[_Variable, ...]
    changed: frozenset[str]  # by-value parameters the body may change
    body: Node
    statements: tuple[Node, ...]  # the statements before the return (every statement of a void helper's body)
    result: Node | None  # e of the last statement `return e;`
    locals: tuple[_Variable, ...]
    free: frozenset[str]  # names it reads from the file: functions, tables, types
    calls: frozenset[str]
    quiet: bool  # writes nothing but its own locals; once admitted, also calls only the math library, pure helpers
    # and quiet helpers
    arithmetic: bool  # returns an arithmetic type, which a cast converts as a return does


def inlined_calls(state: KernelState) -> KernelState:
    """`state` with each call of a helper written out in its kernel where that computes the same (the module's
    docstring says when); the same state where there is none."""
    for _ in range(_PASSES):
        parsed = cp.parse(state.source)
        helpers = _helpers(parsed)
        edits = _edits(parsed, helpers) if helpers else []
        if not edits:
            return state
        state = KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan)
    return state


# --- the helpers -----------------------------------------------------------------------------------------------


def _helpers(parsed: cp.ParsedSource) -> dict[str, _Helper]:
    """The helpers whose calls may be written out, by name: each shown by `_helper`, and calling only the math
    library, pure helpers and helpers admitted before it (a fixed point, so a call cycle never enters)."""
    functions = cp.functions(parsed)
    if not any("__device__" in f.qualifiers and not f.is_kernel for f in functions):
        return {}
    counts = Counter(f.name for f in functions)
    pure = pure_functions(parsed)
    wanted = _wanted(functions, counts, pure)
    if not wanted:
        return {}
    macros = _macro_lines(parsed.source)
    declared: dict[str, list[Node]] = {}  # each name's function declarators: definitions and prototypes
    for declarator in cp.nodes_of_type(parsed.root, "function_declarator"):
        callee = declarator.child_by_field_name("declarator")
        if callee is not None:
            declared.setdefault(parsed.text(callee), []).append(declarator)
    by_value = {}  # each function defined once -> whether each parameter is taken by value (or pointer)
    for function in functions:
        declarator = function.node.child_by_field_name("declarator")
        parameters = _parameters(parsed, declarator, function.node) if counts[function.name] == 1 and \
            declarator is not None and declarator.type == "function_declarator" else None
        if parameters is not None:
            by_value[function.name] = tuple(p.form != "reference" for p in parameters)
    candidates = {}
    for function in functions:
        if function.name in wanted:
            helper = _helper(parsed, function, by_value, declared[function.name])
            if helper is not None and all(counts[c] <= 1 for c in helper.calls) and \
                    not any(_macro_moves(macros.get(name, []), function.node.start_byte) for name in helper.free):
                candidates[helper.name] = helper
    admitted: dict[str, _Helper] = {}
    grown = True
    while grown:
        grown = False
        for name, helper in candidates.items():
            if name not in admitted and all(c in MATH_CALLS or c in pure or c in admitted for c in helper.calls):
                admitted[name] = helper
                grown = True
    quiet: set[str] = set()
    grown = True
    while grown:  # quiet: writes nothing but its own locals, and calls only what writes nothing either
        grown = False
        for name, helper in admitted.items():
            if name not in quiet and helper.quiet and all(c in MATH_CALLS or c in pure or c in quiet
                                                          for c in helper.calls):
                quiet.add(name)
                grown = True
    return {name: replace(helper, quiet=name in quiet) for name, helper in admitted.items()}


def _wanted(functions: list[cp.Function], counts: Counter[str], pure: frozenset[str]) -> set[str]:
    """The names of the helpers the kernels call, and of those they call in turn: `__device__` functions defined
    once that `pure_functions` does not admit (only these are worth reading)."""
    helpers = {f.name: f for f in functions
               if "__device__" in f.qualifiers and not f.is_kernel and counts[f.name] == 1 and f.name not in pure}
    called = {cp.call_name(c) for f in functions if f.is_kernel for c in cp.nodes_of_type(f.node, "call_expression")}
    wanted: set[str] = set()
    waiting = [name for name in called if name in helpers]
    while waiting:
        name = waiting.pop()
        if name not in wanted:
            wanted.add(name)
            waiting += [cp.call_name(c) for c in cp.nodes_of_type(helpers[name].node, "call_expression")
                        if cp.call_name(c) in helpers]
    return wanted


def _macro_lines(source: str) -> dict[str, list[tuple[str, int]]]:
    """Each name a `#define` or `#undef` line names -> ("define" or "undef", where the line starts), in order."""
    found: dict[str, list[tuple[str, int]]] = {}
    for line in re.finditer(r"^[ \t]*#[ \t]*(define|undef)[ \t]+([A-Za-z_]\w*)", source, re.MULTILINE):
        found.setdefault(line[2], []).append((line[1], len(source[:line.start()].encode("utf-8"))))
    return found


def _macro_moves(lines: list[tuple[str, int]], start: int) -> bool:
    """A name the helper reads could mean another thing in a kernel after it: the name is `#undef`ined, defined
    twice, or defined after the helper begins (where the helper read a declaration of its own)."""
    return bool(lines) and (len(lines) > 1 or lines[0][0] == "undef" or lines[0][1] > start)


def _helper(parsed: cp.ParsedSource, function: cp.Function, by_value: dict[str, tuple[bool, ...]],
            declarators: list[Node]) -> _Helper | None:
    """The helper `function` is, where the module's rules admit its definition (`by_value`: which parameters of
    each function of the source are not references; `declarators`: the function declarators of its name); else
    None."""
    node, body = function.node, function.node.child_by_field_name("body")
    declarator, kind = node.child_by_field_name("declarator"), node.child_by_field_name("type")
    if function.template_params or function.scope or body is None or body.type != "compound_statement" or \
            declarator is None or declarator.type != "function_declarator" or kind is None or \
            kind.type not in _RETURN_TYPES or declarator.child_by_field_name("declarator").type != "identifier" or \
            _BARRED_WORDS.search(parsed.text(body)):
        return None
    parameters = _parameters(parsed, declarator, node)
    if parameters is None or _other_arity(declarators, declarator, len(parameters)):
        return None
    returns = _squash(parsed.text(kind))
    parts = _parts(body, returns)
    if parts is None or cp.nodes_of_type(body, *_BARRED_NODES) or any(
            n.type.startswith("preproc_") and not cp.pragma_text(n) for n in _descendants(body)):
        return None
    statements, result = parts
    locals_ = []
    for declaration in cp.nodes_of_type(body, "declaration"):
        found = _variables(parsed, declaration, _scope_of(declaration))
        if found is None or any(v.scope is None or v.form == "other" for v in found):
            return None
        locals_ += found
    names = {v.name for v in locals_}
    by_name = {p.name: p for p in parameters}
    if names & set(by_name) or function.name in names or not _scoped(parsed, body, locals_):
        return None
    own = names | set(by_name)
    free = {parsed.text(n) for n in cp.nodes_of_type(body, "identifier", "type_identifier")
            if parsed.text(n) not in own and not _qualified(n)}
    free |= {parsed.text(n) for p in parameters for n in cp.nodes_of_type(p.owner, "type_identifier")}
    calls = frozenset(cp.call_name(call) for call in cp.nodes_of_type(body, "call_expression"))
    changed = frozenset(p.name for p in parameters
                        if p.form != "reference" and _may_change(parsed, body, p.name, by_value))
    arrays = {v.name for v in locals_ if v.form == "array"}
    quiet = all(p.form != "reference" for p in parameters) and \
        not any(_writes_memory(parsed, target, own, arrays) for target in _targets(body))
    arithmetic = kind.type in ("primitive_type", "sized_type_specifier") or returns in _INTEGERS
    return _Helper(function.name, returns, tuple(parameters), changed, body, tuple(statements), result,
                   tuple(locals_), frozenset(free), calls, quiet, arithmetic)


def _parameters(parsed: cp.ParsedSource, declarator: Node, function: Node) -> list[_Variable] | None:
    """Each parameter as a variable, or None where one is unnamed, defaulted, variadic, an array or a pointer to a
    pointer (`(void)` declares none)."""
    nodes = [n for n in declarator.child_by_field_name("parameters").named_children if n.type != "comment"]
    if len(nodes) == 1 and _squash(parsed.text(nodes[0])) == "void":
        return []
    found = []
    for node in nodes:
        variables = _variables(parsed, node, function) if node.type == "parameter_declaration" else None
        if not variables or len(variables) != 1 or variables[0].form not in ("value", "pointer", "reference"):
            return None
        found += variables
    return found


def _other_arity(declarators: list[Node], own: Node, count: int) -> bool:
    """A declaration of the name (`declarators`) other than the definition's that takes another number of
    parameters or a default argument: an overload, or calls that pass fewer arguments."""
    for declarator in declarators:
        if declarator == own:
            continue
        parameters = [n for n in declarator.child_by_field_name("parameters").named_children if n.type != "comment"]
        if len(parameters) != count or any(n.type != "parameter_declaration" for n in parameters):
            return True
    return False


def _parts(body: Node, returns: str) -> tuple[list[Node], Node | None] | None:
    """(the statements before the return, e of `return e;`), where the only `return` is the body's last statement
    (none, or a bare one, for a void helper); else None."""
    statements = [n for n in body.named_children if n.type != "comment"]
    returns_found = cp.nodes_of_type(body, "return_statement")
    last = statements[-1] if statements else None
    if returns == "void":
        if not returns_found:
            return statements, None
        if returns_found != [last] or last.named_child_count:
            return None
        return statements[:-1], None
    if returns_found != [last] or [n for n in last.named_children if n.type != "comment"] != last.named_children[:1]:
        return None
    result = last.named_children[0] if last.named_child_count else None
    if result is None or result.type == "initializer_list":
        return None
    return statements[:-1], result


def _scoped(parsed: cp.ParsedSource, body: Node, locals_: list[_Variable]) -> bool:
    """Every use of a local's name lies inside the scope of one of its declarations, after it: renaming by name
    then renames exactly the uses of the helper's locals."""
    names = {v.name for v in locals_}
    for use in cp.nodes_of_type(body, "identifier"):
        name = parsed.text(use)
        if name in names and not _qualified(use) and not any(
                v.name == name and _contains(v.scope, use) and use.start_byte >= v.node.start_byte for v in locals_):
            return False
    return True


def _may_change(parsed: cp.ParsedSource, body: Node, name: str, by_value: dict[str, tuple[bool, ...]]) -> bool:
    """The body may change the by-value parameter `name`: it assigns or increments it (or a field of it), takes its
    address, or passes it to a call that may take it by reference (neither the math library's nor a function of the
    source taking that parameter by value)."""
    for use in cp.nodes_of_type(body, "identifier"):
        if parsed.text(use) != name or _qualified(use):
            continue
        node = use
        while node.parent is not None and (node.parent.type == "parenthesized_expression" or (
                node.parent.type == "field_expression" and node.parent.child_by_field_name("argument") == node)):
            node = node.parent
        parent = node.parent
        if is_written(node) or (parent.type == "pointer_expression" and operator(parent) == "&") or (
                parent.type == "call_expression" and parent.child_by_field_name("function") == node):
            return True
        if parent.type == "argument_list" and cp.call_name(parent.parent) not in MATH_CALLS:
            callee, at = by_value.get(cp.call_name(parent.parent), ()), call_arguments(parent.parent).index(node)
            if at >= len(callee) or not callee[at]:
                return True
    return False


def _targets(scope: Node) -> list[Node]:
    """What each assignment and increment under `scope` writes."""
    return [change.child_by_field_name("left" if change.type == "assignment_expression" else "argument")
            for change in cp.nodes_of_type(scope, "assignment_expression", "update_expression")]


def _writes_memory(parsed: cp.ParsedSource, target: Node | None, own: set[str], arrays: set[str]) -> bool:
    """A write to `target` reaches memory outside the helper's own names (its locals, by-value parameters and local
    arrays): through a pointer, a subscript of one, a reference parameter or a file's variable."""
    if target is None:
        return True
    target = unparen(target)
    while target.type == "field_expression" and operator(target) == ".":
        target = unparen(target.child_by_field_name("argument"))
    if target.type == "identifier":
        return parsed.text(target) not in own
    if target.type == "subscript_expression":
        array = unparen(target.child_by_field_name("argument"))
        return array.type != "identifier" or parsed.text(array) not in arrays
    return True


# --- declarations ----------------------------------------------------------------------------------------------


def _variables(parsed: cp.ParsedSource, owner: Node, scope: Node | None) -> list[_Variable] | None:
    """The variables a declaration or parameter declares, visible in `scope`; None for one this module does not
    read (a declarator it cannot name)."""
    specifiers = frozenset(parsed.text(c) for c in owner.children
                           if c.type in ("storage_class_specifier", "type_qualifier") or
                           (not c.is_named and parsed.text(c) in ("constexpr", "__shared__")))
    kind = owner.child_by_field_name("type")
    base = _squash(parsed.text(kind)) if kind is not None else ""
    found = []
    for declarator in owner.children_by_field_name("declarator"):
        node = declarator.child_by_field_name("declarator") if declarator.type == "init_declarator" else declarator
        shapes = []
        while node is not None and node.type != "identifier":
            shapes.append(node.type)
            inner = node.child_by_field_name("declarator")
            node = inner if inner is not None else next(
                (c for c in reversed(node.named_children) if c.type != "type_qualifier"), None)
        if node is None:
            return None
        pointers = shapes.count("pointer_declarator")
        if not shapes:
            form = "value"
        elif shapes == ["pointer_declarator"]:
            form = "pointer"
        elif shapes == ["reference_declarator"]:
            form = "reference"
        elif shapes == ["array_declarator"]:
            form = "array"
        else:
            form = "other"
        pointee = "const " if pointers and "const" in specifiers else ""
        found.append(_Variable(parsed.text(node), pointee + base + "*" * pointers, form, specifiers, node, owner,
                               scope))
    return found


def _scope_of(declaration: Node) -> Node | None:
    """Where a local declared by `declaration` is visible: its block, its `for` loop, the statement whose condition
    declares it; None for any other place."""
    parent = declaration.parent
    if parent is None:
        return None
    if parent.type in ("compound_statement", "for_statement"):
        return parent
    if parent.type in ("condition_clause", "case_statement"):
        return parent.parent
    return None


@dataclass
class _Kernel:
    """A kernel's declared names, for looking up what a name means at a call."""

    node: Node
    variables: list[_Variable]
    declared: set[str]  # every name the kernel declares (variables, types)
    aliased: set[str]  # names whose address the kernel takes or that a reference local binds

    def visible(self, name: str, at: Node) -> _Variable | None:
        """The variable `name` means at `at`: the innermost visible declaration; None where the kernel declares it
        somewhere this module does not read, or nowhere."""
        candidates = [v for v in self.variables if v.name == name]
        if any(v.scope is None for v in candidates):
            return None
        seen = [v for v in candidates if _contains(v.scope, at) and (
            v.owner.type == "parameter_declaration" or v.node.end_byte <= at.start_byte)]
        return max(seen, key=lambda v: (v.scope.start_byte, v.node.start_byte), default=None)


def _kernel(parsed: cp.ParsedSource, function: cp.Function) -> _Kernel | None:
    declarator = function.node.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    if declarator is None:
        return None
    variables: list[_Variable] = []
    for parameter in declarator.child_by_field_name("parameters").named_children:
        if parameter.type == "parameter_declaration":
            variables += _variables(parsed, parameter, function.node) or []
    body = function.node.child_by_field_name("body")
    for declaration in cp.nodes_of_type(body, "declaration"):
        found = _variables(parsed, declaration, _scope_of(declaration))
        if found is None:
            return None
        variables += found
    declared = {v.name for v in variables} | {
        parsed.text(n) for d in cp.nodes_of_type(body, "type_definition", "alias_declaration")
        for n in cp.nodes_of_type(d, "type_identifier")}
    aliased = {parsed.text(unparen(n.child_by_field_name("argument")))
               for n in cp.nodes_of_type(body, "pointer_expression") if operator(n) == "&"}
    for v in variables:
        if v.form == "reference" and v.owner.type == "declaration":
            aliased |= {parsed.text(n) for n in cp.nodes_of_type(v.owner, "identifier")}
    return _Kernel(function.node, variables, declared, aliased)


# --- the calls -------------------------------------------------------------------------------------------------


def _edits(parsed: cp.ParsedSource, helpers: dict[str, _Helper]) -> list[tuple[int, int, str]]:
    """One edit per statement of a kernel that calls a helper: the first of its calls that may be written out."""
    taken = set(re.findall(r"[A-Za-z_]\w*", parsed.source))
    quiet = {name for name, h in helpers.items() if h.quiet} | pure_functions(parsed) | MATH_CALLS
    edits = []
    for function in cp.functions(parsed):
        body = function.node.child_by_field_name("body")
        if not function.is_kernel or function.scope or body is None:
            continue
        calls = [c for c in cp.nodes_of_type(body, "call_expression") if cp.call_name(c) in helpers and
                 c.child_by_field_name("function").type == "identifier"]
        kernel = _kernel(parsed, function) if calls else None
        done: set[int] = set()
        for call in calls if kernel is not None else []:
            site = _site(call)
            if site is None or site[0].id in done:
                continue
            edit = _written_out(parsed, kernel, quiet, helpers[cp.call_name(call)], call, *site, taken)
            if edit is not None:
                edits.append(edit)
                done.add(site[0].id)
    return edits


_STATEMENTS = ("declaration", "expression_statement")


def _site(call: Node) -> tuple[Node, list[Node], bool] | None:
    """(the statement holding the call, the expressions between them, whether the statement is a branch's or a
    loop's lone statement and wants braces), where the statement is a declaration or an expression statement of a
    block or such a lone statement; else None."""
    path, node = [], call.parent
    while node is not None and node.type not in _STATEMENTS:
        if node.type.endswith("_statement") or node.type in ("condition_clause", "lambda_expression",
                                                             "function_definition", "initializer_list"):
            return None
        path.append(node)
        node = node.parent
    if node is None or node.parent is None:
        return None
    for outer in _ancestors(node):
        if outer.type == "lambda_expression":
            return None
        if outer.type == "function_definition":
            break
    parent = node.parent
    if parent.type == "compound_statement":
        return node, path, False
    field = {"if_statement": "consequence", "for_statement": "body", "while_statement": "body",
             "do_statement": "body"}.get(parent.type)
    if parent.type == "else_clause" or (field is not None and parent.child_by_field_name(field) == node):
        return node, path, True
    return None


def _written_out(parsed: cp.ParsedSource, kernel: _Kernel, quiet: set[str], helper: _Helper, call: Node,
                 statement: Node, path: list[Node], braced: bool, taken: set[str]) -> tuple[int, int, str] | None:
    """The edit that writes `call` out in its statement (the module's docstring), or None where that could compute
    otherwise (`quiet`: the calls that have no effect)."""
    arguments = call_arguments(call)
    form = _form(parsed, statement, call)
    if form is None or len(arguments) != len(helper.parameters) or helper.free & kernel.declared or \
            (helper.returns == "void" and form != "call") or helper.body.end_byte > kernel.node.start_byte:
        return None  # a helper defined after the kernel may read what the kernel's place does not see yet
    declared = {v.name for v in _variables(parsed, statement, None) or []} if statement.type == "declaration" \
        else set()
    if declared & {parsed.text(n) for a in arguments for n in cp.nodes_of_type(a, "identifier")}:
        return None  # an argument naming the local the statement declares reads it before its value
    if form == "store" and not _plain(parsed, unparen(statement.named_children[0]).child_by_field_name("left"), quiet):
        return None
    if form == "hoist" and not (helper.quiet and _hoistable(parsed, statement, call, path, quiet)):
        return None
    prefix = _prefix(helper, taken)
    names = {v.name: f"{prefix}_{v.name}" for v in helper.locals}
    lines = []
    effects = not all(_plain(parsed, a, quiet) for a in arguments)
    for parameter, argument in zip(helper.parameters, arguments):
        value = _argument(parsed, kernel, helper, parameter, argument, arguments, call, effects)
        if value is False:
            return None
        if value is None:  # its own local
            names[parameter.name] = f"{prefix}_{parameter.name}"
            lines.append(f"{_local(parsed, parameter, names[parameter.name], parameter.name in helper.changed)} = "
                         f"{_squash(parsed.text(argument))};")
        else:
            names[parameter.name] = value
    result = unparen(helper.result) if helper.result is not None else None
    known = _known_type(helper, result)
    tail = _tail(parsed, kernel, helper, call, statement, form, result, known, names, prefix)
    if tail is None:
        return None
    lines += _body_lines(parsed, helper, names) + tail
    taken |= {f"{prefix}_{n}" for n in [*(v.name for v in helper.locals), *(p.name for p in helper.parameters),
                                         "value"]}
    return _placed(parsed, statement, braced, lines)


def _form(parsed: cp.ParsedSource, statement: Node, call: Node) -> str | None:
    """How the statement uses the call: "declare" (`T x = f(...);`), "assign" (`x = f(...);`), "store" (`y[k] =
    f(...);`), "call" (`f(...);`), "hoist" (inside a larger expression), or None (a declaration the call may not
    leave: `static`, `__shared__`, `constexpr`, ...)."""
    if statement.type == "declaration":
        if any(c.type == "storage_class_specifier" for c in statement.children) or \
                _BARRED_WORDS.search(parsed.text(statement)) or re.search(r"\bconstexpr\b", parsed.text(statement)):
            return None
        declarators = statement.children_by_field_name("declarator")
        only = declarators[0] if len(declarators) == 1 else None
        if only is not None and only.type == "init_declarator" and \
                only.child_by_field_name("declarator").type == "identifier" and \
                unparen(only.child_by_field_name("value")) == call:
            return "declare"
        return "hoist"
    expression = unparen(statement.named_children[0]) if statement.named_child_count == 1 else None
    if expression == call:
        return "call"
    if expression is not None and expression.type == "assignment_expression" and operator(expression) == "=" and \
            unparen(expression.child_by_field_name("right")) == call:
        return "assign" if unparen(expression.child_by_field_name("left")).type == "identifier" else "store"
    return "hoist"


def _plain(parsed: cp.ParsedSource, node: Node, quiet: set[str]) -> bool:
    """`node` assigns and increments nothing and calls only what has no effect (`quiet`)."""
    return not cp.nodes_of_type(node, "assignment_expression", "update_expression") and all(
        cp.call_name(c) in quiet for c in cp.nodes_of_type(node, "call_expression"))


def _hoistable(parsed: cp.ParsedSource, statement: Node, call: Node, path: list[Node], quiet: set[str]) -> bool:
    """The call may run just before its statement: it runs exactly once each time the statement does (nothing
    between them evaluates it conditionally, more than once or not at all), and the rest of the statement assigns
    nothing but its own target and calls only what has no effect, so it cannot see the order."""
    top = statement.named_children[0] if statement.type == "expression_statement" else None
    for node in path:
        if node.type not in _HOISTABLE_PATH or (node.type == "binary_expression" and operator(node) in ("&&", "||")):
            return False
        if node.type in ("assignment_expression", "init_declarator") and node.parent != statement and node != top:
            return False
    if cp.nodes_of_type(statement, "update_expression") or any(
            a != top for a in cp.nodes_of_type(statement, "assignment_expression")):
        return False
    return all(c == call or cp.call_name(c) in quiet for c in cp.nodes_of_type(statement, "call_expression"))


def _argument(parsed: cp.ParsedSource, kernel: _Kernel, helper: _Helper, parameter: _Variable, argument: Node,
              arguments: list[Node], call: Node, effects: bool) -> str | None | bool:
    """What the parameter's uses become: the argument's text (a name for a reference), None for a local of its own,
    False where the call cannot be written out (a reference to anything but a plain local of its type, named by no
    other argument)."""
    value = unparen(argument)
    others = {parsed.text(n) for a in arguments if a != argument for n in cp.nodes_of_type(a, "identifier")}
    if parameter.form == "reference":
        if value.type != "identifier":
            return False
        name = parsed.text(value)
        local = kernel.visible(name, call)
        if local is None or local.form != "value" or local.type != parameter.type or name in others or \
                local.specifiers & _UNHIDDEN or name in kernel.aliased:
            return False
        return name
    if effects or parameter.name in helper.changed:
        return None
    for node in cp.nodes_of_type(value, "identifier"):
        local = kernel.visible(parsed.text(node), call)
        if local is None or local.form not in ("value", "pointer") or local.specifiers & _UNHIDDEN or \
                parsed.text(node) in kernel.aliased:
            return None
    if value.type in ("identifier", "number_literal"):
        kind = kernel.visible(parsed.text(value), call).type if value.type == "identifier" else \
            _literal_type(parsed.text(value))
        return parsed.text(value) if kind == parameter.type else None
    if parameter.form == "value" and parameter.type in _INTEGERS and _integer_type(parsed, kernel, value, call) == \
            parameter.type:
        return f"({parsed.text(value)})"
    return None


def _integer_type(parsed: cp.ParsedSource, kernel: _Kernel, node: Node, at: Node) -> str | None:
    """The integer type of integer arithmetic (`+`, `-`, `*`, casts, parentheses) on names and literals; None for
    anything else (a read of memory, a call, a float)."""
    node = unparen(node)
    found: str | None = None
    if node.type == "identifier":
        local = kernel.visible(parsed.text(node), at)
        found = local.type if local is not None and local.form == "value" else None
    elif node.type == "number_literal":
        found = _literal_type(parsed.text(node))
    elif node.type == "cast_expression":
        inner = _integer_type(parsed, kernel, node.child_by_field_name("value"), at)
        found = _squash(parsed.text(node.child_by_field_name("type"))) if inner is not None else None
    elif node.type == "unary_expression" and operator(node) in ("-", "+"):
        found = _integer_type(parsed, kernel, node.child_by_field_name("argument"), at)
    elif node.type == "binary_expression" and operator(node) in _ARITHMETIC:
        left, right = (_integer_type(parsed, kernel, node.child_by_field_name(s), at) for s in ("left", "right"))
        if left is not None and left == right:
            found = left
        elif {left, right} - {"int"} <= _WIDE_SIGNED and "int" in (left, right) and left != right:
            found = left if left != "int" else right  # an int converts to the 64-bit signed type unchanged
    return found if found in _INTEGERS else None


def _literal_type(text: str) -> str | None:
    """The type of a number literal C++ gives it (`2` int, `2ll` long long, `1.0f` float, `1e-3` double); None
    where this module does not tell (octal, large, other suffixes)."""
    integer = re.fullmatch(r"(0[xX][0-9a-fA-F]+|[1-9]\d*|0)([uU]?)(ll|LL)?", text)
    if integer:
        value, unsigned, wide = int(integer[1], 0), bool(integer[2]), bool(integer[3])
        if wide:
            return "unsigned long long" if unsigned else "long long" if value < 2 ** 63 else None
        if unsigned:
            return "unsigned int" if value < 2 ** 32 else None
        return "int" if value < 2 ** 31 else None
    number = re.fullmatch(r"(?:\d+\.\d*|\.\d+|\d+(?=[eE]))(?:[eE][-+]?\d+)?([fF]?)", text)
    if number:
        return "float" if number[1] else "double"
    return None


def _local(parsed: cp.ParsedSource, parameter: _Variable, name: str, changed: bool) -> str:
    """The declaration (without its value) of the local a by-value parameter becomes: the parameter's own, renamed,
    `__restrict__` dropped, `const` where the helper never changes it (a pointer as declared)."""
    owner = parameter.owner
    text = parsed.data[owner.start_byte:parameter.node.start_byte].decode("utf-8") + name + \
        parsed.data[parameter.node.end_byte:owner.end_byte].decode("utf-8")
    text = _squash(_QUALIFIERS.sub("", text))
    if parameter.form == "value" and not changed and "const" not in parameter.specifiers:
        text = "const " + text
    return text


def _known_type(helper: _Helper, result: Node | None) -> str | None:
    """The type of the return's value where it is a name the helper declares (a top-level local, a by-value
    parameter) or a cast to the return type, else None."""
    if result is not None and result.type == "cast_expression" and \
            _squash(result.child_by_field_name("type").text.decode("utf-8")) == helper.returns:
        return helper.returns
    if result is None or result.type != "identifier":
        return None
    name = result.text.decode("utf-8")
    found = [v for v in helper.locals if v.name == name] + [p for p in helper.parameters if p.name == name]
    if len(found) != 1 or found[0].form != "value" or (found[0].owner.type == "declaration" and
                                                       found[0].scope != helper.body):
        return None
    return found[0].type


def _tail(parsed: cp.ParsedSource, kernel: _Kernel, helper: _Helper, call: Node, statement: Node, form: str,
          result: Node | None, known: str | None, names: dict[str, str], prefix: str) -> list[str] | None:
    """The lines that follow the helper's statements: the call site's statement with the value in the call's place
    (`names` may be changed: a local the declaration takes over); None where the value would need a cast to a type
    that is not arithmetic."""
    value = _renamed(parsed, result, names) if result is not None else ""
    if result is not None and result.type == "comma_expression":
        value = f"({value})"
    if form == "call":
        return [] if result is None or result.type in ("identifier", "number_literal") else [f"(void)({value});"]
    if form == "declare":
        declarator = statement.child_by_field_name("declarator")
        local = _variables(parsed, statement, None)[0]
        head = parsed.data[statement.start_byte:local.node.start_byte].decode("utf-8")
        own = [v for v in helper.locals if v.name == (result.text.decode("utf-8") if result is not None else "")]
        if known is not None and len(own) == 1 and own[0].scope == helper.body and local.type == helper.returns and \
                _squash(head) == _squash(parsed.data[own[0].owner.start_byte:
                                                     own[0].owner.children_by_field_name("declarator")[0].start_byte]
                                         .decode("utf-8")):
            names[own[0].name] = local.name  # the helper's result local declared as the caller's local
            return []
        target = local.type
        place = declarator.child_by_field_name("value")
    elif form == "assign" or form == "store":
        assignment = unparen(statement.named_children[0])
        target = _lvalue_type(parsed, kernel, assignment.child_by_field_name("left"), call)
        place = assignment.child_by_field_name("right")
    else:  # hoisted: the call's place takes the value
        place = call
        if known != helper.returns or result.type != "identifier":  # an expression pasted in could round otherwise
            lines = [f"{helper.returns} {prefix}_value = {value};"]
            value = f"{prefix}_value"
        else:
            lines = []
        return lines + [_replaced(parsed, statement, place, value)]
    if known != helper.returns and target != helper.returns:
        if not helper.arithmetic:
            return None  # a cast of a class type may pick a constructor the return's conversion would not
        value = f"({helper.returns})({value})"
    return [_replaced(parsed, statement, place, value)]


def _lvalue_type(parsed: cp.ParsedSource, kernel: _Kernel, node: Node, at: Node) -> str | None:
    """The type of an assignment's target: a local's, or an element's of a pointer subscripted."""
    node = unparen(node)
    if node.type == "identifier":
        local = kernel.visible(parsed.text(node), at)
        return local.type if local is not None and local.form == "value" else None
    if node.type == "subscript_expression":
        array = unparen(node.child_by_field_name("argument"))
        local = kernel.visible(parsed.text(array), at) if array.type == "identifier" else None
        if local is not None and local.form == "pointer":
            return local.type.removeprefix("const ").removesuffix("*")
    return None


def _replaced(parsed: cp.ParsedSource, statement: Node, place: Node, text: str) -> str:
    """The statement's text with `place` written `text`."""
    return parsed.data[statement.start_byte:place.start_byte].decode("utf-8") + text + \
        parsed.data[place.end_byte:statement.end_byte].decode("utf-8")


def _renamed(parsed: cp.ParsedSource, node: Node, names: dict[str, str], end: Node | None = None) -> str:
    """The text from `node` to `end` (or `node`'s own), each name of `names` the helper declares written as it
    maps."""
    start, stop = node.start_byte, (end or node).end_byte
    edits = [(n.start_byte - start, n.end_byte - start, names[parsed.text(n)])
             for n in cp.nodes_of_type(node.parent or node, "identifier")
             if start <= n.start_byte and n.end_byte <= stop and parsed.text(n) in names and not _qualified(n)]
    return splice(parsed.data[start:stop], edits)[0].decode("utf-8")


def _body_lines(parsed: cp.ParsedSource, helper: _Helper, names: dict[str, str]) -> list[str]:
    """The helper's statements before its return, renamed, as lines indented from nothing."""
    if not helper.statements:
        return []
    first, last = helper.statements[0], helper.statements[-1]
    column = first.start_point.column
    text = " " * column + _renamed(parsed, first, names, last)
    return reindent(text, column, "").splitlines()


def _prefix(helper: _Helper, taken: set[str]) -> str:
    """The helper's name, numbered where a name it would give its locals is taken already."""
    own = [*(v.name for v in helper.locals), *(p.name for p in helper.parameters), "value"]
    number = 1
    while True:
        prefix = helper.name if number == 1 else f"{helper.name}{number}"
        if not any(f"{prefix}_{name}" in taken for name in own):
            return prefix
        number += 1


def _placed(parsed: cp.ParsedSource, statement: Node, braced: bool, lines: list[str]) -> tuple[int, int, str]:
    """The edit that puts `lines` in the statement's place, in a block of their own where it was a branch's or a
    loop's lone statement."""
    data = parsed.data
    if braced:
        outer = indentation(data, statement.parent.start_byte)
        inner = outer + "    "
        text = "{\n" + "".join(f"{inner}{line}\n" if line else "\n" for line in lines) + outer + "}"
        header = statement.prev_sibling  # `else`, `)`: the block opens on the header's line, after a blank
        if header is None or header.type == "comment":
            return statement.start_byte, statement.end_byte, text
        return header.end_byte, statement.end_byte, " " + text
    own = indentation(data, statement.start_byte)
    text = "\n".join(f"{own}{line}" if line else "" for line in lines)
    return statement.start_byte, statement.end_byte, text[len(own):] if text.startswith(own) else text


# --- small things ----------------------------------------------------------------------------------------------


def _squash(text: str) -> str:
    return " ".join(text.split())


def _qualified(node: Node) -> bool:
    """`node` is a name inside a qualified name (`std::max`), which no local hides."""
    return node.parent is not None and node.parent.type == "qualified_identifier"


def _contains(outer: Node | None, inner: Node) -> bool:
    return outer is not None and outer.start_byte <= inner.start_byte and inner.end_byte <= outer.end_byte


def _ancestors(node: Node):
    while node.parent is not None:
        node = node.parent
        yield node


def _descendants(node: Node):
    stack = [node]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)
