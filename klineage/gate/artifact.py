"""The kernel policy checked on what nvcc produced, whatever the source's spelling.

The static check reads the source as text and a grammar; the compiler reads it after macros,
escapes, line splices, `_Pragma` and whatever the flags add. So the rules that matter for an
honest measurement are checked again on the artifact:

- device state: an object in a writable global section of the cubin (`.nv.global`, where
  uninitialised `__device__` data lives, `.nv.global.init` for initialised data, a `const`
  global written through `const_cast` included), or a symbol marked managed;
- timers: a SASS read of `SR_GLOBALTIMERLO/HI` (`%globaltimer`); `clock()`/`clock64()`
  (`SR_CLOCKLO/HI`) stay allowed, as in the source policy: they count cycles, not wall time;
- calls the driver links at load time (undefined functions in the symbol table, each with its
  relocation): `vprintf` stays allowed (the run-time output cap bounds it), anything else, such as
  the device heap's `malloc` (state that outlives a launch), is refused;
- headers: the include tree of nvcc's own device-side preprocessing, with the same flags: what
  the source includes directly must be on the allow-list, and nothing in the whole tree may
  come from a vendor library.

Each finding names its rule and its evidence (target, symbol, section, relocation, SASS line,
header chain). A report is cached by the compile's key.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from klineage.errors import DocumentError
from klineage.features.sass import disassemble
from klineage.files import write_atomic
from klineage.gate.compile import CompileResult, preprocessed_markers
from klineage.gate.static import LIBRARY_HEADER, SCRATCH_HINT, Rule, allowed_header, capped
from klineage.gate.verdict import Finding, Reason
from klineage.kernel import KernelState
from klineage.toolchain import Toolchain, find_toolchain

ARTIFACT_VERSION = 1  # part of the cache path: a change to the rules judges every artifact afresh
ALLOWED_EXTERNS = frozenset({"vprintf"})
_SHF_WRITE, _SHF_ALLOC = 0x1, 0x2
_STO_CUDA_MANAGED = 0x4  # in st_other; cuobjdump -elf prints it as MANAGED
_PER_LAUNCH_SECTIONS = (".nv.shared",)  # writable, but fresh for every block of every launch
_TIMER = re.compile(r"\bSR_GLOBALTIMER\w*")
_DEVICE_RUNTIME = re.compile(r"cuda\w+|__cuda\w+")
_MARKER = re.compile(r'^# \d+ "((?:[^"\\]|\\.)*)"((?: \d)*)\s*$')


@dataclass(frozen=True)
class ArtifactFinding:
    rule: Rule
    message: str
    evidence: dict[str, str] = field(default_factory=dict)  # target, symbol, section, sass, header ...

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule.value, "message": self.message, "evidence": dict(self.evidence)}

    @classmethod
    def from_dict(cls, data: Any) -> ArtifactFinding:
        try:
            return cls(Rule(data["rule"]), str(data["message"]), {str(k): str(v) for k, v in data["evidence"].items()})
        except (AttributeError, TypeError, KeyError, ValueError):
            raise DocumentError("artifact finding", f"needs a known 'rule', a 'message' and 'evidence', "
                                                    f"not {data!r}") from None


@dataclass(frozen=True)
class ArtifactReport:
    findings: tuple[ArtifactFinding, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        return {"version": ARTIFACT_VERSION, "ok": self.ok, "findings": [f.to_dict() for f in self.findings]}

    @classmethod
    def from_dict(cls, data: Any) -> ArtifactReport:
        if not isinstance(data, dict) or data.get("version") != ARTIFACT_VERSION or not isinstance(
                data.get("findings"), list):
            raise DocumentError("artifact report", f"needs version {ARTIFACT_VERSION} and a list of 'findings'")
        return cls(tuple(ArtifactFinding.from_dict(f) for f in data["findings"]))

    def finding(self) -> Finding:
        """The verdict's finding: the first few rules with their evidence, all of them attached."""
        message = "; ".join(f"{f.rule} on the artifact: {f.message}" for f in self.findings[:3])
        return Finding(Reason.STATIC_CHECK, "artifact", message,
                       evidence={"artifact": [f.to_dict() for f in self.findings]})


