"""The static check: rules a kernel source must pass before it is compiled.

They keep a candidate honest and measurable: one self-contained file of device code, no vendor
library doing the work, no launches or host calls hidden in device code, no state or clocks that
let a kernel notice it is being timed or replay earlier answers. Macro bodies are parsed and
checked too, since a macro can hide any of these.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum
from itertools import groupby
from typing import Any

from tree_sitter import Node

from klineage.entries import entry_name
from klineage.errors import DocumentError
from klineage.features import cuda_parser as cp
from klineage.gate.nvcc_flags import refusal, refused_flags
from klineage.kernel import KernelState

MAX_BYTES = 512 * 1024
MAX_LINES = 20_000
MAX_PER_RULE = 5  # findings kept per rule; the last one kept counts the rest
ALLOWED_INCLUDES = frozenset({
    "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cuda_runtime.h", "mma.h", "cuda_pipeline.h",
    "cuda_awbarrier.h", "cooperative_groups.h", "cuda/pipeline", "cuda/barrier", "stdint.h", "cstdint",
    "climits", "cfloat", "float.h", "math.h", "cmath", "type_traits", "utility",
})
ALLOWED_INCLUDE_DIRS = ("cooperative_groups/", "cuda/std/", "cub/block/", "cub/warp/")
ALLOWED_PRAGMAS = ("unroll", "nounroll")

_LIBRARY_PREFIXES = {"cublas": "cuBLAS", "cudnn": "cuDNN"}
_LIBRARY_NAMESPACES = {"cutlass": "CUTLASS", "cute": "CuTe", "thrust": "Thrust", "torch": "PyTorch",
                       "at": "ATen", "c10": "PyTorch", "triton": "Triton"}
LIBRARY_HEADER = re.compile(
    r"(?i)^(?:cublas|cudnn|cutlass/|cute/|thrust/|torch/|aten/|c10/|triton|cub/device/|cub/cub\.cuh)")
_HOST_RUNTIME = re.compile(
    r"cudaLaunchDevice|cudaLaunchKernel\w*|cudaLaunchCooperativeKernel\w*|cudaStreamCreate\w*|cudaMalloc\w*"
    r"|cudaFree\w*|cudaMemcpy\w*|cudaMemset\w*|cudaDeviceSynchronize|cudaGraph\w*|cudaGetParameterBuffer\w*")
_TOKENS = "[(identifier) (type_identifier) (namespace_identifier) (field_identifier)] @token"
SCRATCH_HINT = ("state that outlives a launch lets a kernel reuse results between calls; "
                 "declare a [[scratch]] buffer in the launch plan instead")


class Rule(StrEnum):
    SOURCE_SIZE = "source_size"
    SYNTAX = "syntax"
    GLOBAL_FUNCTION = "global_function"
    PLAN_ENTRY = "plan_entry"
    NVCC_FLAG = "nvcc_flag"
    INCLUDE = "include"
    LIBRARY_DELEGATION = "library_delegation"
    HOST_RUNTIME = "host_runtime"
    TIMER = "timer"
    DEVICE_STATE = "device_state"
    MANAGED_MEMORY = "managed_memory"
    PRAGMA = "pragma"
    PREPROCESSOR_TRICK = "preprocessor_trick"
    EXTERN_CALL = "extern_call"  # found on the artifact only: a call the cubin leaves to the driver to link


@dataclass(frozen=True)
class StaticFinding:
    rule: Rule
    message: str
    line: int = 0  # 1-based; 0 when the finding concerns the whole file or the plan

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule.value, "message": self.message, "line": self.line}

    @classmethod
    def from_dict(cls, data: Any) -> StaticFinding:
        try:
            return cls(Rule(data["rule"]), str(data["message"]), int(data.get("line", 0)))
        except (AttributeError, TypeError, KeyError, ValueError):
            raise DocumentError("static finding",
                                f"needs a known 'rule', a 'message' and a 'line', not {data!r}") from None


@dataclass(frozen=True)
class StaticReport:
    findings: tuple[StaticFinding, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "findings": [f.to_dict() for f in self.findings]}

    @classmethod
    def from_dict(cls, data: Any) -> StaticReport:
        if not isinstance(data, dict) or not isinstance(data.get("findings", []), list):
            raise DocumentError("static report", "needs a list of 'findings'")
        report = cls(tuple(StaticFinding.from_dict(f) for f in data.get("findings", [])))
        if data.get("ok", report.ok) != report.ok:
            raise DocumentError("static report", "'ok' contradicts its findings")
        return report


@dataclass(frozen=True)
class _Code:
    """A parsed piece of the source: the file itself, or one macro body (reported at its #define)."""

    parsed: cp.ParsedSource
    macro: cp.Macro | None = None

    def line(self, node: Node) -> int:
        return self.macro.line if self.macro else node.start_point.row + 1

    def where(self) -> str:
        return f" (in macro {self.macro.name})" if self.macro else ""

    def tokens(self) -> list[Node]:
        return cp.captures(self.parsed.root, _TOKENS).get("token", [])


@dataclass(frozen=True)
class _Context:
    state: KernelState
    parsed: cp.ParsedSource
    code: tuple[_Code, ...]


def static_check(state: KernelState) -> StaticReport:
    oversize = list(_source_size(state.source))
    if oversize:  # not parsed: the limits also bound the parser's work
        return StaticReport(tuple(oversize))
    parsed = cp.parse(state.source)
    macros = tuple(_Code(cp.parse_fragment(m.body), m) for m in cp.macros(parsed))
    context = _Context(state, parsed, (_Code(parsed), *macros))
    findings = {finding for check in _CHECKS for finding in check(context)}
    order = list(Rule)
    return StaticReport(capped(sorted(findings, key=lambda f: (order.index(f.rule), f.line, f.message))))


def capped(findings: list[Any]) -> tuple[Any, ...]:
    """At most MAX_PER_RULE findings of each rule (findings sorted by rule; static or artifact ones)."""
    kept: list[Any] = []
    for _, group in groupby(findings, key=lambda f: f.rule):
        group = list(group)
        kept += group[:MAX_PER_RULE]
        if len(group) > MAX_PER_RULE:
            kept[-1] = replace(kept[-1], message=f"{kept[-1].message} (and {len(group) - MAX_PER_RULE} more like it)")
    return tuple(kept)


def _source_size(source: str) -> Iterator[StaticFinding]:
    size, lines = len(source.encode("utf-8")), len(source.splitlines())
    if size > MAX_BYTES:
        yield StaticFinding(Rule.SOURCE_SIZE, f"the source is {size:,} bytes; the limit is {MAX_BYTES // 1024} KiB")
    if lines > MAX_LINES:
        yield StaticFinding(Rule.SOURCE_SIZE, f"the source has {lines} lines; the limit is {MAX_LINES}")


def _syntax(context: _Context) -> Iterator[StaticFinding]:
    for issue in cp.syntax_errors(context.parsed):
        yield StaticFinding(Rule.SYNTAX, f"does not parse at line {issue.line}, column {issue.column}: "
                                         f"{issue.text!r}", issue.line)


def _global_function(context: _Context) -> Iterator[StaticFinding]:
    if not any(f.is_kernel for f in cp.functions(context.parsed)):
        yield StaticFinding(Rule.GLOBAL_FUNCTION, "no __global__ function is defined: a kernel needs an entry point")


def _plan_entries(context: _Context) -> Iterator[StaticFinding]:
    defined = cp.functions(context.parsed)
    for i, launch in enumerate(context.state.plan.launches):
        name = entry_name(launch.entry)
        if name is None:  # a mangled symbol we cannot read: the compiler resolves it
            continue
        base, instance = name
        where = f"launch[{i}] entry '{launch.entry}'"
        same = [f for f in defined if f.name == base]
        kernels = [f for f in same if f.is_kernel]
        if not kernels:
            names = ", ".join(sorted({f.name for f in defined if f.is_kernel})) or "none"
            what = "is not __global__" if same else "is not defined in the source"
            yield StaticFinding(Rule.PLAN_ENTRY, f"{where}: '{base}' {what} (__global__ functions: {names})",
                                same[0].lines[0] if same else 0)
        elif instance is False and all(f.template_params for f in kernels):
            yield StaticFinding(Rule.PLAN_ENTRY, f"{where}: '{base}' is a template; name an instance "
                                                 f"such as {base}<...>", kernels[0].lines[0])
        elif instance is True and not any(f.template_params for f in kernels):
            yield StaticFinding(Rule.PLAN_ENTRY, f"{where}: '{base}' is not a template, so it has no "
                                                 f"instance '{launch.entry}'", kernels[0].lines[0])


def _nvcc_flags(context: _Context) -> Iterator[StaticFinding]:
    for flag in refused_flags(context.state.plan.nvcc_flags):
        yield StaticFinding(Rule.NVCC_FLAG, refusal(flag))


def _includes(context: _Context) -> Iterator[StaticFinding]:
    for node in cp.nodes_of_type(context.parsed.root, "preproc_include", "preproc_call"):
        line = node.start_point.row + 1
        if node.type == "preproc_call":
            directive = context.parsed.text(node.child_by_field_name("directive"))
            if "".join(directive.split()) in ("#include_next", "#import"):
                yield StaticFinding(Rule.INCLUDE, f"{directive} is not allowed; use #include <header>", line)
            continue
        path = node.child_by_field_name("path")
        text = context.parsed.text(path)
        if path.type == "string_literal":
            yield StaticFinding(Rule.INCLUDE, f"#include {text} reads a local file; a kernel is one self-contained "
                                              f"source (CUDA headers are included with angle brackets)", line)
        elif path.type == "system_lib_string" and not allowed_header(text[1:-1].strip()):
            yield StaticFinding(Rule.INCLUDE, f"#include {text} is not an allowed header (allowed: "
                                              f"{', '.join(sorted(ALLOWED_INCLUDES))}, and the headers under "
                                              f"{', '.join(ALLOWED_INCLUDE_DIRS)})", line)


def allowed_header(path: str) -> bool:
    if ".." in path:
        return False
    return path in ALLOWED_INCLUDES or (path.startswith(ALLOWED_INCLUDE_DIRS) and not path.endswith("/"))


def _library_delegation(context: _Context) -> Iterator[StaticFinding]:
    def finding(library: str, what: str, line: int) -> StaticFinding:
        return StaticFinding(Rule.LIBRARY_DELEGATION, f"{what} uses {library}: the kernel must do the work "
                                                      f"itself, not call a library", line)

    for node in cp.nodes_of_type(context.parsed.root, "preproc_include"):
        path = context.parsed.text(node.child_by_field_name("path")).strip('<>"')
        if LIBRARY_HEADER.match(path):
            yield finding(path.split("/")[0].split(".")[0], f"#include <{path}>", node.start_point.row + 1)
    for code in context.code:
        for node in code.tokens():
            text = code.parsed.text(node)
            prefix = next((p for p in _LIBRARY_PREFIXES if text.lower().startswith(p)), None)
            if prefix:
                yield finding(_LIBRARY_PREFIXES[prefix], f"'{text}'{code.where()}", code.line(node))
            elif _names_namespace(node) and text in _LIBRARY_NAMESPACES:
                yield finding(_LIBRARY_NAMESPACES[text], f"'{text}::'{code.where()}", code.line(node))
        for node in cp.nodes_of_type(code.parsed.root, "qualified_identifier"):
            scope, name = node.child_by_field_name("scope"), node.child_by_field_name("name")
            if scope is not None and code.parsed.text(scope) == "cub" and code.parsed.text(name).startswith("Device"):
                yield finding("CUB's device-wide algorithms", f"'{code.parsed.text(node)}'{code.where()}",
                              code.line(node))


def _names_namespace(node: Node) -> bool:
    """`ns` in `ns::name`, or in `using namespace ns;` (where the grammar sees a plain identifier)."""
    return node.type == "namespace_identifier" or node.parent.type == "using_declaration"


def _host_runtime(context: _Context) -> Iterator[StaticFinding]:
    for code in context.code:
        for node in cp.nodes_of_type(code.parsed.root, "kernel_call_syntax"):
            yield StaticFinding(Rule.HOST_RUNTIME, f"'<<<' launches a kernel from device code{code.where()}: dynamic "
                                                   f"parallelism is not allowed; list every launch in the plan",
                                code.line(node))
        for node in cp.nodes_of_type(code.parsed.root, "call_expression"):
            called = cp.call_name(node)
            if _HOST_RUNTIME.fullmatch(called):
                yield StaticFinding(Rule.HOST_RUNTIME, f"'{called}'{code.where()} is a host runtime call; device "
                                                       f"code may not allocate, copy, synchronize or launch",
                                    code.line(node))


def _timer(context: _Context) -> Iterator[StaticFinding]:
    why = "a kernel must not be able to tell when it is being timed"
    for code in context.code:
        for node in cp.nodes_of_type(code.parsed.root, "string_literal", "concatenated_string"):
            if node.type == "string_literal" and node.parent.type == "concatenated_string":
                continue  # judged as part of the whole, which catches `"%%global" "timer"`
            if "globaltimer" in cp.string_value(code.parsed, node).lower():
                yield StaticFinding(Rule.TIMER, f"a string{code.where()} names %globaltimer: {why}", code.line(node))
        for node in code.tokens():
            text = code.parsed.text(node)
            if "globaltimer" in text.lower() or (node.type == "namespace_identifier" and text == "chrono"):
                yield StaticFinding(Rule.TIMER, f"'{text}'{code.where()} reads a clock: {why}", code.line(node))


def _device_state(context: _Context) -> Iterator[StaticFinding]:
    for code in context.code:
        for declaration in cp.declarations(code.parsed):
            specifiers = declaration.specifiers
            if declaration.constant or "__constant__" in specifiers or "__shared__" in specifiers:
                continue
            # A macro body is parsed inside a function, so any `__device__` variable in it is global.
            if "__device__" in specifiers and (declaration.function is None or code.macro):
                what = f"mutable __device__ variable '{declaration.name}'"
            elif "static" in specifiers and declaration.function is not None:
                what = f"static local variable '{declaration.name}'"
            else:
                continue
            yield StaticFinding(Rule.DEVICE_STATE, f"{what}{code.where()}: {SCRATCH_HINT}",
                                code.line(declaration.node))


def _managed_memory(context: _Context) -> Iterator[StaticFinding]:
    for code in context.code:
        for node in cp.nodes_of_type(code.parsed.root, "type_qualifier"):
            if code.parsed.text(node) == "__managed__":
                yield StaticFinding(Rule.MANAGED_MEMORY, f"__managed__ memory{code.where()} is shared with the host "
                                                         f"and outlives launches; use a [[scratch]] buffer",
                                    code.line(node))


def _pragmas(context: _Context) -> Iterator[StaticFinding]:
    for node in cp.nodes_of_type(context.parsed.root, "preproc_call"):
        if cp.is_pragma(node):
            text = cp.pragma_text(node)
            if re.match(r"\w*", text).group() not in ALLOWED_PRAGMAS:
                yield StaticFinding(Rule.PRAGMA, f"#pragma {text} is not allowed; only #pragma unroll and "
                                                 f"#pragma nounroll are", node.start_point.row + 1)


def _preprocessor_tricks(context: _Context) -> Iterator[StaticFinding]:
    data = context.parsed.data
    hidden = cp.comments_and_literals(data)
    dollar = data.find(b"$")
    while dollar != -1 and cp.inside(hidden, dollar):
        dollar = data.find(b"$", dollar + 1)
    if dollar != -1:  # printf's format strings are `$str` symbols, which the artifact check lets through
        yield StaticFinding(Rule.PREPROCESSOR_TRICK, "'$' in a name (a compiler extension) can take the name of a "
                                                     "symbol the compiler makes, such as printf's format strings "
                                                     "($str); write names without '$'",
                            data.count(b"\n", 0, dollar) + 1)
    for node in cp.nodes_of_type(context.parsed.root, "preproc_include"):
        path = node.child_by_field_name("path")
        if path.type not in ("string_literal", "system_lib_string"):
            yield StaticFinding(Rule.PREPROCESSOR_TRICK, f"#include {context.parsed.text(path)} names its file "
                                                         f"through a macro, which hides it from the check",
                                node.start_point.row + 1)
    for code in context.code:
        # The body of a macro is opaque to the grammar, so `##` is looked for in its text.
        if code.macro and "##" in code.macro.body:
            yield StaticFinding(Rule.PREPROCESSOR_TRICK, f"macro {code.macro.name} pastes tokens with ##, which "
                                                         f"builds names the check cannot see; write them out",
                                code.macro.line)
        for node in code.tokens():
            if code.parsed.text(node) == "_Pragma":
                yield StaticFinding(Rule.PREPROCESSOR_TRICK, f"_Pragma{code.where()} hides a pragma from the check; "
                                                             f"write #pragma unroll", code.line(node))


_CHECKS: tuple[Callable[[_Context], Iterator[StaticFinding]], ...] = (
    _syntax, _global_function, _plan_entries, _nvcc_flags, _includes, _library_delegation, _host_runtime, _timer,
    _device_state, _managed_memory, _pragmas, _preprocessor_tricks,
)
