"""Correctness machinery for the gate's runner: poison, guarded buffers, comparison against a reference.

Pure torch, device-agnostic: the runner uses it on CUDA tensors, the tests on CPU. Every check is
bitwise where "was this written / changed" is the question, and numeric (in float64) where
"is this right" is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from klineage.gate.verdict import Reason
from klineage.problem import Tolerance

# Poison is a quiet NaN whose payload no arithmetic produces (CUDA's canonical NaNs are all-ones
# payloads, the CPU's 0x7FC00000 / 0xFFC00000 family), so "never written" differs from "computed
# NaN". Integers and bools get 0xA5 in every byte: for bools that is not even a valid value.
_FLOAT_POISON: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float64: (torch.int64, 0x7FFDEAD5A5ADEAD5),
    torch.float32: (torch.int32, 0x7FDEAD5A),
    torch.float16: (torch.int16, 0x7E5A),
    torch.bfloat16: (torch.int16, 0x7FDA),
}
_INT_BITS: dict[torch.dtype, torch.dtype] = {
    torch.int64: torch.int64,
    torch.int32: torch.int32,
    torch.int16: torch.int16,
    torch.int8: torch.int8,
    torch.uint8: torch.uint8,
    torch.bool: torch.uint8,
}
_SENTINEL_BYTE = 0xA5

# Every buffer and each of its two guards holds its own pattern, picked by a tag, so a kernel that
# copies one element past its input into one past its output moves a pattern into a guard that holds
# another (with one pattern for all, that copy left every guard as it was). A float tag varies the
# NaN payload bits below: every pattern stays a NaN that no arithmetic produces, and `poisoned_mask`
# knows them all. The canonical NaNs (CPU 0x7FC00000 family, CUDA all-ones payloads) are left out of
# every family. Integer data keeps the one sentinel (every integer is a legal value, so only the
# sentinel itself may be read as unwritten); integer guards vary it per byte.
_TAG_BITS: dict[torch.dtype, int] = {torch.float64: 0xFFFF, torch.float32: 0xFFFF, torch.float16: 0xFF,
                                     torch.bfloat16: 0x3F}
_TAG_STRIDE = {0xFFFF: 0x1235, 0xFF: 0x35, 0x3F: 0x0B}  # coprime with the field's size - 1: distinct until it wraps

ALIGN = 256  # bytes; what cudaMalloc guarantees and vectorized kernels may assume
GUARD_BYTES = 4096  # default guard size: catches off-by-a-row overruns of small rows, not only off-by-one

# Elements per comparison chunk: small on the CPU so the float64 temporaries stay in cache,
# large on the GPU so launches, not bandwidth, stay the minor cost.
_CHUNK = {"cpu": 1 << 16}
_CHUNK_DEFAULT = 1 << 24


def _bits_spec(dtype: torch.dtype) -> tuple[torch.dtype, int]:
    """The integer dtype a tensor is viewed as for bitwise work, and its poison value in that view."""
    if dtype in _FLOAT_POISON:
        return _FLOAT_POISON[dtype]
    if dtype in _INT_BITS:
        bits = _INT_BITS[dtype]
        size = torch.empty((), dtype=bits).element_size()
        signed = bits is not torch.uint8
        return bits, int.from_bytes(bytes([_SENTINEL_BYTE]) * size, "little", signed=signed)
    supported = ", ".join(str(d).removeprefix("torch.") for d in (*_FLOAT_POISON, *_INT_BITS))
    raise TypeError(f"dtype {dtype} is not supported (supported: {supported})")


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(_bits_spec(tensor.dtype)[0])


def _vary(value: int, field: int, tag: int) -> int:
    """The tag-th value in 1 .. field - 1 after `value` (tag 0: `value` itself); distinct for
    field - 1 tags in a row, and neighbours differ in every byte of the field."""
    return 1 + (value - 1 + tag * _TAG_STRIDE[field]) % (field - 1)


def poison_pattern(dtype: torch.dtype, tag: int = 0) -> int:
    """The bits of poison pattern `tag` of `dtype` (tag 0: the canonical pattern), in the integer view
    `_bits_spec` gives."""
    bits, canonical = _bits_spec(dtype)
    if tag < 0:
        raise ValueError(f"a poison tag is a count from 0, not {tag}")
    if dtype in _TAG_BITS:
        field = _TAG_BITS[dtype]
        return canonical & ~field | _vary(canonical & field, field, tag)
    size = torch.empty((), dtype=bits).element_size()
    byte = _vary(_SENTINEL_BYTE, 0xFF, tag)
    return int.from_bytes(bytes([byte]) * size, "little", signed=bits is not torch.uint8)


def poison_tags(dtype: torch.dtype) -> int:
    """How many distinct patterns `dtype` has: tags further apart than this may repeat one."""
    _bits_spec(dtype)
    return _TAG_BITS.get(dtype, 0xFF) - 1


def poison_(tensor: torch.Tensor, tag: int = 0) -> torch.Tensor:
    """Fill `tensor` in place with poison pattern `tag` of its dtype; returns it."""
    bits, _ = _bits_spec(tensor.dtype)
    tensor.view(bits).fill_(poison_pattern(tensor.dtype, tag))
    return tensor


def poisoned_mask(tensor: torch.Tensor) -> torch.Tensor:
    """True where an element still holds a poison pattern, bit for bit: any tag's for floats (no
    arithmetic makes those NaNs), the canonical sentinel for integers."""
    bits, pattern = _bits_spec(tensor.dtype)
    field = _TAG_BITS.get(tensor.dtype)
    if field is None:
        return tensor.view(bits) == pattern
    view = tensor.view(bits)
    low = view & field
    return ((view & ~field) == (pattern & ~field)) & (low != 0) & (low != field)


class GuardedBuffer:
    """`numel` elements with poisoned guard regions on both sides, to catch out-of-bounds writes.

    The data starts 256-byte aligned (the raw allocation is over-sized and skewed: the CPU
    allocator only promises 64) and begins poisoned. The after-guard starts at the byte right
    after the last element, so an off-by-one write lands in it. For inputs the guards are what an
    out-of-bounds read pulls in: NaN for floats. Buffer number `index` of a case holds patterns
    3 * index (data), 3 * index + 1 and 3 * index + 2 (the guards before and after): distinct from
    every other buffer's of its dtype while the case has fewer than poison_tags(dtype) / 3 of them.
    """

    def __init__(self, shape: Sequence[int], dtype: torch.dtype, device: str | torch.device = "cpu",
                 guard_bytes: int = GUARD_BYTES, index: int = 0):
        if guard_bytes < ALIGN or guard_bytes % ALIGN:
            raise ValueError(f"guard_bytes must be a positive multiple of {ALIGN}, got {guard_bytes}")
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.guard_bytes = guard_bytes
        self.numel = math.prod(self.shape)
        data_bytes = self.numel * dtype.itemsize
        self._raw = torch.empty(guard_bytes + data_bytes + guard_bytes + ALIGN - 1, dtype=torch.uint8, device=device)
        skew = -self._raw.data_ptr() % ALIGN
        start = skew + guard_bytes
        end = start + data_bytes
        self._before = self._raw[skew:start]
        self._after = self._raw[end:end + guard_bytes]
        self.data = self._raw[start:end].view(dtype).view(self.shape)
        self.data_tag = 3 * index if dtype in _TAG_BITS else 0
        poison_(self._before.view(dtype), 3 * index + 1)
        poison_(self._after.view(dtype), 3 * index + 2)
        self.poison()
        self._patterns = (self._before.clone(), self._after.clone())

    def poison(self) -> None:
        """Poison the data with this buffer's own pattern (before every run of a plan)."""
        poison_(self.data, self.data_tag)

    def data_ptr(self) -> int:
        return self.data.data_ptr()

    def damaged_guard_bytes(self) -> tuple[int, int]:
        """Bytes of the (before, after) guards that no longer hold their patterns."""
        before, after = self._patterns
        return (int((self._before != before).sum()), int((self._after != after).sum()))

    def guards_intact(self) -> bool:
        return self.damaged_guard_bytes() == (0, 0)


