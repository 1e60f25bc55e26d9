"""shuffle_to_shared: warp-shuffle reductions (and scans) become the same exchanges through a per-warp
shared scratch row with __syncwarp.

A Python model of the warp reductions (xor butterfly: every lane gets the result; down-shift tree:
lane 0 does) gives each lane's expected value; the original and the rewritten CUDA run on the warp
interpreter of test_scalarize_ldmatrix.py (several warps at once, with its race check on the scratch
slots) and must both give exactly the model's per-lane values, for sum and max, xor and down.
"""

from __future__ import annotations

import numpy as np
import pytest

from klineage.corpus import kernel_entry
from klineage.features import cuda_parser as cp
from klineage.features.sass import sass_features
from klineage.features.source import source_features
from klineage.gate.compile import compile_kernel
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from sampled import sampled
from tests.transforms.golden import HERE, check_golden, load
from tests.transforms.test_scalarize_ldmatrix import RaceError, Warp, function_body

CASES = {"xor_loop": "warp_sum", "down_braceless": "warp_max_to_lane0", "unrolled": "warp_sum_int",
         "same_line": "warp_max", "argmax": "warp_argmax"}
INTERPRETED = {"xor_loop": ("sum", "xor"), "down_braceless": ("max", "down"), "unrolled": ("sum", "xor"),
               "same_line": ("max", "xor_up")}
PLAN = 'name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = [1]\nblock = [128]\n'


# -- the model ---------------------------------------------------------------------------------------


def combine(op: str, a, b):
    return a + b if op == "sum" else max(a, b)


def model(values: list, op: str, variant: str) -> list:
    """Each lane's value after the warp reduction, exchanges as the shuffles define them."""
    v = list(values)
    offsets = [1, 2, 4, 8, 16] if variant == "xor_up" else [16, 8, 4, 2, 1]
    for offset in offsets:
        if variant == "down":
            other = [v[lane + offset] if lane + offset < 32 else v[lane] for lane in range(32)]
        else:
            other = [v[lane ^ offset] for lane in range(32)]
        v = [combine(op, v[lane], other[lane]) for lane in range(32)]
    return v


def test_model_broadcast_semantics():
    rng = np.random.default_rng(0)
    for op in ("sum", "max"):
        values = [np.float32(x) for x in rng.integers(-1000, 1000, 32)]
        total = sum(int(x) for x in values) if op == "sum" else max(values)
        assert all(v == total for v in model(values, op, "xor"))  # every lane has the result
        assert all(v == total for v in model(values, op, "xor_up"))
        down = model(values, op, "down")
        assert down[0] == total  # lane 0 has it ...
        if op == "sum":
            assert down[31] == values[31] * 32  # ... lane 31 only ever combined its own value


# -- running the code --------------------------------------------------------------------------------


def run(source: str, helper: str, values: list, warps: int = 4) -> tuple[list, Warp]:
    parsed, body = function_body(source, helper)
    warp = Warp(parsed, warps=warps)
    ctype = "int" if isinstance(values[0], int) else "float"
    warp.bind("v", values, ctype)
    return warp.run(body), warp


def lane_values(kind: str, warps: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    if kind == "int":
        return [int(x) for x in rng.integers(-10 ** 6, 10 ** 6, 32 * warps)]
    return [np.float32(x) for x in rng.standard_normal(32 * warps) * 100]


def check_against_model(before: str, after: str, helper: str, op: str, variant: str, kind: str, seed: int) -> Warp:
    warps = 4
    values = lane_values(kind, warps, seed)
    got_before, _ = run(before, helper, values, warps)
    got_after, warp = run(after, helper, values, warps)
    for w in range(warps):
        expect = model(values[32 * w:32 * w + 32], op, variant)
        assert [x.tobytes() if kind == "float" else x for x in got_after[32 * w:32 * w + 32]] == \
            [np.float32(x).tobytes() if kind == "float" else x for x in expect]
    assert [repr(x) for x in got_before] == [repr(x) for x in got_after]  # bit for bit, every lane
    return warp


# -- tests ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def transform():
    return get("shuffle_to_shared")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "shuffle_to_shared" / case, which, "kernel")


def compile_ok(state: KernelState, cache):
    result = compile_kernel(state, cache)
    assert result.ok, result.log[-3000:]
    return result


def test_catalog_entry(transform):
    described = transform.describe()
    assert described["removes"] == ["shfl"] and described["adds"] == ["shared_array", "syncwarp", "sts", "lds"]
    assert described["after"] == [] and described["has_forward"]


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("shuffle_to_shared", case)


