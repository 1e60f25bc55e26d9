"""scalarize_ldmatrix: an ldmatrix asm helper becomes shuffles of row addresses and plain shared loads.

The scalar code the transform writes is executed by a small warp interpreter (below): the actual
CUDA statements, parsed by tree-sitter, run on 32 lanes in lockstep, `__shfl_*_sync` reading the
other lanes' values as the hardware does, loads reading a byte-addressed shared memory, and every
shared-memory access checked for races between `__syncwarp`s. The registers each lane ends with are
compared with the PTX ISA's ldmatrix semantics as modelled in tests/test_corpus_gemm.py, on the
golden kernels and on the helpers rewritten inside the real corpus experts (through the GEMM's
swizzled fragment addressing, so every element lands where mma.m16n8k16 expects it).

The interpreter is shared with test_scalarize_mma.py and test_shuffle_to_shared.py.
"""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from klineage.corpus import kernel_entry
from klineage.features import cuda_parser as cp
from klineage.features.sass import sass_features
from klineage.features.source import source_features
from klineage.gate.compile import compile_kernel
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, Direction, NotApplicable, get
from tests.test_corpus_gemm import Model, ldmatrix_x4, ptx_a, ptx_b
from tests.transforms.golden import HERE, check_golden, load

CASES = ["x4", "x2_trans", "x1", "x4_split"]
CANONICAL = ["x4", "x2_trans", "x1"]  # the cases already in the layout forward renders
HELPERS = {"x4": "ldmatrix_x4", "x2_trans": "load_b_trans", "x1": "load_row_pair", "x4_split": "ldmatrix_x4"}
EXPERTS = {"gemm/mma_sync": "gemm_bf16_mma_sync", "conv2d/implicit_gemm": "conv2d_implicit_gemm"}


# =====================================================================================================
# A warp interpreter for the straight-line CUDA the scalarizing transforms write
# =====================================================================================================


class RaceError(AssertionError):
    pass


class SharedArray(list):
    """A __shared__ array (one object for the whole block); nested rows are SharedArrays too."""


class Ptr:
    """A pointer into the interpreter's byte-addressed shared memory, or into a SharedArray row."""

    def __init__(self, address: int, ctype: str | None = None):
        self.address, self.ctype = address, ctype


class ArrayRef:
    """`row + i` for an array `row`: dereferenced, it is `row[i]` (race-checked like a subscript)."""

    def __init__(self, array: list, index: int):
        self.array, self.index = array, index


class Half:
    """A 16-bit floating-point value: bf16 or f16 bits."""

    def __init__(self, kind: str, bits: int):
        self.kind, self.bits = kind, bits & 0xFFFF


class Dim3:
    def __init__(self, x: int, y: int = 0, z: int = 0):
        self.x, self.y, self.z = x, y, z


_SIZES = {"unsigned": 4, "unsigned int": 4, "uint32_t": 4, "int": 4, "float": 4, "unsigned short": 2, "uint16_t": 2}


def convert(ctype: str, value):
    """C conversion of a value to a declared type (qualifiers ignored)."""
    ctype = " ".join(w for w in ctype.replace("*", " * ").split() if w not in ("const", "volatile", "__shared__"))
    if "*" in ctype or isinstance(value, (list, Ptr)):
        return value
    if ctype in ("unsigned", "unsigned int", "uint32_t"):
        return int(value) & 0xFFFFFFFF
    if ctype in ("unsigned short", "uint16_t"):
        return int(value) & 0xFFFF
    if ctype == "int":
        v = int(value) & 0xFFFFFFFF
        return v - (1 << 32) if v >= 1 << 31 else v
    if ctype == "float":
        return np.float32(value)
    raise AssertionError(f"the interpreter does not know type {ctype!r}")


class _Return(Exception):
    def __init__(self, values):
        self.values = values