def guarded_empty(shape: Sequence[int], dtype: torch.dtype, device: str | torch.device = "cpu",
                  index: int = 0) -> GuardedBuffer:
    """An output buffer: guarded, data poisoned (buffer `index` of its case: its own patterns)."""
    return GuardedBuffer(shape, dtype, device, index=index)


def guarded_like(tensor: torch.Tensor, index: int = 0) -> GuardedBuffer:
    """An input buffer: guarded, holding a contiguous copy of `tensor`'s values."""
    buffer = GuardedBuffer(tensor.shape, tensor.dtype, tensor.device, index=index)
    buffer.data.copy_(tensor)
    return buffer


def _json_float(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no inf or NaN


@dataclass(frozen=True)
class Comparison:
    """One output checked against its reference."""

    name: str
    passed: bool
    reason: Reason | None
    message: str
    numel: int
    bad_count: int  # elements outside tolerance, unwritten and non-finite ones included
    unwritten: int  # elements still holding poison
    nonfinite: int  # NaN/Inf where the reference is finite (poison not counted)
    max_abs_err: float  # inf when any element is unwritten, or non-finite against a finite reference
    rel_l2: float  # ||got - expected|| / ||expected||, over the reference's finite elements
    worst_index: tuple[int, ...] | None  # the worst failing element, or the worst element if none fails

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "reason": self.reason.value if self.reason else None,
            "message": self.message,
            "numel": self.numel,
            "bad_count": self.bad_count,
            "unwritten": self.unwritten,
            "nonfinite": self.nonfinite,
            "max_abs_err": _json_float(self.max_abs_err),
            "rel_l2": _json_float(self.rel_l2),
            "worst_index": list(self.worst_index) if self.worst_index is not None else None,
        }


