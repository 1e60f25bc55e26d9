"""SASS features: which classes of machine instruction each function of a cubin uses, and how often.

The SASS comes from `cuobjdump -sass` (which runs nvdisasm). Counts are static: an instruction in
a loop counts once.
"""

from __future__ import annotations

import re
import tempfile
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klineage.errors import DocumentError
from klineage.features.feature import Feature
from klineage.fingerprint import sha256_bytes
from klineage.toolchain import Toolchain, demangle, find_toolchain, run_tool

# Feature name -> pattern over the opcode with its modifiers (e.g. "LDG.E.128.CONSTANT"), as nvcc 13
# spells them for sm_90/sm_90a. One instruction may count for several features:
# LDG.E.128.CONSTANT is both ldg_128 and ldg_const. `\b` after a mnemonic keeps LDS from
# matching LDSM and LDG from matching LDGSTS.
FEATURES: dict[str, re.Pattern[str]] = {name: re.compile(pattern) for name, pattern in (
    ("ldg_128", r"^LDG\b.*\.128\b"),
    ("ldg_64", r"^LDG\b.*\.64\b"),
    ("ldg_32", r"^LDG\b(?!.*\.(?:64|128)\b)"),  # 32 bits or narrower
    ("ldg_const", r"^LDG\b.*\.CONSTANT\b"),  # read-only path: __ldg, const __restrict__
    ("stg_128", r"^STG\b.*\.128\b"),
    ("stg_64", r"^STG\b.*\.64\b"),
    ("ldgsts", r"^LDGSTS\b"),  # cp.async
    ("ldsm", r"^LDSM\b"),  # ldmatrix
    ("stsm", r"^STSM\b"),  # stmatrix
    ("hmma", r"^HMMA\b"),  # mma.sync on half types
    ("hgmma", r"^HGMMA\b"),  # wgmma (sm_90a)
    ("imma", r"^IMMA\b"),
    ("shfl", r"^SHFL\b"),
    ("bar_sync", r"^BAR\.(?:SYNC|RED)\b"),  # __syncthreads and its _count/_and/_or forms
    ("lds", r"^LDS\b"),
    ("sts", r"^STS\b"),
    ("ldl", r"^LDL\b"),  # local memory: spills and dynamically indexed arrays
    ("stl", r"^STL\b"),
    ("utmaldg", r"^UTMALDG\b"),  # TMA load
    ("utmastg", r"^UTMASTG\b"),  # TMA store
    ("mbarrier", r"^SYNCS\b"),  # mbarrier init, arrive, expect_tx, try_wait
    ("mufu", r"^MUFU\b"),  # special functions: ex2, rcp, rsq, sin ...
    ("ffma", r"^FFMA\b"),
    ("atom", r"^ATOMG?\b"),  # global (or generic) atomics whose result is used
    ("red", r"^REDG?\b"),  # global atomics whose result is unused
    ("atoms", r"^ATOMS\b"),  # shared-memory atomics
)}

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$")
# "        /*0040*/  @P0 LDG.E.128 R4, desc[UR4][R2.64] ;    /* 0x... */"
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;?\s*/\*\s*0x[0-9a-f]+\s*\*/\s*$")