class Warp:
    """Runs CUDA statements on `warps * 32` lanes in lockstep. `memory` is the shared-memory byte
    array that `__cvta_shared_to_generic` addresses point into. Every access to a SharedArray is
    checked: a lane may not read a slot another lane of its warp wrote, nor write a slot another
    lane read or wrote, without a __syncwarp in between; two warps may never touch one slot."""

    def __init__(self, parsed: cp.ParsedSource, warps: int = 1, memory: bytearray | None = None,
                 block: tuple[int, int, int] | None = None):
        self.parsed = parsed
        self.lanes = 32 * warps
        self.memory = memory if memory is not None else bytearray()
        bx, by, _ = block or (self.lanes, 1, 1)
        self.thread = [Dim3(t % bx, (t // bx) % by, t // (bx * by)) for t in range(self.lanes)]
        self.block = Dim3(*(block or (self.lanes, 1, 1)))
        self.scopes: list[list[dict]] = [[{} for _ in range(self.lanes)]]
        self.types: list[dict] = [{}]
        self.accesses: dict[tuple[int, int], dict] = {}  # slot -> {"warp": w, "writes": set, "reads": set}
        self.shuffles = 0
        self.syncs = 0

    # -- variables ------------------------------------------------------------------------------

    def bind(self, name: str, values: list, ctype: str = "") -> None:
        for lane in range(self.lanes):
            self.scopes[-1][lane][name] = values[lane]
        self.types[-1][name] = ctype

    def lookup(self, name: str, lane: int):
        for scope in reversed(self.scopes):
            if name in scope[lane]:
                return scope[lane][name]
        raise AssertionError(f"unknown name {name!r}")

    def type_of(self, name: str) -> str:
        for scope in reversed(self.types):
            if name in scope:
                return scope[name]
        return ""

    def store(self, name: str, lane: int, value) -> None:
        for scope in reversed(self.scopes):
            if name in scope[lane]:
                scope[lane][name] = convert(self.type_of(name), value) if self.type_of(name) else value
                return
        raise AssertionError(f"assignment to undeclared {name!r}")

    # -- statements -----------------------------------------------------------------------------

    def run(self, node) -> list | None:
        """Execute a statement (a function body, say); the returned values if it returns."""
        try:
            self.execute(node)
        except _Return as done:
            return done.values
        return None

    def execute(self, node) -> None:
        kind = node.type
        if kind in ("comment", "preproc_call"):
            return
        if kind == "compound_statement":
            self.scopes.append([{} for _ in range(self.lanes)])
            self.types.append({})
            try:
                for child in node.named_children:
                    self.execute(child)
            finally:
                self.scopes.pop()
                self.types.pop()
        elif kind == "declaration":
            self.declare(node)
        elif kind == "expression_statement":
            if node.named_children:
                self.evaluate(node.named_children[0])
        elif kind == "for_statement":
            self.loop(node)
        elif kind == "return_statement":
            value = node.named_children[0] if node.named_children else None
            raise _Return(self.evaluate(value) if value is not None else [None] * self.lanes)
        else:
            raise AssertionError(f"the interpreter does not run {kind}: {self.parsed.text(node)[:60]}")

    def declare(self, node) -> None:
        specifiers = [self.parsed.text(c) for c in node.children if c.type in ("storage_class_specifier",
                                                                               "type_qualifier")]
        base = self.parsed.text(node.child_by_field_name("type"))
        for declarator in node.children_by_field_name("declarator"):
            value_node = declarator.child_by_field_name("value") if declarator.type == "init_declarator" else None
            inner = declarator.child_by_field_name("declarator") if value_node is not None else declarator
            dims, pointer = [], False
            while inner.type != "identifier":
                if inner.type == "array_declarator":
                    dims.insert(0, int(self.parsed.text(inner.child_by_field_name("size"))))
                pointer |= inner.type == "pointer_declarator"
                inner = inner.child_by_field_name("declarator")
            name = self.parsed.text(inner)
            ctype = base + (" *" if pointer else "")
            if "__shared__" in specifiers:
                def make(sizes):
                    return SharedArray(make(sizes[1:]) if len(sizes) > 1 else None for _ in range(sizes[0]))
                shared = make(dims)
                values = [shared] * self.lanes
            elif value_node is None:
                values = [[None] * dims[0] if dims else None for _ in range(self.lanes)]
            elif value_node.type == "initializer_list":
                items = [self.evaluate(item) for item in value_node.named_children]
                values = [[convert(base, item[lane]) for item in items] for lane in range(self.lanes)]
            else:
                values = [convert(ctype, v) for v in self.evaluate(value_node)]
            self.bind(name, values, "" if dims else ctype)

    def loop(self, node) -> None:
        self.scopes.append([{} for _ in range(self.lanes)])
        self.types.append({})
        try:
            init = node.child_by_field_name("initializer")
            if init is not None:
                self.execute(init) if init.type == "declaration" else self.evaluate(init)
            for _ in range(1000):
                condition = self.uniform(self.evaluate(node.child_by_field_name("condition")))
                if not condition:
                    return
                self.execute(node.child_by_field_name("body"))
                self.evaluate(node.child_by_field_name("update"))
            raise AssertionError("loop did not end")
        finally:
            self.scopes.pop()
            self.types.pop()

    @staticmethod
    def uniform(values: list):
        assert all(v == values[0] for v in values), f"divergent control flow: {values}"
        return values[0]

    # -- expressions (each returns one value per lane) -------------------------------------------

    def evaluate(self, node) -> list:
        kind = node.type
        text = self.parsed.text(node)
        if kind == "identifier":
            return [self.lookup(text, lane) for lane in range(self.lanes)]
        if kind == "number_literal":
            value = _number(text)
            return [value] * self.lanes
        if kind == "parenthesized_expression":
            return self.evaluate(node.named_children[0])
        if kind == "field_expression":
            base = self.parsed.text(node.child_by_field_name("argument"))
            field = self.parsed.text(node.child_by_field_name("field"))
            source = {"threadIdx": self.thread, "blockDim": [self.block] * self.lanes}[base]
            return [getattr(source[lane], field) for lane in range(self.lanes)]
        if kind == "subscript_expression":
            arrays = self.evaluate(node.child_by_field_name("argument"))
            index = self.evaluate(node.child_by_field_name("indices").named_children[0])
            return [self.read(arrays[lane], index[lane], lane) for lane in range(self.lanes)]
        if kind == "binary_expression":
            return self.binary(node)
        if kind == "unary_expression":
            op = self.parsed.text(node.child_by_field_name("operator"))
            values = self.evaluate(node.child_by_field_name("argument"))
            return [{"-": lambda v: -v, "~": lambda v: ~v, "!": lambda v: int(not v), "+": lambda v: v}[op](v)
                    for v in values]
        if kind == "pointer_expression":
            op = self.parsed.text(node.child_by_field_name("operator"))
            assert op == "*", text
            pointers = self.evaluate(node.child_by_field_name("argument"))
            return [self.read(p.array, p.index, lane) if isinstance(p, ArrayRef) else self.load(p)
                    for lane, p in enumerate(pointers)]
        if kind == "conditional_expression":
            condition = self.evaluate(node.child_by_field_name("condition"))
            yes = self.evaluate(node.child_by_field_name("consequence"))
            no = self.evaluate(node.child_by_field_name("alternative"))
            return [yes[lane] if condition[lane] else no[lane] for lane in range(self.lanes)]
        if kind == "assignment_expression":
            return self.assign(node)
        if kind == "update_expression":
            target = node.child_by_field_name("argument")
            step = 1 if "++" in text else -1
            old = self.evaluate(target)
            self.write(target, [v + step for v in old])
            return old
        if kind == "call_expression":
            return self.call(node)
        raise AssertionError(f"the interpreter does not evaluate {kind}: {text[:60]}")

    def binary(self, node) -> list:
        op = self.parsed.text(node.child_by_field_name("operator"))
        left = self.evaluate(node.child_by_field_name("left"))
        if op in ("&&", "||"):
            right = self.evaluate(node.child_by_field_name("right"))
            return [int(bool(a) and bool(b)) if op == "&&" else int(bool(a) or bool(b)) for a, b in zip(left, right)]
        right = self.evaluate(node.child_by_field_name("right"))
        out = []
        for a, b in zip(left, right):
            if isinstance(a, list):
                assert op == "+", op
                out.append(ArrayRef(a, b))
                continue
            if isinstance(a, Ptr):
                assert op == "+", op
                out.append(Ptr(a.address + b * _SIZES.get(a.ctype, 1), a.ctype))
                continue
            out.append(arithmetic(op, a, b))
        return out

    def assign(self, node) -> list:
        op = self.parsed.text(node.child_by_field_name("operator"))
        target = node.child_by_field_name("left")
        values = self.evaluate(node.child_by_field_name("right"))
        if op != "=":
            old = self.evaluate(target)
            values = [arithmetic(op[:-1], a, b) for a, b in zip(old, values)]
        self.write(target, values)
        return values

    def write(self, target, values: list) -> None:
        if target.type == "identifier":
            for lane in range(self.lanes):
                self.store(self.parsed.text(target), lane, values[lane])
        elif target.type == "subscript_expression":
            arrays = self.evaluate(target.child_by_field_name("argument"))
            index = self.evaluate(target.child_by_field_name("indices").named_children[0])
            for lane in range(self.lanes):
                self.touch(arrays[lane], index[lane], lane, write=True)
            for lane in range(self.lanes):
                arrays[lane][index[lane]] = values[lane]
        else:
            raise AssertionError(f"cannot assign to {self.parsed.text(target)}")

    def read(self, array, index: int, lane: int):
        self.touch(array, index, lane, write=False)
        value = array[index]
        assert value is not None, f"lane {lane} reads an unwritten slot {index}"
        return value

    def touch(self, array, index: int, lane: int, write: bool) -> None:
        if not isinstance(array, SharedArray) or isinstance(array[index], SharedArray):
            return
        assert 0 <= index < len(array), f"lane {lane}: index {index} outside the row"
        # the slot holds its array: while it lives, no other array can take its id() and be read as the same slot
        slot = self.accesses.setdefault((id(array), index),
                                        {"array": array, "warp": lane // 32, "writes": set(), "reads": set()})
        if slot["warp"] != lane // 32:
            raise RaceError(f"warps {slot['warp']} and {lane // 32} share a scratch slot")
        others_wrote = slot["writes"] - {lane}
        if others_wrote:
            raise RaceError(f"lane {lane} {'writes' if write else 'reads'} a slot lane {min(others_wrote)} wrote "
                            "without a __syncwarp between")
        if write and slot["reads"] - {lane}:
            raise RaceError(f"lane {lane} overwrites a slot lane {min(slot['reads'] - {lane})} read "
                            "without a __syncwarp between")
        slot["writes" if write else "reads"].add(lane)

    def syncwarp(self, warps: set[int]) -> None:
        self.syncs += 1
        for slot in self.accesses.values():
            if slot["warp"] in warps:
                slot["writes"].clear()
                slot["reads"].clear()

    def load(self, pointer: Ptr):
        size = _SIZES[pointer.ctype]
        assert 0 <= pointer.address and pointer.address + size <= len(self.memory), \
            f"load outside shared memory at {pointer.address}"
        assert pointer.address % size == 0, f"misaligned {size}-byte load at {pointer.address}"
        chunk = bytes(self.memory[pointer.address:pointer.address + size])
        return struct.unpack("<I" if size == 4 else "<H", chunk)[0]

    # -- calls ----------------------------------------------------------------------------------

    def call(self, node) -> list:
        function = node.child_by_field_name("function")
        args = node.child_by_field_name("arguments").named_children
        if function.type == "template_function":
            name = self.parsed.text(function.child_by_field_name("name"))
            target = self.parsed.text(function.child_by_field_name("arguments"))[1:-1].strip()
            assert name == "static_cast", name
            values = self.evaluate(args[0])
            if target.endswith("*"):
                ctype = " ".join(w for w in target[:-1].split() if w != "const")
                return [Ptr(v.address, ctype) for v in values]
            return [convert(target, v) for v in values]
        name = self.parsed.text(function)
        if name.startswith("__shfl"):
            return self.shuffle(name, [self.evaluate(a) for a in args])
        if name == "__syncwarp":
            masks = self.evaluate(args[0]) if args else [0xFFFFFFFF] * self.lanes
            assert all(m == 0xFFFFFFFF for m in masks), "partial-warp __syncwarp masks are not modelled"
            self.syncwarp(set(range(self.lanes // 32)))
            return [None] * self.lanes
        values = [self.evaluate(a) for a in args]
        per_lane = list(zip(*values))
        if name == "__cvta_shared_to_generic":
            return [Ptr(int(a)) for (a,) in per_lane]
        if name in ("__ushort_as_bfloat16", "__ushort_as_half"):
            kind = "bf16" if "bfloat" in name else "f16"
            return [Half(kind, int(a)) for (a,) in per_lane]
        if name in ("__bfloat162float", "__half2float"):
            return [half_to_float(h, "bf16" if "bfloat" in name else "f16") for (h,) in per_lane]
        if name == "fmaf":
            return [fma32(a, b, c) for a, b, c in per_lane]
        if name == "fmaxf":
            return [np.float32(max(a, b)) for a, b in per_lane]
        raise AssertionError(f"the interpreter has no builtin {name}")

    def shuffle(self, name: str, args: list[list]) -> list:
        masks, values, selectors = args
        assert all(m == 0xFFFFFFFF for m in masks), "partial-warp shuffle masks are not modelled"
        self.shuffles += 1
        out = []
        for lane in range(self.lanes):
            base, own = lane - lane % 32, lane % 32
            s = selectors[lane]
            source = {"__shfl_sync": lambda: s % 32,
                      "__shfl_xor_sync": lambda: own ^ s,
                      "__shfl_down_sync": lambda: own + s if own + s < 32 else own,
                      "__shfl_up_sync": lambda: own - s if own - s >= 0 else own}[name]()
            out.append(values[base + source])
        return out


def arithmetic(op: str, a, b):
    """A C binary operator on two values (ints with C division, or np.float32 in fp32)."""
    if op == "/":
        return a / b if isinstance(a, (float, np.floating)) else int(a / b)
    if op == "%":
        return a - int(a / b) * b
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "<<": lambda: a << b,
            ">>": lambda: a >> b, "&": lambda: a & b, "|": lambda: a | b, "^": lambda: a ^ b,
            "<": lambda: int(a < b), ">": lambda: int(a > b), "<=": lambda: int(a <= b),
            ">=": lambda: int(a >= b), "==": lambda: int(a == b), "!=": lambda: int(a != b)}[op]()


def _number(text: str):
    body = text.rstrip("uUlLfF") if not text.lower().startswith("0x") else text.rstrip("uUlL")
    if text[-1:] in "fF" and not text.lower().startswith("0x") or "." in body:
        return np.float32(float(body))
    return int(body, 0)


def half_to_float(value: Half, kind: str) -> np.float32:
    assert value.kind == kind, f"{kind} conversion of a {value.kind} value"
    if kind == "bf16":
        return np.array([value.bits << 16], dtype=np.uint32).view(np.float32)[0]
    return np.float32(np.array([value.bits], dtype=np.uint16).view(np.float16)[0])


def fma32(a, b, c) -> np.float32:
    """fmaf for the operands the scalar MMA feeds it: the product of two bf16 or f16 values is exact
    in fp32 (asserted), so one fp32 rounding of product + c is what fmaf computes."""
    product = np.float32(a) * np.float32(b)
    assert float(product) == float(a) * float(b), "the product is not exact in fp32"
    return np.float32(product + np.float32(c))


def function_body(source: str, name: str):
    parsed = cp.parse(source)
    (function,) = [f for f in cp.functions(parsed) if f.name == name]
    return parsed, function.node.child_by_field_name("body")


def parameters(parsed: cp.ParsedSource, name: str) -> list[str]:
    (function,) = [f for f in cp.functions(parsed) if f.name == name]
    declarator = function.node.child_by_field_name("declarator")
    while declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    names = []
    for parameter in declarator.child_by_field_name("parameters").named_children:
        identifiers = cp.nodes_of_type(parameter.child_by_field_name("declarator"), "identifier")
        names.append(parsed.text(identifiers[0]))
    return names


# =====================================================================================================
# ldmatrix semantics
# =====================================================================================================


def ldmatrix_trans(addresses: list[int], read_row, count: int) -> list[list[tuple]]:
    """ldmatrix .trans (PTX ISA): register j of lane l holds element l // 4 of rows 2 (l % 4) and
    2 (l % 4) + 1 of matrix j, the rows given by lanes 8 j .. 8 j + 7."""
    return [[(read_row(addresses[8 * j + 2 * (lane % 4)])[lane // 4],
              read_row(addresses[8 * j + 2 * (lane % 4) + 1])[lane // 4]) for j in range(count)]
            for lane in range(32)]


def tagged_memory(size: int) -> bytearray:
    """Shared memory whose 16-bit element at byte 2 e holds the tag e (so a value names its place)."""
    return bytearray(struct.pack(f"<{size // 2}H", *range(size // 2)))


def read_tags(memory: bytearray):
    def read_row(address: int) -> tuple:
        return struct.unpack("<8H", bytes(memory[address:address + 16]))
    return read_row


def run_scalar_ldmatrix(source: str, helper: str, addresses: list[int], memory: bytearray, count: int,
                        block: tuple[int, int, int] | None = None) -> list[list[tuple]]:
    """Execute the scalarized helper on a warp; each lane's registers as (low tag, high tag) pairs."""
    parsed, body = function_body(source, helper)
    warp = Warp(parsed, memory=memory, block=block)
    names = parameters(parsed, helper)
    if helper == "load_b_trans":  # (b0, b1, const void* row): the row pointer is its shared address
        warp.bind("b0", [0] * 32, "uint32_t")
        warp.bind("b1", [0] * 32, "uint32_t")
        warp.bind("addr", addresses, "uint32_t")  # the helper's own first statement, evaluated here
        statements = [s for s in body.named_children if s.type != "declaration"]
        for statement in statements:
            warp.execute(statement)
        words = [[warp.lookup("b0", lane), warp.lookup("b1", lane)] for lane in range(32)]
    elif helper == "load_row_pair":
        warp.bind("smem_addr", addresses, "uint32_t")
        warp.bind("bias", [0] * 32, "uint32_t")
        result = warp.run(body)
        words = [[result[lane]] for lane in range(32)]
    else:  # (uint32_t (&r)[4], uint32_t smem_addr)
        registers = [[None] * 4 for _ in range(32)]
        warp.bind(names[0], registers)
        warp.bind(names[1], addresses, "uint32_t")
        warp.run(body)
        words = registers
    assert warp.shuffles == count * (2 if helper == "load_b_trans" else 1)
    return [[(w & 0xFFFF, w >> 16) for w in lane_words[:count]] for lane_words in words]


# =====================================================================================================
# Tests
# =====================================================================================================


@pytest.fixture(scope="module")
def transform():
    return get("scalarize_ldmatrix")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "scalarize_ldmatrix" / case, which, "kernel")


def compile_ok(state: KernelState, cache):
    result = compile_kernel(state, cache)
    assert result.ok, result.log[-3000:]
    return result


def test_catalog_entry(transform):
    described = transform.describe()
    assert described["removes"] == ["ldmatrix", "ldsm"] and described["adds"] == ["shfl", "lds"]
    assert described["after"] == [] and described["has_forward"]


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("scalarize_ldmatrix", case)


@pytest.mark.parametrize("case", CANONICAL)
def test_canonical_layout_keeps_the_marker_without_a_verbatim_copy(case):
    """An asm statement in the canonical layout gives the marker it always gave (the committed
    lineages of such experts stay valid): forward renders it back without a verbatim copy."""
    assert "verbatim:" not in golden(case, "after").source


def test_a_non_canonical_layout_is_recorded_verbatim_and_restored_byte_for_byte(transform):
    """x4_split splits its template string twice, writes early-clobber outputs one per line and
    aligns the input its own way: the marker records the statement verbatim (continuation lines
    relative to the statement's indentation) and forward(backward(x)) == x byte for byte; the scalar
    block is the one x4 gets."""
    before, after = golden("x4_split", "before"), golden("x4_split", "after")
    (anchor,) = transform.find(before)
    assert transform.backward(before, anchor).state.source == after.source
    assert transform.forward(after, anchor).state.source == before.source
    recorded = [line for line in after.source.splitlines() if "//     verbatim:" in line]
    assert recorded[0] == '    //     verbatim: asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16"'
    assert recorded[1] == '    //     verbatim:              " {%0, %1, %2, %3},"'
    assert recorded[-1] == '    //     verbatim:     :  "r"(smem_addr));'
    block = "    {\n        // Lane l"
    canonical = golden("x4", "after").source
    assert canonical[canonical.index(block):] == after.source[after.source.index(block):]


@pytest.mark.parametrize("seed", range(2))
def test_x4_split_registers_match_the_isa(seed):
    rng = random.Random(seed)
    memory = tagged_memory(4096)
    addresses = [16 * r for r in rng.sample(range(4096 // 16), 32)]
    got = run_scalar_ldmatrix(golden("x4_split", "after").source, "ldmatrix_x4", addresses, memory, 4)
    assert got == ldmatrix_x4(addresses, read_tags(memory))


@pytest.mark.parametrize("case", CASES)
def test_golden_kernels_compile_and_lose_ldsm(case, cache):
    before, after = compile_ok(golden(case, "before"), cache), compile_ok(golden(case, "after"), cache)
    assert sass_features(before.cubin_bytes()).count("ldsm", "kernel") >= 1
    sass = sass_features(after.cubin_bytes())
    assert sass.count("ldsm", "kernel") == 0 and sass.count("shfl", "kernel") >= 1 and sass.count("lds", "kernel") >= 1
    assert not after.resources_for("kernel").spills
    features = {(f.locus, f.name) for f in source_features(golden(case, "after").source)}
    assert (HELPERS[case], "ldmatrix") not in features and (HELPERS[case], "shfl") in features


def test_anchors_and_notes(transform):
    (anchor,) = transform.find(golden("x4", "before"))
    assert anchor == Anchor("ldmatrix_x4", "asm", "ldmatrix_x4")
    assert anchor.snippet == "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
    assert transform.find(golden("x4", "after")) == []
    rewrite = transform.backward(golden("x2_trans", "before"), transform.find(golden("x2_trans", "before"))[0])
    assert rewrite.removes == ("ldmatrix", "ldsm") and rewrite.adds == ("shfl", "lds")
    assert "4 shuffles" in rewrite.note and "16-bit" in rewrite.note
    forward = transform.forward(rewrite.state, rewrite.anchor)
    assert forward.direction is Direction.FORWARD and forward.removes == ("shfl", "lds")


def _tile_source(asm_line: str, helper: str = "h") -> KernelState:
    source = ("#include <cstdint>\n__device__ void " + helper
              + "(uint32_t (&r)[4], uint32_t a, unsigned long long p)\n{\n"
              "    " + asm_line + "\n}\n"
              "extern \"C\" __global__ void kernel() {}\n")
    plan = LaunchPlan.from_toml('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = [1]\nblock = [32]\n')
    return KernelState(source=source, plan=plan)


@pytest.mark.parametrize("asm, message", [
    ('asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];" : "=r"(r[0]), "=r"(r[1]), '
     '"=r"(r[2]), "=r"(r[3]) : "l"(p));', "not a 32-bit shared address"),
    ('asm volatile("ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) '
     ': "r"(a));', "unsupported instruction form"),
    ('asm volatile("{ .reg .b32 t; ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1]; }" : "=r"(r[0]) : "r"(a));',
     "not a single instruction"),
    ('asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]) , "=r"(r[1]) '
     ': "r"(a + ldsm_lane));', "clash with the scalar code's locals"),
    ('asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%1, %0}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));',
     "not the outputs %0.. followed by the address"),
])
def test_not_applicable(transform, asm, message):
    state = _tile_source(asm)
    (anchor,) = transform.find(state)
    with pytest.raises(NotApplicable, match=message):
        transform.backward(state, anchor)


def test_not_applicable_when_already_scalar_or_absent(transform):
    anchor = Anchor("ldmatrix_x4", "asm", "ldmatrix_x4")
    with pytest.raises(NotApplicable, match="already scalar"):
        transform.backward(golden("x4", "after"), anchor)
    with pytest.raises(NotApplicable, match="already uses ldmatrix"):
        transform.forward(golden("x4", "before"), anchor)
    with pytest.raises(NotApplicable, match="no function named"):
        transform.backward(golden("x4", "before"), Anchor("missing", "asm", "missing"))


def test_several_ldmatrix_in_one_helper_get_ordinals(transform):
    state = _tile_source('asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\\n" : "=r"(r[0]) : '
                         '"r"(a));\n    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\\n" : '
                         '"=r"(r[1]) : "r"(a + 16));')
    anchors = transform.find(state)
    assert [a.key for a in anchors] == ["h#0", "h#1"]
    second = transform.backward(state, anchors[1]).state
    assert [a.key for a in transform.find(second)] == ["h#0"]  # the ordinal counts the scalar site too
    both = transform.backward(second, anchors[0]).state
    assert transform.find(both) == [] and not cp.syntax_errors(both.source)
    restored = transform.forward(transform.forward(both, anchors[0]).state, anchors[1]).state
    assert [a.key for a in transform.find(restored)] == ["h#0", "h#1"]
    # Both statements sit on one line each, not in the canonical layout: their markers record them
    # verbatim and the two forwards give the source back byte for byte.
    assert restored.source == state.source


def test_two_dimensional_blocks_use_the_linear_thread_index(transform):
    state = golden("x4", "before")
    plan = LaunchPlan.from_toml('name = "g"\nproblem = "g"\n[[launch]]\nentry = "kernel"\ngrid = [1]\n'
                                'block = [8, 4]\n')
    rewritten = transform.backward(KernelState(source=state.source, plan=plan),
                                   Anchor("ldmatrix_x4", "asm", "ldmatrix_x4")).state
    assert "((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x) & 31" in rewritten.source
    memory = tagged_memory(1024)
    addresses = [(lane % 16) * 32 + (lane // 16) * 16 for lane in range(32)]
    got = run_scalar_ldmatrix(rewritten.source, "ldmatrix_x4", addresses, memory, 4, block=(8, 4, 1))
    assert got == ldmatrix_x4(addresses, read_tags(memory))


# -- the scalar code against the ISA semantics -------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_x4_registers_match_the_isa_for_any_row_addresses(seed):
    rng = random.Random(seed)
    memory = tagged_memory(4096)
    rows = rng.sample(range(4096 // 16), 32)  # any 32 distinct 16-byte rows, in any lane order
    addresses = [16 * r for r in rows]
    got = run_scalar_ldmatrix(golden("x4", "after").source, "ldmatrix_x4", addresses, memory, 4)
    assert got == ldmatrix_x4(addresses, read_tags(memory))


@pytest.mark.parametrize("seed", range(4))
def test_x1_uses_only_the_first_eight_addresses(seed):
    rng = random.Random(seed)
    memory = tagged_memory(2048)
    addresses = [16 * r for r in rng.sample(range(128), 8)] + [10 ** 9] * 24  # lanes 8-31: never read
    got = run_scalar_ldmatrix(golden("x1", "after").source, "load_row_pair", addresses, memory, 1)
    assert got == [regs[:1] for regs in ldmatrix_x4(addresses[:8] * 4, read_tags(memory))]


@pytest.mark.parametrize("seed", range(4))
def test_x2_trans_registers_match_the_isa(seed):
    rng = random.Random(seed)
    memory = tagged_memory(2048)
    addresses = [16 * r for r in rng.sample(range(128), 16)] + [10 ** 9] * 16  # lanes 16-31: never read
    got = run_scalar_ldmatrix(golden("x2_trans", "after").source, "load_b_trans", addresses, memory, 2)
    read_row = read_tags(memory)
    assert got == ldmatrix_trans(addresses, read_row, 2)
    # Cross-check the .trans model with the corpus's non-transposing one: transposing each 8 x 8
    # matrix in memory first gives the same registers.
    transposed = bytearray(2 * 16 * 8)
    for j in range(2):
        for r in range(8):
            for c in range(8):
                struct.pack_into("<H", transposed, 2 * ((8 * j + c) * 8 + r), read_row(addresses[8 * j + r])[c])
    plain = ldmatrix_x4([16 * (8 * (i // 8 % 2) + i % 8) for i in range(32)], read_tags(transposed))
    assert got == [regs[:2] for regs in plain]


def test_the_isa_model_differs_without_the_shuffles():
    """A lane that used its own row address for every matrix (no shuffles) gets different registers:
    the test would catch a scalar form that skipped the address exchange."""
    memory = tagged_memory(1024)
    addresses = [(lane % 16) * 32 + (lane // 16) * 16 for lane in range(32)]
    read_row = read_tags(memory)
    own = [[(read_row(addresses[lane])[2 * (lane % 4)], read_row(addresses[lane])[2 * (lane % 4) + 1])] * 4
           for lane in range(32)]
    assert own != ldmatrix_x4(addresses, read_row)


# -- the real experts --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rewritten_experts(transform):
    out = {}
    for name in EXPERTS:
        state = kernel_entry(name).load()
        (anchor,) = transform.find(state)
        out[name] = (state, anchor, transform.backward(state, anchor))
    return out


@pytest.mark.parametrize("name", EXPERTS)
def test_expert_rewrite_parses_and_round_trips(transform, rewritten_experts, name):
    state, anchor, rewrite = rewritten_experts[name]
    assert anchor == Anchor("ldmatrix_x4", "asm", "ldmatrix_x4")
    assert not cp.syntax_errors(rewrite.state.source)
    assert transform.find(rewrite.state) == []
    assert transform.forward(rewrite.state, anchor).state.source == state.source  # both use the canonical layout
    features = {(f.locus, f.name) for f in source_features(rewrite.state.source)}
    assert ("ldmatrix_x4", "ldmatrix") not in features and ("ldmatrix_x4", "shfl") in features
    assert not any(name == "ldmatrix" for _, name in features)
    before = {f.name for f in source_features(state.source) if f.locus == "ldmatrix_x4"}
    assert {n for locus, n in features if locus == "ldmatrix_x4"} - before == {"shfl"}


@pytest.mark.parametrize("name", EXPERTS)
def test_expert_compiles_without_spills_and_ldsm_is_gone(rewritten_experts, cache, name):
    state, _, rewrite = rewritten_experts[name]
    entry = EXPERTS[name]
    before, after = compile_ok(state, cache), compile_ok(rewrite.state, cache)
    for arch in after.targets:
        res = after.resources_for(entry, arch)
        assert not res.spills and res.stack_bytes == 0, res
        old = sass_features(before.cubin_bytes(arch))
        new = sass_features(after.cubin_bytes(arch))
        assert old.count("ldsm", entry) > 0 and new.count("ldsm", entry) == 0
        # Each LDSM.x4 becomes four address shuffles and four 32-bit shared loads.
        assert new.count("shfl", entry) == 4 * old.count("ldsm", entry)
        assert new.count("lds", entry) - old.count("lds", entry) == 4 * old.count("ldsm", entry)
        assert new.count("hmma", entry) == old.count("hmma", entry)  # one mechanism at a time


def test_gemm_fragments_through_the_scalar_helper_match_mma(rewritten_experts):
    """The GEMM's real ldmatrix addressing (swizzled A and B stages) through the rewritten helper:
    every element of every A and B fragment is the one mma.m16n8k16 expects (PTX ISA layouts)."""
    _, _, rewrite = rewritten_experts["gemm/mma_sync"]
    m = Model(kernel_entry("gemm/mma_sync").load().constants)
    for rows, tiles, offset, layout in ((m.BLOCK_M, m.WARP_TILES_M, m.a_fragment_offset, "a"),
                                        (m.BLOCK_N, m.WARP_TILES_N // 2, m.b_fragment_offset, "b")):
        memory = tagged_memory(rows * m.ROW_BYTES)
        logical = {}
        for r in range(rows):
            for c in range(m.CHUNKS_PER_ROW):
                for e in range(m.VEC):
                    logical[(m.swizzle_offset(r, c) + 2 * e) // 2] = (r, c * m.VEC + e)
        for _, warp_m, warp_n in list(m.warps())[:3]:
            fas = [m.fragment_addressing(warp_m, warp_n, lane) for lane in range(32)]
            for ks in range(m.K_STEPS):
                for t in range(tiles):
                    addresses = [offset(fa, ks, t) for fa in fas]
                    got = run_scalar_ldmatrix(rewrite.state.source, "ldmatrix_x4", addresses, memory, 4)
                    assert got == ldmatrix_x4(addresses, read_tags(memory))
                    for lane in range(32):
                        if layout == "a":
                            for i in range(8):
                                r, k = ptx_a(lane, i)
                                expect = (warp_m * m.WARP_M + t * m.MMA_M + r, ks * m.MMA_K + k)
                                assert logical[got[lane][i // 2][i % 2]] == expect
                        else:
                            for half in range(2):
                                for i in range(4):
                                    k, n = ptx_b(lane, i)
                                    expect = (warp_n * m.WARP_N + (2 * t + half) * m.MMA_N + n, ks * m.MMA_K + k)
                                    assert logical[got[lane][2 * half + i // 2][i % 2]] == expect


def test_conv_helper_matches_the_isa(rewritten_experts):
    _, _, rewrite = rewritten_experts["conv2d/implicit_gemm"]
    memory = tagged_memory(8192)
    rng = random.Random(7)
    for _ in range(4):
        addresses = [16 * r for r in rng.sample(range(512), 32)]
        assert run_scalar_ldmatrix(rewrite.state.source, "ldmatrix_x4", addresses, memory, 4) == \
            ldmatrix_x4(addresses, read_tags(memory))


def test_race_checker_catches_a_missing_syncwarp():
    """The interpreter's race check (used by the shuffle_to_shared tests) is not vacuous."""
    source = ("__device__ float f(float v)\n{\n    __shared__ float s[32][32];\n"
              "    float* const row = s[threadIdx.x >> 5];\n    row[threadIdx.x & 31] = v;\n"
              "    return row[(threadIdx.x & 31) ^ 1];\n}\n")
    parsed, body = function_body(source, "f")
    warp = Warp(parsed)
    warp.bind("v", [np.float32(i) for i in range(32)], "float")
    with pytest.raises(RaceError, match="without a __syncwarp"):
        warp.run(body)


def test_overloaded_helpers_are_told_apart_by_ordinal(transform):
    source = ("#include <cstdint>\n"
              "__device__ void ldsm(uint32_t (&r)[2], uint32_t a)\n{\n"
              '    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\\n"\n'
              '                 : "=r"(r[0]), "=r"(r[1])\n                 : "r"(a));\n}\n'
              "__device__ void ldsm(uint32_t (&r)[4], uint32_t a)\n{\n"
              '    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\\n"\n'
              '                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])\n                 : "r"(a));\n}\n'
              'extern "C" __global__ void kernel() {}\n')
    plan = LaunchPlan.from_toml('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = [1]\nblock = [32]\n')
    state = KernelState(source=source, plan=plan)
    x2, x4 = transform.find(state)
    assert (x2.key, x4.key) == ("ldsm#0", "ldsm#1") and x4.snippet.endswith(".x4.shared.b16")
    after = transform.backward(state, x4).state
    assert "24 + ldsm_src" in after.source and "8 + ldsm_src" in after.source
    assert transform.find(after) == [x2]
    assert transform.forward(after, x4).state.source == source