class _Tally:
    """Running totals over the chunks of one comparison (flat indices)."""

    def __init__(self) -> None:
        self.unwritten = self.nonfinite = self.bad = 0
        self.first_unwritten = self.first_nonfinite = -1
        self.err_sq = self.ref_sq = 0.0
        self.max_err, self.max_err_at = -1.0, -1
        self.max_bad_err, self.max_bad_at = -1.0, -1

    def add(self, offset: int, got: torch.Tensor, expected: torch.Tensor, tol: Tolerance) -> None:
        g64, e64 = got.double(), expected.double()
        err = (g64 - e64).abs_()
        if expected.dtype.is_floating_point:
            bad = err > e64.abs().mul_(tol.rtol).add_(tol.atol)
            odd = ~(err < math.inf)  # NaN or Inf somewhere: rare, settled element by element below
        else:
            bad = _bits(got) != _bits(expected)
            odd = bad  # only a mismatch can be unwritten: the sentinel is a legal integer
        ref = e64
        if odd.any():
            at = odd.nonzero().squeeze(1)
            gs, es = g64[at], e64[at]
            poisoned = poisoned_mask(got)[at]  # the mask of the bits: indexing a bool first normalizes it
            if expected.dtype.is_floating_point:
                # NaN where the reference has NaN, or the same Inf, matches; poison never does.
                same = ((gs == es) | (gs.isnan() & es.isnan())) & ~poisoned
                err[at] = torch.full_like(gs, math.inf).masked_fill_(same, 0.0)
                bad[at] = ~same
                nonfinite = ~gs.isfinite() & es.isfinite() & ~poisoned
                self.nonfinite, self.first_nonfinite = self._count(nonfinite, at, offset, self.nonfinite,
                                                                   self.first_nonfinite)
                if not es.isfinite().all():
                    ref = torch.where(e64.isfinite(), e64, 0.0)
            self.unwritten, self.first_unwritten = self._count(poisoned, at, offset, self.unwritten,
                                                               self.first_unwritten)
        self.err_sq += float(torch.dot(err, err))
        self.ref_sq += float(torch.dot(ref, ref))
        top, top_at = err.max(0)
        if float(top) > self.max_err:
            self.max_err, self.max_err_at = float(top), offset + int(top_at)
        n_bad = int(bad.sum())
        if n_bad:
            self.bad += n_bad
            top, top_at = torch.where(bad, err, -1.0).max(0)
            if float(top) > self.max_bad_err:
                self.max_bad_err, self.max_bad_at = float(top), offset + int(top_at)

    @staticmethod
    def _count(mask: torch.Tensor, at: torch.Tensor, offset: int, total: int, first: int) -> tuple[int, int]:
        n = int(mask.sum())
        if n and first < 0:
            first = offset + int(at[mask][0])
        return total + n, first

    def rel_l2(self) -> float:
        if self.ref_sq == 0.0:  # an all-zero reference: no scale to be relative to
            return 0.0 if self.err_sq == 0.0 else math.inf
        return math.sqrt(self.err_sq) / math.sqrt(self.ref_sq)