@dataclass(frozen=True)
class SassFeatures:
    counts: dict[Feature, int]  # instructions per feature; features never seen are absent

    @property
    def features(self) -> frozenset[Feature]:
        return frozenset(self.counts)

    @property
    def loci(self) -> list[str]:
        return sorted({f.locus for f in self.counts})

    def names(self, locus: str | None = None) -> set[str]:
        return {f.name for f in self.counts if locus is None or f.locus == locus}

    def count(self, name: str, locus: str | None = None) -> int:
        """Instructions of one feature in one function, or in all of them."""
        return sum(n for f, n in self.counts.items() if f.name == name and (locus is None or f.locus == locus))

    def to_dict(self) -> dict[str, Any]:
        return {"counts": [f.to_dict() | {"count": n} for f, n in sorted(self.counts.items())]}

    @classmethod
    def from_dict(cls, data: Any, where: str = "sass features") -> SassFeatures:
        if not isinstance(data, dict) or not isinstance(data.get("counts"), list):
            raise DocumentError(where, "needs a 'counts' list")
        counts = {}
        for i, row in enumerate(data["counts"]):
            if not isinstance(row, dict) or not isinstance(row.get("count"), int):
                raise DocumentError(f"{where}.counts[{i}]", "needs 'locus', 'name' and a whole 'count'")
            counts[Feature.from_dict({k: v for k, v in row.items() if k != "count"}, f"{where}.counts[{i}]")] = (
                row["count"])
        return cls(counts)


# The listings of the cubins this process disassembled last, by content and tools: a compile's cubin is read by
# the artifact check and again for its features (the same bytes, the same listing), so the second read is this.
_LISTINGS: OrderedDict[tuple[str, str, str | None, str | None], dict[str, list[str]]] = OrderedDict()
_LISTINGS_KEPT = 64
_LISTINGS_LOCK = threading.Lock()


def disassemble(cubin: bytes | Path, toolchain: Toolchain | None = None) -> dict[str, list[str]]:
    """Function (demangled where possible) -> its SASS instructions, e.g. "@P0 LDG.E.128 R4, [R2.64]"."""
    toolchain = toolchain or find_toolchain()
    toolchain.require_nvdisasm()
    if not isinstance(cubin, bytes):
        return _disassemble(cubin, toolchain)
    key = (sha256_bytes(cubin), toolchain.cuobjdump, toolchain.nvdisasm, toolchain.demangler)
    with _LISTINGS_LOCK:
        listing = _LISTINGS.get(key)
        if listing is not None:
            _LISTINGS.move_to_end(key)
    if listing is None:
        listing = _disassemble(cubin, toolchain)
        with _LISTINGS_LOCK:
            _LISTINGS[key] = listing
            while len(_LISTINGS) > _LISTINGS_KEPT:
                _LISTINGS.popitem(last=False)
    return {name: list(instructions) for name, instructions in listing.items()}  # the caller's own copy


def _disassemble(cubin: bytes | Path, toolchain: Toolchain) -> dict[str, list[str]]:
    with tempfile.TemporaryDirectory(prefix="klineage-sass-") as tmp:
        work = Path(tmp)
        if isinstance(cubin, bytes):
            path = work / "kernel.cubin"
            path.write_bytes(cubin)
        else:
            path = Path(cubin).absolute()
            if not path.is_file():
                raise DocumentError(str(cubin), "cubin file not found")
        text = run_tool([toolchain.cuobjdump, "-sass", str(path)], env=toolchain.environment(work), cwd=work)
    functions: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if match := _FUNCTION.match(line):
            current = functions.setdefault(match.group(1), [])
        elif current is not None and (match := _INSTRUCTION.match(line)) and match.group(1):
            current.append(match.group(1))
    names = demangle(functions, toolchain)
    return {names[name]: instructions for name, instructions in functions.items()}


def sass_features(cubin: bytes | Path, toolchain: Toolchain | None = None) -> SassFeatures:
    counts: Counter[Feature] = Counter()
    for function, instructions in disassemble(cubin, toolchain).items():
        for instruction in instructions:
            opcode = _opcode(instruction)
            if opcode:
                counts.update(Feature(function, name) for name, pattern in FEATURES.items() if pattern.search(opcode))
    return SassFeatures(dict(counts))


def _opcode(instruction: str) -> str | None:
    """The mnemonic with modifiers; None for an instruction guarded by @!PT, which never runs
    (ptxas pads with such dummies)."""
    words = instruction.split()
    if words[0].startswith("@"):
        if words[0] == "@!PT":
            return None
        words = words[1:]
    return words[0] if words else None