# a one-type and a two-type (argmax) scratch by default; the other shuffle spellings: -m slow
@pytest.mark.parametrize("case", sampled(CASES, keep=("xor_loop", "argmax")))
def test_golden_kernels_compile_and_lose_shfl(case, cache):
    helper = CASES[case]
    before, after = compile_ok(golden(case, "before"), cache), compile_ok(golden(case, "after"), cache)
    assert sass_features(before.cubin_bytes()).count("shfl", "kernel") >= 5
    sass = sass_features(after.cubin_bytes())
    assert sass.count("shfl", "kernel") == 0 and sass.count("sts", "kernel") >= 5 and sass.count("lds", "kernel") >= 5
    resources = after.resources_for("kernel")
    assert not resources.spills
    types = 2 if case == "argmax" else 1
    assert resources.shared_bytes == types * 32 * 32 * 4  # one 32 x 32 scratch per shuffled type
    features = {(f.locus, f.name) for f in source_features(golden(case, "after").source)}
    assert (helper, "shfl") not in features
    assert {(helper, "shared_array"), (helper, "syncwarp")} <= features


def test_anchors(transform):
    assert transform.find(golden("xor_loop", "before")) == [Anchor("warp_sum", "loop", "shuffle#0")]
    assert transform.find(golden("unrolled", "before")) == [Anchor("warp_sum_int", "statements", "shuffle#0")]
    for case in CASES:
        assert transform.find(golden(case, "after")) == []


@pytest.mark.parametrize("case", INTERPRETED)
@pytest.mark.parametrize("seed", range(3))
def test_golden_reductions_match_the_model_on_every_lane(case, seed):
    op, variant = INTERPRETED[case]
    kind = "int" if case == "unrolled" else "float"
    warp = check_against_model(golden(case, "before").source, golden(case, "after").source, CASES[case], op,
                               variant, kind, seed)
    assert warp.syncs == 2 * 5 and warp.shuffles == 0


_TEMPLATE = """__device__ float reduce(float v)
{{
    for (int offset = {start}; {condition}; {step}) {{
        {statement}
    }}
    return v;
}}
extern "C" __global__ void kernel() {{}}
"""


@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("variant", ["xor", "xor_up", "down"])
def test_every_reduction_form_matches_the_model(transform, op, variant):
    """Sum and max, xor butterfly (both offset orders) and down-shift tree: generated, rewritten,
    both run on 4 warps, both exactly the model on every lane."""
    call = f"__shfl_{'down' if variant == 'down' else 'xor'}_sync(0xffffffffu, v, offset)"
    statement = f"v += {call};" if op == "sum" else f"v = fmaxf(v, {call});"
    loop = ("1", "offset < 32", "offset <<= 1") if variant == "xor_up" else ("16", "offset > 0", "offset >>= 1")
    source = _TEMPLATE.format(start=loop[0], condition=loop[1], step=loop[2], statement=statement)
    state = KernelState(source=source, plan=LaunchPlan.from_toml(PLAN))
    (anchor,) = transform.find(state)
    after = transform.backward(state, anchor).state
    assert transform.forward(after, anchor).state.source == source
    for seed in range(2):
        check_against_model(source, after.source, "reduce", op, variant, "float", seed)


def test_the_syncwarps_are_needed():
    """The race check sees a missing __syncwarp: without the one after the read a lane could overwrite
    a slot its partner has not read yet; without the one after the write it could read too early."""
    after = golden("xor_loop", "after").source
    values = lane_values("float", 1, 0)
    lines = after.splitlines()
    syncs = [i for i, line in enumerate(lines) if "__syncwarp" in line]
    for drop in syncs:
        broken = "\n".join(line for i, line in enumerate(lines) if i != drop)
        with pytest.raises(RaceError, match="without a __syncwarp"):
            run(broken, "warp_sum", values, warps=1)


def test_warps_use_separate_rows():
    broken = golden("xor_loop", "after").source.replace("shfl_scratch0[threadIdx.x >> 5]", "shfl_scratch0[0]")
    with pytest.raises(RaceError, match="share a scratch slot"):
        run(broken, "warp_sum", lane_values("float", 2, 0), warps=2)


def test_two_dimensional_blocks_index_rows_by_linear_warp(transform):
    plan = LaunchPlan.from_toml(PLAN.replace("block = [128]", "block = [16, 8]"))
    state = KernelState(source=golden("xor_loop", "before").source, plan=plan)
    after = transform.backward(state, transform.find(state)[0]).state
    assert "shfl_scratch0[((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x) >> 5]" in after.source
    values = lane_values("float", 4, 1)
    parsed, body = function_body(after.source, "warp_sum")
    warp = Warp(parsed, warps=4, block=(16, 8, 1))
    warp.bind("v", values, "float")
    got = warp.run(body)
    for w in range(4):
        assert [x.tobytes() for x in got[32 * w:32 * w + 32]] == \
            [np.float32(x).tobytes() for x in model(values[32 * w:32 * w + 32], "sum", "xor")]