def _unravel(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    index = []
    for dim in reversed(shape):
        flat, i = divmod(flat, dim)
        index.append(i)
    return tuple(reversed(index))


def _show(tensor: torch.Tensor, index: tuple[int, ...], candidate: bool = True) -> str:
    element = tensor[index]
    if candidate and bool(poisoned_mask(element)):
        return "poison (never written)"
    value = element.item()
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def compare(name: str, got: torch.Tensor, expected: torch.Tensor, tol: Tolerance) -> Comparison:
    """Check a candidate's output against the reference. Floats: elementwise
    |got - expected| <= atol + rtol * |expected| and relative L2 <= tol.rel_l2; integers and bools
    exactly (tol unused). Reasons by priority: UNWRITTEN_OUTPUT, NAN_OUTPUT, INCORRECT."""
    numel = expected.numel()
    shape = tuple(expected.shape)
    if tuple(got.shape) != shape or got.dtype != expected.dtype:
        got_desc = f"{str(got.dtype).removeprefix('torch.')} {tuple(got.shape)}"
        exp_desc = f"{str(expected.dtype).removeprefix('torch.')} {shape}"
        return Comparison(
            name,
            False,
            Reason.INCORRECT,
            f"output '{name}': got {got_desc}, the reference is {exp_desc}",
            numel,
            numel,
            0,
            0,
            math.inf,
            math.inf,
            None,
        )
    _bits_spec(expected.dtype)  # refuse unsupported dtypes before any work
    g_flat = got.to(expected.device).reshape(-1)
    e_flat = expected.reshape(-1)
    chunk = _CHUNK.get(expected.device.type, _CHUNK_DEFAULT)
    tally = _Tally()
    for start in range(0, numel, chunk):
        tally.add(start, g_flat[start:start + chunk], e_flat[start:start + chunk], tol)
    rel_l2 = tally.rel_l2()
    max_err = max(tally.max_err, 0.0)
    worst_flat = tally.max_bad_at if tally.bad else tally.max_err_at
    worst = _unravel(worst_flat, shape) if worst_flat >= 0 else None
    exact = not expected.dtype.is_floating_point

    if tally.unwritten:
        reason = Reason.UNWRITTEN_OUTPUT
        head = (f"{tally.unwritten} of {numel} elements never written (poison still there), "
                f"first at {_unravel(tally.first_unwritten, shape)}")
    elif tally.nonfinite:
        reason = Reason.NAN_OUTPUT
        at = _unravel(tally.first_nonfinite, shape)
        head = (f"{tally.nonfinite} of {numel} elements are NaN/Inf where the reference is finite, "
                f"first at {at}: got {_show(got, at)}, expected {_show(expected, at, candidate=False)}")
    elif tally.bad:
        reason = Reason.INCORRECT
        limit = "must match exactly" if exact else f"out of tolerance (atol {tol.atol:g}, rtol {tol.rtol:g})"
        head = f"{tally.bad} of {numel} elements {limit}"
    elif not exact and rel_l2 > tol.rel_l2:
        reason = Reason.INCORRECT
        head = f"relative L2 error {rel_l2:.3g} exceeds {tol.rel_l2:g}, though every element is within tolerance"
    else:
        reason = None
        head = f"{numel} elements match"
    detail = f"max abs err {max_err:.3g}, rel L2 {rel_l2:.3g}"
    if worst is not None and reason is not None:
        detail = (
            f"worst at {worst}: got {_show(got, worst)}, expected {_show(expected, worst, candidate=False)}; {detail}"
        )
    return Comparison(name, reason is None, reason, f"output '{name}': {head}; {detail}", numel, tally.bad,
                      tally.unwritten, tally.nonfinite, max_err, rel_l2, worst)


def differing(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many elements of two same-shaped, same-dtype tensors differ in their bits."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"cannot compare bits of {a.dtype} {tuple(a.shape)} and {b.dtype} {tuple(b.shape)}")
    return int((_bits(a) != _bits(b.to(a.device))).sum())


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical (so -0.0 differs from 0.0, and equal NaN payloads match): the determinism check."""
    return a.shape == b.shape and a.dtype == b.dtype and differing(a, b) == 0


def stale_match(got: torch.Tensor, earlier_expected: list[torch.Tensor], tol: Tolerance) -> int | None:
    """The index of an earlier call's reference that `got` passes against: the kernel handed back a
    cached answer. Meaningful when `got` failed against its own reference."""
    for i, expected in enumerate(earlier_expected):
        if expected.shape == got.shape and expected.dtype == got.dtype and compare("", got, expected, tol).passed:
            return i
    return None


def inputs_unchanged(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> list[str]:
    """Names of the inputs whose bits changed (or that vanished) between `before` and `after`."""
    return [name for name, tensor in before.items() if name not in after or not same_bits(tensor, after[name])]