def artifact_check(state: KernelState, compiled: CompileResult, cache_dir: Path | None = None,
                   toolchain: Toolchain | None = None) -> ArtifactReport:
    """Judge the cubins of a successful compile of `state` (and nvcc's preprocessing of it)."""
    if not compiled.ok:
        raise DocumentError("artifact check", f"needs a successful compile, not {compiled.status.value}")
    path = Path(cache_dir) / "artifact" / compiled.key[:2] / f"{compiled.key}.v{ARTIFACT_VERSION}.json" \
        if cache_dir is not None else None
    if path is not None and path.is_file():
        return ArtifactReport.from_dict(json.loads(path.read_text(encoding="utf-8")))
    toolchain = toolchain or find_toolchain()
    per_target: dict[tuple[Rule, str], ArtifactFinding] = {}
    markers = preprocessed_markers(state, toolchain)
    source = Path(state.plan.source).name
    for target in compiled.targets:
        cubin = compiled.cubin_bytes(target)
        found = [*elf_findings(cubin), *sass_findings(disassemble(cubin, toolchain)),
                 *include_findings(markers[target], source)]
        for finding in found:  # the same finding on every target is reported once, naming them all
            key = (finding.rule, finding.message)
            seen = per_target.get(key)
            targets = f"{seen.evidence['target']}, {target}" if seen else target
            per_target[key] = ArtifactFinding(finding.rule, finding.message, {**finding.evidence, "target": targets})
    order = list(Rule)
    report = ArtifactReport(capped(sorted(per_target.values(), key=lambda f: (order.index(f.rule), f.message))))
    if path is not None:
        write_atomic(path, json.dumps(report.to_dict(), indent=1, sort_keys=True))
    return report


def elf_findings(cubin: bytes) -> Iterator[ArtifactFinding]:
    """Writable or managed device state, and calls left for the driver to link."""
    try:
        elf = ELFFile(BytesIO(cubin))
        sections = list(elf.iter_sections())
        symtab = next((s for s in sections if isinstance(s, SymbolTableSection)), None)
        if symtab is None:
            raise DocumentError("artifact check", "the cubin has no symbol table")
        symbols = list(symtab.iter_symbols())
        raw_other = [symtab.data()[i * symtab["sh_entsize"] + 5] for i in range(len(symbols))]
        relocations = _relocations(sections)
    except (ELFError, IndexError, ValueError) as exc:
        raise DocumentError("artifact check", f"the cubin is not a readable ELF file: {exc}") from None
    externs = {s.name for s in symbols if s["st_info"]["type"] == "STT_FUNC" and s["st_shndx"] == "SHN_UNDEF"}
    state_sections = {i: s for i, s in enumerate(sections) if _holds_state(s)}
    in_state: set[int] = set()
    for index, symbol in enumerate(symbols):
        kind, where = symbol["st_info"]["type"], relocations.get(index, "not relocated")
        if raw_other[index] & _STO_CUDA_MANAGED and kind == "STT_OBJECT":
            in_state.add(symbol["st_shndx"])
            yield ArtifactFinding(Rule.MANAGED_MEMORY, f"symbol '{symbol.name}' is __managed__: memory shared with "
                                                       f"the host that outlives launches; use a [[scratch]] buffer",
                                  {"symbol": symbol.name, "relocation": where})
        elif kind == "STT_OBJECT" and symbol["st_shndx"] in state_sections:
            section = state_sections[symbol["st_shndx"]].name
            in_state.add(symbol["st_shndx"])
            if symbol.name.startswith("$str") and "vprintf" in externs:
                continue  # printf's format strings: printing is allowed, its output capped at run time
            yield ArtifactFinding(Rule.DEVICE_STATE, f"symbol '{symbol.name}' ({symbol['st_size']} bytes) lives in "
                                                     f"the writable section {section}: {SCRATCH_HINT}",
                                  {"symbol": symbol.name, "section": section, "relocation": where})
        elif kind == "STT_FUNC" and symbol.name in externs - ALLOWED_EXTERNS:
            rule = Rule.HOST_RUNTIME if _DEVICE_RUNTIME.fullmatch(symbol.name) else Rule.EXTERN_CALL
            yield ArtifactFinding(rule, f"calls '{symbol.name}', which the driver links at load time: a kernel may "
                                        f"call only its own device code (and printf)",
                                  {"symbol": symbol.name, "relocation": where})
    for index, section in state_sections.items():
        if index not in in_state and section["sh_size"]:
            yield ArtifactFinding(Rule.DEVICE_STATE, f"the writable section {section.name} holds "
                                                     f"{section['sh_size']} bytes no symbol names: {SCRATCH_HINT}",
                                  {"section": section.name})


