"""uncoarsen: a constant that gives each thread a fixed batch of independent items goes to 1, so each
thread (or each pass of its stride loop) handles one item; forward puts the factor back. Goldens: a row
loaded in batches inside a stride loop (shape A), an elementwise kernel with consecutive items per thread
and a row kernel with block-strided items, both launched over a grid that names the factor (shape B).
Each before/after compiles with nvcc. Refused: whatever makes the items depend on each other or on their
batch position, a launch that would not scale, and a factor with other uses. The topk expert's last dry
state holds one site (LOAD_BATCH); the other experts' loop-bounding constants are refused with reasons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.documents import document_files, read_document_text
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan, resolve
from klineage.transforms import Anchor, Direction, NotApplicable, Role, get
from tests.sampled import sampled
from tests.transforms.golden import DEFAULT_PLAN, HERE, check_golden, compiles_without_spills, load

CASES = ["batch", "chunk", "strided"]
LINEAGES = Path(__file__).resolve().parents[2] / "corpus" / "lineages"
CHUNK_PLAN = LaunchPlan.from_toml((HERE / "uncoarsen" / "chunk" / "before.toml").read_text())


@pytest.fixture(scope="module")
def uncoarsen():
    return get("uncoarsen")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "uncoarsen" / case, which, "kernel")


def anchor(key: str) -> Anchor:
    return Anchor("<file>", "declaration", key)


def last_state(name: str) -> KernelState:
    [path] = document_files(LINEAGES, f"{name}.dry.json")  # stored plain or gzip-compressed
    lineage = json.loads(read_document_text(path, "lineage"))
    last = lineage["states"][-1]
    return KernelState(source=last["source"], plan=LaunchPlan.from_dict(last["plan"]))


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("uncoarsen", case)


@pytest.mark.parametrize("case", sampled(CASES, keep=('batch',)))
def test_golden_kernels_compile(case, cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(case, which), cache)


def test_is_a_mechanism_with_the_old_factor_as_carrier(uncoarsen):
    assert uncoarsen.role is Role.MECHANISM and uncoarsen.has_forward
    before = golden("chunk", "before")
    assert uncoarsen.find(before) == [anchor("ITEMS_PER_THREAD:4->1")]
    rewrite = uncoarsen.backward(before, anchor("ITEMS_PER_THREAD:4->1"))
    assert rewrite.carrier == {"constant": "ITEMS_PER_THREAD", "old": 4, "new": 1}
    assert rewrite.removes == () and rewrite.adds == ()
    assert "1 item loop(s), chunk" in rewrite.note
    # the plan names the factor: the grid grows by it with the source's new value
    env = {"n": 10_000}
    (old,) = resolve(before.plan, {**env, **before.constants}, {"x", "y"})
    (new,) = resolve(rewrite.state.plan, {**env, **rewrite.state.constants}, {"x", "y"})
    assert (old.grid, new.grid) == ((10, 1, 1), (40, 1, 1))
    assert uncoarsen.find(rewrite.state) == []  # a factor of 1 is no site
    batch = uncoarsen.backward(golden("batch", "before"), anchor("LOAD_BATCH:4->1"))
    assert "2 item loop(s), batch" in batch.note


def test_forward_needs_the_factor_at_one_and_a_coarsening_again(uncoarsen):
    after = golden("chunk", "after")
    restored = uncoarsen.forward(after, anchor("ITEMS_PER_THREAD:4->1"))
    assert restored.direction is Direction.FORWARD and restored.state.source == golden("chunk", "before").source
    assert restored.carrier == {"constant": "ITEMS_PER_THREAD", "old": 1, "new": 4}
    with pytest.raises(NotApplicable, match="THREADS is not a constant set to 1 here"):
        uncoarsen.forward(after, anchor("THREADS:4->1"))
    with pytest.raises(NotApplicable, match="needs a file anchor keyed `NAME:OLD->1`"):
        uncoarsen.forward(after, Anchor("kernel", "declaration", "ITEMS_PER_THREAD"))
    with pytest.raises(NotApplicable, match="is 4 here, not 8"):
        uncoarsen.backward(golden("chunk", "before"), anchor("ITEMS_PER_THREAD:8->1"))


def test_forward_sites_coarsen_a_factor_of_one_by_the_carrier(uncoarsen):
    after = golden("chunk", "after")
    assert [a.key for a in uncoarsen.forward_sites(after)] == ["ITEMS_PER_THREAD:4->1"]
    (site,) = uncoarsen.forward_sites(after, {"constant": ["LOAD_BATCH"], "old": [8], "new": [1]})
    assert site.key == "ITEMS_PER_THREAD:8->1"
    assert "constexpr int ITEMS_PER_THREAD = 8;" in uncoarsen.forward(after, site).state.source
    assert uncoarsen.forward_sites(golden("chunk", "before")) == []  # already coarsened
    assert [a.key for a in uncoarsen.forward_sites(golden("batch", "after"))] == ["LOAD_BATCH:4->1"]
    # THREADS is 1 nowhere, and a factor of 1 in front of a loop that is no item loop is no site
    plain_loop = after.with_source(after.source.replace("if (e < n) ", ""))
    assert uncoarsen.forward_sites(plain_loop) == []


ELEMENTWISE = """
constexpr int THREADS = 256;
constexpr int ITEMS = 4;
extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{{
    const int first = (blockIdx.x * THREADS + threadIdx.x) * ITEMS;
{prologue}    for (int i = 0; i < ITEMS; ++i) {{
        const int e = first + i;
{body}
    }}
}}
"""


def chunk(body: str = "        if (e < n) y[e] = 2.0f * x[e];", prologue: str = "") -> str:
    return ELEMENTWISE.format(body=body, prologue=prologue)


STRIDE = """
constexpr int THREADS = 128;
constexpr int LOAD_BATCH = 4;
extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{{
    extern __shared__ float row[];
    for (int i0 = threadIdx.x; i0 < n; i0 += THREADS * LOAD_BATCH) {{
{body}
    }}
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += THREADS) y[i] = row[n - 1 - i];
}}
"""
LOOP = """        for (int b = 0; b < LOAD_BATCH; ++b) {{
            const int i = i0 + b * THREADS;
            {statement}
        }}"""


def batch(statement: str = "if (i < n) row[i] = x[i];", extra: str = "") -> str:
    return STRIDE.format(body=extra + LOOP.format(statement=statement))


GRID_FIXED = CHUNK_PLAN.to_dict() | {"launch": [CHUNK_PLAN.launches[0].to_dict() | {"grid": ["cdiv(n, 1024)", 1, 1]}]}
GRID_THREADS = CHUNK_PLAN.to_dict() | {"launch": [CHUNK_PLAN.launches[0].to_dict() | {
    "grid": ["cdiv(n, THREADS * ITEMS) // 2 + 1", 1, 1]}]}
SAME_BUFFER = CHUNK_PLAN.to_dict() | {"launch": [CHUNK_PLAN.launches[0].to_dict() | {
    "args": [{"buffer": "x"}, {"buffer": "x"}, {"scalar": "n", "type": "i32"}]}]}


def plan_for(source: str, plan: dict | None = None) -> KernelState:
    data = dict(plan or CHUNK_PLAN.to_dict())
    data["launch"] = [launch | {"grid": [g.replace("ITEMS_PER_THREAD", "ITEMS") if isinstance(g, str) else g
                                         for g in launch["grid"]]} for launch in data["launch"]]
    return KernelState(source=source, plan=LaunchPlan.from_dict(data))


@pytest.mark.parametrize("source, plan, reason", [
    (chunk("        if (e < n) y[e] = x[e] + i;"), None,
     r"the item loop's index i is used at line 9 of kernel other than in an item's index or a register slot"),
    (chunk("        if (e < n) acc += x[e];", "    float acc = 0.0f;\n"), None,
     r"the item loop at line 8 of kernel assigns acc, declared outside it \(line 10 of kernel\)"),
    (chunk("        y[e] = x[e];"), None,
     r"is not its items' index declarations and one guarded statement `if \(x < n\) ...`"),
    (chunk("        if (e < 1000) y[e] = x[e];"), None,
     r"does not guard its item by `if \(x < n\)` with n a scalar parameter of the kernel"),
    (chunk("        if (e < n) { y[e] = x[e]; __syncthreads(); }"), None,
     r"the item loop at line 7 of kernel calls __syncthreads\(\) \(line 9 of kernel\): a collective"),
    (chunk("        if (e < n) y[e] = x[e] + y[e > 0 ? e - 1 : 0];"), None,
     r"the items write `y\[e\]` \(line 9 of kernel\) and read `y\[e > 0 \? e - 1 : 0\]`"),
    (chunk(), SAME_BUFFER,
     r"the items write `y\[e\]` \(line 9 of kernel\) and read `x\[e\]` \(line 9 of kernel\) in the same memory"),
    (chunk(), GRID_FIXED, r"the launch of kernel does not scale with ITEMS \(its grid \['cdiv\(n, 1024\)', 1, 1\] "
                          r"names no ITEMS\)"),
    (chunk(), GRID_THREADS, r"with ITEMS = 1 the launch of kernel gives \d+ threads for \d+ items"),
    (chunk(prologue="    y[0] = 0.0f;\n"), None,
     r"the kernel kernel writes memory outside its item loops \(line 7 of kernel\)"),
    (chunk().replace("(blockIdx.x * THREADS + threadIdx.x) * ITEMS", "(blockIdx.x * 128 + threadIdx.x) * ITEMS"),
     None, r"the item index e \(line 8\) is not `\(blockIdx.x \* 256 \+ threadIdx.x\) \* ITEMS \+ i`"),
    (chunk().replace("constexpr int ITEMS = 4;", "constexpr int ITEMS = 4;\nconstexpr int SPAN = ITEMS * 256;"),
     None, r"SPAN is derived from it \(line 4\)"),
    (chunk().replace("constexpr int ITEMS = 4;", "constexpr int ITEMS = 4;\nstatic_assert(ITEMS % 2 == 0, \"pairs\");"),
     None, r"ITEMS = 1 breaks static_assert\(ITEMS % 2 == 0\) \"pairs\""),
    (batch(extra="        row[i0] = 0.0f;\n"), None,
     r"the stride loop at line 7 of kernel does more than its item loops \(`row\[i0\] = 0.0f;` at line 8\)"),
    (batch("if (i < n) row[i] = x[i]; else break;"), None,
     r"the item loop at line 8 of kernel is not its items' index declarations and one guarded statement"),
    (batch("if (i < n) { row[i] = x[i]; if (x[i] < 0.0f) break; }"), None,
     r"the item loop at line 8 of kernel has `break`"),
    (batch("if (i < n) row[i] = row[i] + x[i];"), None,
     r"the items write `row\[i\]` \(line 10 of kernel\) and read `row\[i\]`"),
    (batch().replace("const int i = i0 + b * THREADS;", "const int i = i0 + b * 64;"), None,
     r"the item index i \(line 9\) is not `i0 \+ b \* \(step / LOAD_BATCH\)`"),
    (batch("if (i < n) { v[b] = x[i]; row[i] = v[b]; }").replace(
        "extern __shared__ float row[];", "extern __shared__ float row[];\n    float v[LOAD_BATCH];"), None,
     r"the register array v \(line 7\) is declared outside the stride loop at line 8 of kernel"),
    (batch().replace("i0 < n; i0 +=", "i0 < n - LOAD_BATCH; i0 +="), None,
     r"is used at line 7 of kernel \(`for \(int i0 = threadIdx.x; i0 < n - LOAD_BATCH; .*`\), which is neither"),
])
def test_not_applicable(uncoarsen, source, plan, reason):
    state = plan_for(source, plan)
    name = "LOAD_BATCH" if "LOAD_BATCH" in source else "ITEMS"
    assert uncoarsen.find(state) == []
    (refused,) = [r for r in uncoarsen.refusals(state) if r[0] == name]
    with pytest.raises(NotApplicable, match=reason):
        uncoarsen.backward(state, anchor(f"{name}:4->1"))
    assert refused[1].startswith(f"{name}: ") or "breaks static_assert" in refused[1]


def test_a_batch_whose_launch_scales_must_span_the_grid(uncoarsen):
    scaled = CHUNK_PLAN.to_dict() | {"launch": [CHUNK_PLAN.launches[0].to_dict() | {
        "grid": ["cdiv(n, THREADS * LOAD_BATCH)", 1, 1], "block": ["THREADS", 1, 1]}]}
    blockwise = KernelState(source=batch(), plan=LaunchPlan.from_dict(scaled))
    with pytest.raises(NotApplicable, match=r"the launch scales with it \(cdiv\(n, THREADS \* LOAD_BATCH\)\), but the "
                                            r"stride loop at line 7 of kernel does not span the grid"):
        uncoarsen.backward(blockwise, anchor("LOAD_BATCH:4->1"))
    grid_stride = blockwise.with_source(
        batch().replace("i0 = threadIdx.x; i0 < n; i0 += THREADS * LOAD_BATCH",
                        "i0 = blockIdx.x * THREADS + threadIdx.x; i0 < n; i0 += gridDim.x * THREADS * LOAD_BATCH")
        .replace("const int i = i0 + b * THREADS;", "const int i = i0 + b * (gridDim.x * THREADS);"))
    assert uncoarsen.find(grid_stride) == [anchor("LOAD_BATCH:4->1")]


def test_a_stride_loop_without_item_loops_is_refused(uncoarsen):
    # with LOAD_BATCH = 1 the second loop would visit every element instead of every fourth
    source = batch().replace("    __syncthreads();\n",
                             "    for (int j0 = threadIdx.x; j0 < n; j0 += THREADS * LOAD_BATCH) "
                             "row[j0] = 0.0f;\n    __syncthreads();\n")
    assert uncoarsen.refusals(plan_for(source)) == [
        ("LOAD_BATCH", "LOAD_BATCH: steps the loop at line 13 of kernel, which holds no loop over LOAD_BATCH items")]


# The corpus's dry walks: topk's batched row load (shape A, in both instantiations of load_row_keys) was a
# site in the last state of its walk before this transform; the walk now takes it (step 5 of 32) and ends
# with LOAD_BATCH = 1. The other experts' loop-bounding constants are derived tile counts or none.
def test_topk_dry_walk_uncoarsens_its_row_load(uncoarsen, cache):
    lineage = json.loads((LINEAGES / "topk_radix_select.dry.json").read_text())
    states = {s["fingerprint"]: KernelState(source=s["source"], plan=LaunchPlan.from_dict(s["plan"]))
              for s in lineage["states"]}
    (step,) = [t for t in lineage["transitions"] if t["transform"] == "uncoarsen"]
    assert step["anchor"]["key"] == "LOAD_BATCH:8->1" and step["carrier"] == {"constant": "LOAD_BATCH", "old": 8,
                                                                               "new": 1}
    rewrite = uncoarsen.backward(states[step["parent"]], anchor("LOAD_BATCH:8->1"))
    assert rewrite.state.fingerprint == step["child"]
    last = last_state("topk_radix_select")
    assert uncoarsen.find(last) == [] and "constexpr int LOAD_BATCH = 1;" in last.source
    # the last state of the walk before uncoarsen existed: the same kernel with LOAD_BATCH = 8
    before = last.with_source(last.source.replace("constexpr int LOAD_BATCH = 1;", "constexpr int LOAD_BATCH = 8;"))
    assert uncoarsen.find(before) == [anchor("LOAD_BATCH:8->1")]
    rewrite = uncoarsen.backward(before, anchor("LOAD_BATCH:8->1"))
    assert "4 item loop(s), batch" in rewrite.note and rewrite.state.source == last.source
    compiles_without_spills(before, cache)
    compiles_without_spills(last, cache)
    assert uncoarsen.forward(last, rewrite.anchor).state.source == before.source


@pytest.mark.parametrize("name, refused", [
    ("gdn_chunked", {"CHUNK": "TILE_BF16_BYTES is derived from it"}),
    ("gemm_mma_sync", {}),
    ("conv2d_implicit_gemm", {}),
    ("fmha_flash_mma", {}),
    ("row_softmax_warp_vec4.full", {}),
])
def test_other_corpus_last_states_hold_no_site(uncoarsen, name, refused):
    state = last_state(name)
    assert uncoarsen.find(state) == []
    found = dict(uncoarsen.refusals(state))
    assert set(found) == set(refused)
    for constant, reason in refused.items():
        assert reason in found[constant]


def test_default_plan_kernels_without_a_launch_are_refused_for_chunks(uncoarsen):
    state = KernelState(source=chunk(), plan=LaunchPlan.from_toml(DEFAULT_PLAN.format(entry="other")))
    with pytest.raises(NotApplicable, match="no launch of kernel in the plan"):
        uncoarsen.backward(state, anchor("ITEMS:4->1"))
