"""The gate's correctness machinery on CPU tensors: each exploit from the verification notes is caught."""

import json
import math
import time

import pytest
import torch

from klineage.gate.correctness import (
    ALIGN,
    GuardedBuffer,
    compare,
    differing,
    guarded_empty,
    guarded_like,
    inputs_unchanged,
    poison_,
    poisoned_mask,
    same_bits,
    stale_match,
)
from klineage.gate.verdict import Reason
from klineage.problem import DEFAULT_TOLERANCES, EXACT

FP32 = DEFAULT_TOLERANCES["float32"]
FP16 = DEFAULT_TOLERANCES["float16"]
BF16 = DEFAULT_TOLERANCES["bfloat16"]
FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


def softmax_case(seed=0, rows=64, cols=1000, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen) * scale
    return x, torch.softmax(x, dim=-1)


def at_offset(buffer: GuardedBuffer, offset: int) -> torch.Tensor:
    """The element `offset` places from the data's start, in or out of bounds: what a kernel indexing
    its pointer out of range touches."""
    return torch.as_strided(buffer.data, (1,), (1,), buffer.data.storage_offset() + offset)


# Poison


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_poison_is_a_nan_unlike_computed_nans(dtype):
    t = poison_(torch.empty(5, dtype=dtype))
    assert torch.isnan(t).all()
    assert poisoned_mask(t).all()
    canonical = torch.tensor(float("nan"), dtype=dtype)
    zero_times_inf = torch.tensor(0.0, dtype=dtype) * torch.tensor(float("inf"), dtype=dtype)
    inf_minus_inf = torch.tensor(float("inf"), dtype=dtype) - torch.tensor(float("inf"), dtype=dtype)
    for nan in (canonical, zero_times_inf, inf_minus_inf, -canonical):
        assert torch.isnan(nan)
        assert not poisoned_mask(nan)


def test_poison_survives_copies_and_differs_from_a_nan_fill():
    t = poison_(torch.empty(8, dtype=torch.bfloat16))
    assert poisoned_mask(t.clone()).all()
    assert poisoned_mask(torch.empty_like(t).copy_(t)).all()
    assert not poisoned_mask(torch.full_like(t, float("nan"))).any()


@pytest.mark.parametrize("dtype", INTS)
def test_integer_and_bool_poison_is_a_sentinel(dtype):
    t = poison_(torch.empty(6, dtype=dtype))
    assert poisoned_mask(t).all()
    assert not poisoned_mask(torch.zeros(6, dtype=dtype)).any()
    assert not poisoned_mask(torch.ones(6, dtype=dtype)).any()


def test_poisoned_mask_is_elementwise_and_keeps_shape():
    t = poison_(torch.empty(3, 4))
    t[1, 2] = 0.5
    mask = poisoned_mask(t)
    assert mask.shape == (3, 4)
    assert int(mask.sum()) == 11 and not mask[1, 2]


def test_unsupported_dtype_is_refused_clearly():
    with pytest.raises(TypeError, match="complex64 is not supported"):
        poison_(torch.empty(2, dtype=torch.complex64))


# Guarded buffers


@pytest.mark.parametrize("dtype", (*FLOATS, *INTS))
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (33, 17, 3)])
def test_guarded_data_is_256_byte_aligned_and_exactly_sized(dtype, shape):
    buf = guarded_empty(shape, dtype, "cpu")
    assert buf.data_ptr() % ALIGN == 0
    assert buf.data.shape == shape and buf.data.dtype == dtype and buf.data.is_contiguous()
    assert buf.numel == math.prod(shape)
    assert poisoned_mask(buf.data).all()
    assert buf.guards_intact()