def _state(body: str, params: str = "float v, int o") -> KernelState:
    source = (f"__device__ float f({params})\n{{\n{body}\n    return v;\n}}\n"
              "extern \"C\" __global__ void kernel() {}\n")
    return KernelState(source=source, plan=LaunchPlan.from_toml(PLAN))


@pytest.mark.parametrize("body, message", [
    ("    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset, 16);",
     "width argument"),
    ("    for (int offset = 16; offset > 0; offset >>= 1) {\n        if (o) v += __shfl_xor_sync(0xffffffffu, v, "
     "offset);\n    }", "not a statement of the loop body itself"),
    ("    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v * 2.0f, offset);",
     "only a named variable"),
    ("    for (int offset = 16; offset > 0; offset >>= 1) v = __shfl_xor_sync(0xffffffffu, v, offset) + "
     "__shfl_xor_sync(0xffffffffu, v, offset);", "several shuffles"),
    ("    const int shfl_lane0 = 3;\n    for (int offset = 16; offset > 0; offset >>= 1) v += "
     "__shfl_xor_sync(0xffffffffu, v, offset);", "already used"),
    ("    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset++);",
     "not a plain expression"),
    ("    for (int offset = 16; offset > 0; offset >>= 1) return __shfl_xor_sync(0xffffffffu, v, offset);",
     "not in a plain statement"),
])
def test_not_applicable(transform, body, message):
    state = _state(body)
    (anchor,) = transform.find(state)
    with pytest.raises(NotApplicable, match=message):
        transform.backward(state, anchor)


def test_no_site_and_wrong_direction(transform):
    # A shuffle that is not a reduction over the loop's offsets (a broadcast) is not a site.
    assert transform.find(_state("    v = __shfl_sync(0xffffffffu, v, o);")) == []
    anchor = Anchor("warp_sum", "loop", "shuffle#0")
    with pytest.raises(NotApplicable, match="already go through shared memory"):
        transform.backward(golden("xor_loop", "after"), anchor)
    with pytest.raises(NotApplicable, match="already exchanges through shuffles"):
        transform.forward(golden("xor_loop", "before"), anchor)
    with pytest.raises(NotApplicable, match="is a loop, not a statements"):
        transform.backward(golden("xor_loop", "before"), Anchor("warp_sum", "statements", "shuffle#0"))
    with pytest.raises(NotApplicable, match="no shuffle site #3"):
        transform.backward(golden("xor_loop", "before"), Anchor("warp_sum", "loop", "shuffle#3"))


def test_ordinals_survive_rewriting_either_site_first(transform):
    body = ("    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);\n"
            "    for (int offset = 1; offset < 32; offset <<= 1)\n"
            "        v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, offset));")
    state = _state(body)
    first, second = transform.find(state)
    assert (first.key, second.key) == ("shuffle#0", "shuffle#1")
    one = transform.backward(state, second).state
    assert transform.find(one) == [first]
    both = transform.backward(one, first).state
    assert "shfl_scratch0" in both.source and "shfl_scratch1" in both.source and transform.find(both) == []
    assert transform.forward(transform.forward(both, second).state, first).state.source == state.source


# -- the real experts ----------------------------------------------------------------------------------


def test_row_softmax_reduction(transform, cache):
    state = kernel_entry("row_softmax/warp_vec4").load()
    entry = "row_softmax_warp_vec4"
    (anchor,) = transform.find(state)
    assert anchor == Anchor("softmax_row", "loop", "shuffle#0")
    rewrite = transform.backward(state, anchor)
    after = rewrite.state
    assert not cp.syntax_errors(after.source) and transform.find(after) == []
    assert transform.forward(after, anchor).state.source == state.source
    features = {(f.locus, f.name) for f in source_features(after.source)}
    assert ("softmax_row", "shfl") not in features
    assert {("softmax_row", "shared_array"), ("softmax_row", "syncwarp")} <= features
    # The butterfly partner is read through pointer arithmetic: it is an exchange, not an XOR-swizzled
    # layout, and must not read as one (unswizzle_shared would otherwise "undo" it).
    assert ("softmax_row", "xor_swizzle") not in features
    before_build, after_build = compile_ok(state, cache), compile_ok(after, cache)
    for arch in after_build.targets:
        old, new = sass_features(before_build.cubin_bytes(arch)), sass_features(after_build.cubin_bytes(arch))
        assert old.count("shfl", entry) == 20 and new.count("shfl", entry) == 0  # 2 values x 5 steps x 2 widths
        res = after_build.resources_for(entry, arch)
        assert not res.spills and res.stack_bytes == 0
        # softmax_row<4> and softmax_row<1> each get their own 32 x 32 float scratch.
        assert res.shared_bytes - before_build.resources_for(entry, arch).shared_bytes == 2 * 32 * 32 * 4


