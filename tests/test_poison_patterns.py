"""Distinct poison for every buffer and each of its guards (issue 29): a kernel that copies one
element past its input into one past its output must damage a guard, and unwritten data is still
recognised whatever pattern its buffer holds. CPU tensors, the runner's own buffers."""

from __future__ import annotations

import pytest
import torch

from klineage.gate import correctness as c
from klineage.gate.runner import CaseBuffers
from klineage.gate.verdict import Reason
from klineage.problem import Tolerance

FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
CANONICAL_NANS = {torch.float32: (0x7FC00000, 0x7FFFFFFF, -0x400000), torch.float16: (0x7E00, 0x7FFF),
                  torch.bfloat16: (0x7FC0, 0x7FFF), torch.float64: (0x7FF8000000000000, 0x7FFFFFFFFFFFFFFF)}


def bits_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(c._bits_spec(tensor.dtype)[0])


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_tag_zero_is_the_canonical_pattern_and_the_next_tags_all_differ(dtype):
    assert c.poison_pattern(dtype, 0) == c._bits_spec(dtype)[1]
    patterns = [c.poison_pattern(dtype, tag) for tag in range(c.poison_tags(dtype))]
    assert len(set(patterns)) == len(patterns) == c.poison_tags(dtype)
    assert c.poison_pattern(dtype, c.poison_tags(dtype)) == patterns[0]  # then it wraps


@pytest.mark.parametrize("dtype", FLOATS)
def test_every_float_pattern_is_a_nan_that_poisoned_mask_knows(dtype):
    tensor = torch.empty(c.poison_tags(dtype), dtype=dtype)
    for tag in range(len(tensor)):
        c.poison_(tensor[tag:tag + 1], tag)
    assert tensor.isnan().all()
    assert c.poisoned_mask(tensor).all()


@pytest.mark.parametrize("dtype", FLOATS)
def test_computed_nans_are_never_poison(dtype):
    computed = torch.tensor([float("nan"), -float("nan")], dtype=dtype)
    assert not c.poisoned_mask(computed).any()
    bits = c._bits_spec(dtype)[0]
    canonical = torch.tensor(CANONICAL_NANS[dtype], dtype=bits).view(dtype)
    assert canonical.isnan().all() and not c.poisoned_mask(canonical).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_neighbouring_tags_differ_in_every_byte_of_their_payload(dtype):
    """A copy of any one byte between neighbouring patterns changes it (bfloat16's payload is 6 bits)."""
    size = torch.empty((), dtype=dtype).element_size()
    for tag in range(50):
        a, b = (c.poison_pattern(dtype, t).to_bytes(size, "little", signed=True) for t in (tag, tag + 1))
        varied = 2 if dtype is not torch.float16 else 1
        assert all(a[i] != b[i] for i in range(varied)), (tag, a.hex(), b.hex())


def test_integer_data_keeps_the_one_sentinel_and_its_guards_vary():
    buffers = [c.guarded_empty((4,), torch.int32, index=i) for i in range(3)]
    assert all(c.poisoned_mask(b.data).all() for b in buffers)  # unwritten integers stay recognisable
    guards = {bytes(b._before.tolist()) for b in buffers} | {bytes(b._after.tolist()) for b in buffers}
    assert len(guards) == 6


def case_buffers(dtype=torch.float32) -> CaseBuffers:
    buffers = CaseBuffers(c, torch, {"y": ((64,), dtype), "stats": ((8,), dtype)},
                          [{"name": "work", "dtype": str(dtype).removeprefix("torch."), "count": 16, "init": "poison"}],
                          device="cpu")
    buffers.load_inputs({"x": torch.randn(64).to(dtype), "w": torch.randn(64).to(dtype)})
    return buffers


def all_buffers(buffers: CaseBuffers) -> dict[str, c.GuardedBuffer]:
    return {**buffers.inputs, **buffers.outputs, **{k: v for k, (v, _) in buffers.scratch.items()}}


@pytest.mark.parametrize("dtype", FLOATS)
def test_every_buffer_and_guard_of_a_case_holds_its_own_pattern(dtype):
    buffers = case_buffers(dtype)
    named = all_buffers(buffers)
    guards = [bytes(g[:8].tolist()) for b in named.values() for g in (b._before, b._after)]
    data = [bytes(b.data.view(torch.uint8)[:8].tolist()) for n, b in named.items() if n not in buffers.inputs]
    assert len(set(guards + data)) == len(guards) + len(data) == 2 * 5 + 3


@pytest.mark.parametrize("dtype", FLOATS + [torch.int32, torch.uint8])
def test_one_element_copied_past_the_input_into_past_the_output_damages_the_output_guard(dtype):
    """The issue's kernel: y[n] = x[n]. With one poison for every guard this moved guard bytes into a
    guard unchanged and nothing saw it."""
    buffers = case_buffers(dtype)
    x, y = buffers.inputs["x"], buffers.outputs["y"]
    y.data.copy_(x.data)
    size = torch.empty((), dtype=dtype).element_size()
    y._after[:size] = x._after[:size]
    assert buffers.damaged_guards() == ["y"]
    assert y.damaged_guard_bytes()[1] > 0


def test_a_copy_before_the_buffers_is_seen_too():
    buffers = case_buffers()
    x, y = buffers.inputs["x"], buffers.outputs["y"]
    y._before[-4:] = x._before[-4:]  # y[-1] = x[-1]
    assert buffers.damaged_guards() == ["y"]


def test_reset_poisons_each_output_with_its_own_pattern_and_unwritten_is_still_unwritten():
    buffers = case_buffers()
    y, stats = buffers.outputs["y"], buffers.outputs["stats"]
    y.data.fill_(1.0)
    buffers.reset()
    assert c.poisoned_mask(y.data).all() and c.poisoned_mask(stats.data).all()
    assert bits_of(y.data)[0] != bits_of(stats.data)[0]
    result = c.compare("y", y.data, torch.ones(64), Tolerance(1e-5, 1e-5, 1e-5))
    assert result.reason is Reason.UNWRITTEN_OUTPUT and result.unwritten == 64


def test_an_input_guard_read_into_the_output_is_nan_not_unwritten_elsewhere():
    """A kernel that reads x[-1] into y[0]: the guard's NaN lands in the output and is caught."""
    buffers = case_buffers()
    x, y = buffers.inputs["x"], buffers.outputs["y"]
    y.data.copy_(x.data)
    y.data.view(torch.uint8)[:4] = x._before[-4:]
    result = c.compare("y", y.data, x.data.clone(), Tolerance(1e-5, 1e-5, 1e-5))
    assert not result.passed and result.reason in (Reason.UNWRITTEN_OUTPUT, Reason.NAN_OUTPUT)
    assert result.bad_count == 1


def test_a_negative_tag_is_refused():
    with pytest.raises(ValueError, match="poison tag"):
        c.poison_pattern(torch.float32, -1)