@pytest.mark.parametrize("guard_bytes", [256, 1024])
def test_guard_sizes_are_whole_alignment_units(guard_bytes):
    buf = GuardedBuffer((5,), torch.float32, guard_bytes=guard_bytes)
    first_guard = at_offset(buf, -guard_bytes // 4)
    last_guard = at_offset(buf, 5 + guard_bytes // 4 - 1)
    assert poisoned_mask(first_guard).all() and poisoned_mask(last_guard).all()
    assert buf.guards_intact()
    for bad in (0, 100, 300):
        with pytest.raises(ValueError, match="multiple of 256"):
            GuardedBuffer((5,), torch.float32, guard_bytes=bad)


def test_writing_only_inside_the_data_leaves_guards_intact():
    buf = guarded_empty((4, 9), torch.float16)
    buf.data.fill_(1.0)
    assert buf.guards_intact()
    assert buf.damaged_guard_bytes() == (0, 0)


def test_guard_damage_before_the_data_is_detected():
    buf = guarded_empty((10,), torch.float32)
    at_offset(buf, -1).fill_(0.0)  # data[-1]: the classic underflow
    assert not buf.guards_intact()
    assert buf.damaged_guard_bytes() == (4, 0)


def test_guard_damage_after_the_data_is_detected_at_off_by_one_and_far_end():
    buf = GuardedBuffer((3, 3), torch.float32, guard_bytes=512)
    at_offset(buf, 9).fill_(1.0)  # data[numel]: off by one
    assert buf.damaged_guard_bytes() == (0, 4)
    at_offset(buf, 9 + 512 // 4 - 1).fill_(2.0)  # the guard's last element
    assert buf.damaged_guard_bytes() == (0, 8)
    assert not buf.guards_intact()


def test_guard_damage_on_a_bool_buffer_counts_bytes():
    buf = guarded_empty((5,), torch.bool)
    at_offset(buf, 5).fill_(True)
    at_offset(buf, 6).fill_(False)
    at_offset(buf, -3).fill_(True)
    assert buf.damaged_guard_bytes() == (1, 2)


def test_guarded_inputs_copy_values_and_read_nan_out_of_bounds():
    x = torch.randn(6, 7)
    buf = guarded_like(x.t())  # non-contiguous source: the copy is contiguous with the same values
    assert torch.equal(buf.data, x.t())
    assert buf.data.is_contiguous() and buf.data_ptr() % ALIGN == 0
    assert torch.isnan(at_offset(buf, -1)).all() and torch.isnan(at_offset(buf, 42)).all()
    assert buf.guards_intact()


# Comparison


def test_a_correct_result_passes():
    x, ref = softmax_case()
    got = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    got = got / got.sum(dim=-1, keepdim=True)
    c = compare("y", got, ref, FP32)
    assert c.passed and c.reason is None
    assert c.bad_count == c.unwritten == c.nonfinite == 0
    assert c.numel == ref.numel() and c.max_abs_err < 1e-6 and c.rel_l2 < 1e-6
    assert c.message.startswith("output 'y': 64000 elements match")


def test_zeros_against_softmax_are_incorrect():
    _, ref = softmax_case()
    c = compare("probs", torch.zeros_like(ref), ref, FP32)
    assert not c.passed and c.reason is Reason.INCORRECT
    bad = int((ref.double() > FP32.atol + FP32.rtol * ref.double()).sum())
    assert 63000 < bad < 64000 and c.bad_count == bad  # the softmax's far tail is below atol
    assert c.rel_l2 == pytest.approx(1.0)
    worst = ref.argmax().item()
    assert c.worst_index == (worst // 1000, worst % 1000)
    assert c.max_abs_err == pytest.approx(ref.max().item())
    assert "output 'probs'" in c.message and f"{bad} of 64000 elements out of tolerance" in c.message
    assert f"worst at {c.worst_index}: got 0, expected {ref.max().item():.6g}" in c.message
    assert "max abs err" in c.message and "rel L2 1" in c.message


def test_zeros_within_a_loose_atol_are_still_caught_by_relative_l2():
    _, ref = softmax_case(scale=0.5)  # a flat softmax over 1000 columns: every value below bf16's atol
    assert ref.max() < BF16.atol
    c = compare("probs", torch.zeros_like(ref), ref, BF16)
    assert c.reason is Reason.INCORRECT
    assert c.bad_count == 0
    assert "relative L2 error 1 exceeds 0.01" in c.message


def test_untouched_poison_is_unwritten_output():
    _, ref = softmax_case()
    out = guarded_empty(ref.shape, ref.dtype)
    c = compare("y", out.data, ref, FP32)
    assert c.reason is Reason.UNWRITTEN_OUTPUT
    assert c.unwritten == ref.numel() == c.bad_count
    assert c.nonfinite == 0
    assert c.max_abs_err == math.inf and c.rel_l2 == math.inf
    assert "64000 of 64000 elements never written" in c.message and "first at (0, 0)" in c.message
    assert "got poison (never written)" in c.message


def test_first_row_only_is_unwritten_with_the_exact_count():
    _, ref = softmax_case(rows=37, cols=129)
    out = poison_(torch.empty_like(ref))
    out[0] = ref[0]  # the "147x" kernel: threads launched for the first row only
    c = compare("y", out, ref, FP32)
    assert c.reason is Reason.UNWRITTEN_OUTPUT
    assert c.unwritten == 36 * 129
    assert "4644 of 4773 elements never written" in c.message and "first at (1, 0)" in c.message


def test_unwritten_outranks_computed_nan_and_wrong_values():
    _, ref = softmax_case(rows=4, cols=8)
    out = ref.clone()
    poison_(out[3, 7:])
    out[0, 0] = float("nan")
    out[1, 1] = 5.0
    c = compare("y", out, ref, FP32)
    assert c.reason is Reason.UNWRITTEN_OUTPUT
    assert (c.unwritten, c.nonfinite, c.bad_count) == (1, 1, 3)
    assert "first at (3, 7)" in c.message


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_computed_nan_or_inf_is_nan_output(bad):
    _, ref = softmax_case(rows=8, cols=16)
    got = ref.clone()
    got[2, 5] = bad
    got[6, 1] = torch.tensor(0.0) * torch.tensor(float("inf"))
    c = compare("y", got, ref, FP32)
    assert c.reason is Reason.NAN_OUTPUT
    assert (c.nonfinite, c.unwritten, c.bad_count) == (2, 0, 2)
    assert c.max_abs_err == math.inf
    assert "2 of 128 elements are NaN/Inf where the reference is finite, first at (2, 5)" in c.message
    assert "got poison" not in c.message


def test_nan_where_the_reference_has_nan_matches_but_poison_never_does():
    ref = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0])
    got = ref.clone()
    got[1] = torch.tensor(0.0) * torch.tensor(float("inf"))  # a different NaN payload still matches
    c = compare("y", got, ref, FP32)
    assert c.passed, c.message
    assert c.max_abs_err == 0.0 and c.rel_l2 == 0.0
    poison_(got[1:2])
    c = compare("y", got, ref, FP32)
    assert c.reason is Reason.UNWRITTEN_OUTPUT and c.unwritten == 1 and c.bad_count == 1
    assert "first at (1,)" in c.message


def test_wrong_infinities_are_incorrect():
    ref = torch.tensor([1.0, float("inf"), 3.0])
    c = compare("y", torch.tensor([1.0, 1e30, 3.0]), ref, FP32)
    assert c.reason is Reason.INCORRECT and c.bad_count == 1 and c.worst_index == (1,)
    c = compare("y", torch.tensor([1.0, -float("inf"), 3.0]), ref, FP32)
    assert c.reason is Reason.INCORRECT and c.bad_count == 1


def test_fp16_rounding_fails_fp32_tolerance_and_passes_fp16_tolerance():
    ref, _ = softmax_case()  # values of order one, where fp16's 2**-11 rounding exceeds fp32's rtol
    got = ref.half().float()  # a kernel that quietly computes in half precision
    strict = compare("y", got, ref, FP32)
    assert strict.reason is Reason.INCORRECT and strict.bad_count > 0
    assert 1e-5 < strict.rel_l2 < 5e-3
    assert compare("y", got, ref, FP16).passed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_outputs_poison_and_compare(dtype):
    _, ref32 = softmax_case(rows=16, cols=64)
    ref = ref32.to(dtype)
    tol = BF16 if dtype is torch.bfloat16 else FP16
    out = guarded_empty(ref.shape, dtype)
    assert compare("y", out.data, ref, tol).reason is Reason.UNWRITTEN_OUTPUT
    out.data[:8] = ref[:8]
    c = compare("y", out.data, ref, tol)
    assert c.reason is Reason.UNWRITTEN_OUTPUT and c.unwritten == 8 * 64
    out.data.copy_(ref)
    assert compare("y", out.data, ref, tol).passed
    out.data[3, 3] = float("nan")
    assert compare("y", out.data, ref, tol).reason is Reason.NAN_OUTPUT


def test_integers_compare_exactly():
    ref = torch.arange(-50, 50, dtype=torch.int32).reshape(10, 10)
    got = ref.clone()
    got[4, 6] += 1
    c = compare("idx", got, ref, FP32)  # tolerance is ignored for integers
    assert c.reason is Reason.INCORRECT and c.bad_count == 1 and c.worst_index == (4, 6)
    assert "1 of 100 elements must match exactly" in c.message and "got -3, expected -4" in c.message
    assert compare("idx", ref.clone(), ref, EXACT).passed


def test_integer_poison_is_unwritten_unless_it_is_the_right_answer():
    ref = torch.zeros(4, 4, dtype=torch.int64)
    out = poison_(torch.empty_like(ref))
    c = compare("idx", out, ref, EXACT)
    assert c.reason is Reason.UNWRITTEN_OUTPUT and c.unwritten == 16
    sentinel = out[0, 0].item()
    ref[0, 0] = sentinel  # the sentinel is a legal int64: where it is the answer, it cannot be told apart
    out[1:] = 0
    c = compare("idx", out, ref, EXACT)
    assert c.reason is Reason.UNWRITTEN_OUTPUT and c.unwritten == 3


def test_bool_poison_is_never_a_valid_answer():
    ref = torch.tensor([True, False, True, False])
    out = poison_(torch.empty_like(ref))
    out[:2] = ref[:2]
    c = compare("mask", out, ref, EXACT)
    assert c.reason is Reason.UNWRITTEN_OUTPUT and c.unwritten == 2
    assert "first at (2,)" in c.message
    out[2:] = ref[2:]
    assert compare("mask", out, ref, EXACT).passed
    out[3] = True
    assert compare("mask", out, ref, EXACT).reason is Reason.INCORRECT


def test_shape_and_dtype_mismatches_are_incorrect():
    _, ref = softmax_case(rows=4, cols=6)
    c = compare("y", ref[:, :5], ref, FP32)
    assert c.reason is Reason.INCORRECT and c.bad_count == 24
    assert c.message == "output 'y': got float32 (4, 5), the reference is float32 (4, 6)"
    c = compare("y", ref.half(), ref, FP32)
    assert c.reason is Reason.INCORRECT
    assert "got float16 (4, 6), the reference is float32 (4, 6)" in c.message


def test_indices_are_exact_far_into_a_large_output():
    _, ref = softmax_case(rows=300, cols=1000)  # large enough to be compared in several chunks
    got = ref.clone()
    got[250, 7] *= 1 + 1e-5  # within tolerance: still the worst element
    c = compare("y", got, ref, FP32)
    assert c.passed and c.worst_index == (250, 7)
    got[250, 7] += 0.5
    got[280, 3] += 0.25
    c = compare("y", got, ref, FP32)
    assert c.reason is Reason.INCORRECT and c.bad_count == 2 and c.worst_index == (250, 7)
    poison_(got[299, 990:])
    got[123, 456] = float("nan")
    c = compare("y", got, ref, FP32)
    assert c.reason is Reason.UNWRITTEN_OUTPUT and c.unwritten == 10 and "first at (299, 990)" in c.message
    poison_(got[299, 990:]).copy_(ref[299, 990:])
    c = compare("y", got, ref, FP32)
    assert c.reason is Reason.NAN_OUTPUT and "first at (123, 456)" in c.message


def test_non_contiguous_outputs_report_indices_in_their_own_shape():
    _, ref = softmax_case(rows=6, cols=5)
    got = ref.t().contiguous().t()  # same values, column-major layout
    got[4, 1] += 1.0
    c = compare("y", got, ref, FP32)
    assert c.reason is Reason.INCORRECT and c.worst_index == (4, 1)


def test_comparison_to_dict_is_strict_json():
    _, ref = softmax_case(rows=2, cols=3)
    c = compare("y", poison_(torch.empty_like(ref)), ref, FP32)
    data = json.loads(json.dumps(c.to_dict(), allow_nan=False))
    assert data["reason"] == "unwritten_output" and data["max_abs_err"] is None
    assert data["worst_index"] == [0, 0] and data["unwritten"] == 6
    ok = compare("y", ref.clone(), ref, FP32).to_dict()
    assert ok["passed"] and ok["reason"] is None and ok["rel_l2"] == 0.0


def test_a_16m_element_compare_is_fast_on_cpu():
    gen = torch.Generator().manual_seed(1)
    ref = torch.rand(4096, 4096, generator=gen)
    got = ref * (1 + 1e-6 * torch.randn(4096, 4096, generator=gen))
    best = math.inf
    for _ in range(2):  # best of two: a loaded machine should not fail the test
        start = time.perf_counter()
        c = compare("y", got, ref, FP32)
        best = min(best, time.perf_counter() - start)
    assert c.passed, c.message
    # A gate compares tens of outputs per kernel: seconds per compare would dominate it. The bound
    # leaves room for a loaded 2-core CI machine (0.3 s measured idle, 2.9 s under 6x load).
    assert best < 6.0


# Determinism, stale answers, modified inputs


def test_same_bits_detects_nondeterminism():
    _, first = softmax_case()
    second = first.clone()
    assert same_bits(first, second) and differing(first, second) == 0
    second[10, 20] = torch.nextafter(second[10, 20], torch.tensor(1.0))  # one ulp: a reordered reduction
    second[0, 0] = first[0, 0] * (1 + 2**-20)
    assert not same_bits(first, second) and differing(first, second) == 2


def test_same_bits_is_bitwise_for_zeros_and_nans():
    assert not same_bits(torch.tensor([0.0]), torch.tensor([-0.0]))
    nan = torch.tensor([float("nan")])
    assert same_bits(nan, nan.clone())
    assert not same_bits(nan, torch.tensor(0.0) * torch.tensor([float("inf")]))
    assert not same_bits(torch.zeros(3), torch.zeros(4))
    assert not same_bits(torch.zeros(3), torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="cannot compare bits"):
        differing(torch.zeros(3), torch.zeros(4))


def test_a_cached_answer_from_an_earlier_call_is_a_stale_match():
    refs = [softmax_case(seed=s)[1] for s in range(3)]
    current = softmax_case(seed=3)[1]
    cached = refs[1].clone()  # the kernel returned what it computed on the second call
    assert not compare("y", cached, current, FP32).passed
    assert stale_match(cached, refs, FP32) == 1
    assert stale_match(current.clone(), refs, FP32) is None
    assert stale_match(torch.zeros_like(current), refs, FP32) is None
    assert stale_match(cached[:, :10], refs, FP32) is None  # other shapes are skipped, not errors


def test_modified_inputs_are_named():
    inputs = {"x": torch.randn(8, 8), "w": torch.randn(8), "idx": torch.arange(8)}
    before = {k: v.clone() for k, v in inputs.items()}
    assert inputs_unchanged(before, inputs) == []
    inputs["w"].zero_()  # so a reference that runs second sees other data
    inputs["idx"][3] = 0
    assert inputs_unchanged(before, inputs) == ["w", "idx"]
    sign_flip = {k: v.clone() for k, v in before.items()}
    sign_flip["x"][0, 0] = -sign_flip["x"][0, 0]
    assert inputs_unchanged(before, sign_flip) == ["x"]
    assert inputs_unchanged(before, {"x": before["x"]}) == ["w", "idx"]