def test_topk_scans(transform, cache):
    """The top-k expert's warp shuffles are inclusive scans (__shfl_up_sync), not reductions; they are
    sites too and rewrite the same way. Its bitonic exchange (one shuffle at a caller-given stride)
    is not a site and keeps its SHFL. The three scratches add 12 KiB of static shared memory, more
    than the 2048 bytes the plan's `supports` bound reserves for it: no corpus case comes near that
    bound, but a row long enough to would no longer launch."""
    state = kernel_entry("topk/radix_select").load()
    entry = "topk_radix_select"
    anchors = transform.find(state)
    assert [(a.function, a.key) for a in anchors] == [("select_bucket", "shuffle#0"),
                                                      ("block_exclusive_scan", "shuffle#0"),
                                                      ("block_exclusive_scan", "shuffle#1")]
    after = state
    for anchor in anchors:
        after = transform.backward(after, anchor).state
    assert transform.find(after) == []
    restored = after
    for anchor in reversed(anchors):
        restored = transform.forward(restored, anchor).state
    assert restored.source == state.source
    features = {(f.locus, f.name) for f in source_features(after.source)}
    assert ("select_bucket", "shfl") not in features and ("block_exclusive_scan", "shfl") not in features
    assert ("bitonic_exchange", "shfl") in features
    before_build, after_build = compile_ok(state, cache), compile_ok(after, cache)
    old, new = sass_features(before_build.cubin_bytes()), sass_features(after_build.cubin_bytes())
    assert 0 < new.count("shfl", entry) < old.count("shfl", entry)
    res = after_build.resources_for(entry)
    assert not res.spills
    assert res.shared_bytes == before_build.resources_for(entry).shared_bytes + 3 * 32 * 32 * 4
    assert res.shared_bytes > state.constants["STATIC_SMEM_RESERVE"]


def test_nested_reduction_of_array_elements(transform):
    """A reduction loop inside another loop, over elements of an array parameter: the inner loop is
    the site (the outer loop's shuffles are the inner loop's), the scratch type is the element type."""
    source = ("__device__ float f(float (&x)[2])\n{\n    for (int i = 0; i < 2; ++i) {\n"
              "        for (int offset = 16; offset > 0; offset >>= 1)\n"
              "            x[i] += __shfl_xor_sync(0xffffffffu, x[i], offset);\n"
              "    }\n    return x[0] - x[1];\n}\nextern \"C\" __global__ void kernel() {}\n")
    state = KernelState(source=source, plan=LaunchPlan.from_toml(PLAN))
    (anchor,) = transform.find(state)
    assert anchor == Anchor("f", "loop", "shuffle#0") and "x[i]" in anchor.snippet
    after = transform.backward(state, anchor).state
    assert "__shared__ float shfl_scratch0[32][32];" in after.source
    assert transform.forward(after, anchor).state.source == source
    rng = np.random.default_rng(3)
    pairs = [[np.float32(a), np.float32(b)] for a, b in rng.standard_normal((64, 2)) * 10]
    results = []
    for text in (source, after.source):
        parsed, body = function_body(text, "f")
        warp = Warp(parsed, warps=2)
        warp.bind("x", [list(p) for p in pairs])
        results.append(warp.run(body))
    for w in range(2):
        sums = [model([p[i] for p in pairs[32 * w:32 * w + 32]], "sum", "xor") for i in range(2)]
        assert [r.tobytes() for r in results[1][32 * w:32 * w + 32]] == \
            [np.float32(a - b).tobytes() for a, b in zip(*sums)]
    assert [r.tobytes() for r in results[0]] == [r.tobytes() for r in results[1]]


def test_the_scalar_mma_gathers_are_not_sites(transform):
    """scalarize_mma's operand gathers are indexed shuffles (__shfl_sync), not reductions."""
    mma = get("scalarize_mma")
    state = load(HERE / "scalarize_mma" / "bf16", "before", "kernel")
    scalar = mma.backward(state, mma.find(state)[0]).state
    assert transform.find(scalar) == []