def _holds_state(section: Any) -> bool:
    """A section device code can write that keeps its bytes from one launch to the next."""
    flags = section["sh_flags"]
    return bool(flags & _SHF_WRITE and flags & _SHF_ALLOC) and not section.name.startswith(_PER_LAUNCH_SECTIONS)


def _relocations(sections: list[Any]) -> dict[int, str]:
    """Symbol index -> where it is relocated first, e.g. `.rela.nv.constant4 +0x8`."""
    found: dict[int, str] = {}
    for section in sections:
        if isinstance(section, RelocationSection):
            for relocation in section.iter_relocations():
                found.setdefault(relocation["r_info_sym"], f"{section.name} +{relocation['r_offset']:#x}")
    return found


def sass_findings(functions: dict[str, list[str]]) -> Iterator[ArtifactFinding]:
    """Reads of the global (wall-clock) timer, by function and instruction."""
    for function, instructions in functions.items():
        for instruction in instructions:
            if _TIMER.search(instruction):
                yield ArtifactFinding(Rule.TIMER, f"{function} reads %globaltimer ('{instruction}'): a kernel must not "
                                                  f"be able to tell when it is being timed",
                                      {"function": function, "sass": instruction})


def include_findings(markers: list[str], source: str) -> Iterator[ArtifactFinding]:
    """Headers from the preprocessor's line markers: the direct includes of `source` against the
    allow-list, and every file of the tree against the vendor libraries (reported where the tree
    enters a library, not for every file the library brings)."""
    for chain, header in include_edges(markers):
        name, parent = header_name(header), chain[-1] if chain else ""
        if parent == source and not allowed_header(name):
            yield ArtifactFinding(Rule.INCLUDE, f"the source includes <{name}>, which is not an allowed header "
                                                f"(see docs/kernel-policy.md)", {"header": header})
        library = _library_path(header)
        if library and not any(_library_path(outer) for outer in chain):
            yield ArtifactFinding(Rule.LIBRARY_DELEGATION, f"<{name}> (included by {header_name(parent)}) belongs to "
                                                           f"a vendor library ({library}): the kernel must do the "
                                                           f"work itself",
                                  {"header": header, "included_by": parent})


def include_edges(markers: list[str]) -> list[tuple[tuple[str, ...], str]]:
    """(the chain of includers, outermost first; the included file) for every file the
    preprocessor entered, from gcc's line markers: flag 1 enters a file, flag 2 returns to one, a
    marker without flags moves within one."""
    stack: list[str] = []
    edges = []
    for line in markers:
        match = _MARKER.match(line)
        if not match:
            continue
        name, flags = re.sub(r"\\(.)", r"\1", match.group(1)), match.group(2).split()
        if "1" in flags:
            edges.append((tuple(stack), name))
            stack.append(name)
        elif "2" in flags:
            while stack and stack[-1] != name:
                stack.pop()
            if not stack:
                stack.append(name)
        elif stack:
            stack[-1] = name
        else:
            stack.append(name)
    return edges


def header_name(path: str) -> str:
    """How an include directive would name `path`: the part after the toolkit's include folder
    (`cub/block/block_reduce.cuh`), or the path itself when it lies elsewhere."""
    normal = os.path.normpath(path)
    for root in ("/include/cccl/", "/targets/x86_64-linux/include/", "/include/c++/", "/include/"):
        if root in normal:
            rest = normal.rsplit(root, 1)[1]
            return rest.split("/", 1)[1] if root == "/include/c++/" and "/" in rest else rest
    return normal


def _library_path(path: str) -> str:
    name = header_name(path)
    match = LIBRARY_HEADER.match(name)
    return match.group(0).rstrip("/.") if match else ""
