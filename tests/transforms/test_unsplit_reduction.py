"""unsplit_reduction: a reduction split into chunks on grid y, as many as fill the GPU (partials in scratch, merged
in chunk order by a second launch), becomes one thread's loop; forward finds its sites by analysis, a batch of
column sums (one thread per output of (B, D), `i >= B * D`) among them. The split forms compute the naive kernels'
bits on the CPU emulator (tests/transforms/elementwise_emulator.cpp) over several chunks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from klineage import devices, expr
from klineage.kernel import KernelState, parse_constants
from klineage.launch import resolve
from klineage.transforms import Anchor, NotApplicable, get
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.emulate import hard_rows
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

ROW = {"colsum": "c", "colargmax": "c", "batched_mean": "i"}  # case -> its thread's output index
CASES = list(ROW)


@pytest.fixture(scope="module")
def transform():
    return get("unsplit_reduction")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "unsplit_reduction" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("unsplit_reduction", case)


def test_golden_kernels_compile(cache):
    for case in CASES:
        for which in ("before", "after"):
            compiles_without_spills(golden(case, which), cache)


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_naive_kernel_by_analysis(transform, case):
    naive = golden(case, "after")
    assert transform.forward_sites(naive) == [Anchor("kernel", "function", ROW[case])]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(naive) == []


PLAN = plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }', "cdiv(cols, 128)",
               128)
HEAD = "__global__ void kernel(const float* x, float* y, int rows, int cols) {\n" \
       "    int c = blockIdx.x * blockDim.x + threadIdx.x;\n"
SUM = "    float s = 0.0f;\n    for (int r = 0; r < rows; ++r) s += x[r * cols + c];\n"


@pytest.mark.parametrize("body, why", [
    ("    if (c >= cols) return;\n    float s = 0.0f;\n    for (int r = 0; r < rows; ++r) s += x[r * cols + c];\n"
     "    float t = 0.0f;\n    for (int r = 0; r < rows; ++r) t += x[r * cols + c] * s;\n    y[c] = t;\n", "2 loops"),
    ("    if (c >= cols) return;\n    float s = 0.0f;\n    for (int r = 0; r < rows; ++r) { s += x[r * cols + c]; "
     "y[r * cols + c] = s; }\n", "running sum"),
    ("    if (c >= cols) return;\n    float s = 0.0f;\n    for (int r = 0; r < rows; ++r) s += x[r * cols + c];\n",
     "nothing after"),
    ("    float s = 0.0f;\n    for (int r = 0; r < rows; ++r) s += x[r * cols + c];\n    y[c] = s;\n",
     "no `if \\(c >= N\\) return;`"),
    ("    if (c >= cols) return;\n    float s = 0.0f;\n    for (int r = 0; r < rows - 1; ++r) s += x[r * cols + c];\n"
     "    y[c] = s;\n", "unit-step loop from a constant"),
    ("    if (c >= cols) return;\n    float split_s = 0.0f;\n"
     "    for (int r = 0; r < rows; ++r) split_s += x[r * cols + c];\n    y[c] = split_s;\n", "already names split"),
    # a bound that is not the guard's count of the thread index itself, or not the count the plan says
    ("    if (c / 2 >= cols) return;\n" + SUM + "    y[c] = s;\n", "no `if \\(c >= N\\) return;`"),
    ("    if (c >= cols - 1) return;\n" + SUM + "    y[c] = s;\n", "no `if \\(c >= N\\) return;`"),
    ("    int n = rows * cols;\n    n -= cols;\n    if (c >= n) return;\n" + SUM + "    y[c] = s;\n",
     "'n' of `n` is neither"),  # a count local the kernel changes (one it never changes is read as its value)
    # the merge's offsets would say the doubled count: past the scratch the plan allocates for the launch's
    ("    if (c >= cols) return;\n    cols *= 2;\n" + SUM + "    y[c] = s;\n", "assigns or declares cols"),
    ("    if (c >= cols) return;\n    rows += 1;\n" + SUM + "    y[c] = s;\n", "assigns or declares rows"),
    ("    if (c < cols) {\n        int rows = 300;\n    " + SUM.replace("\n    ", "\n        ") + "    y[c] = s;\n"
     "    }\n", "assigns or declares rows"),
    ("    if (c >= cols) return;\n" + SUM + "    y[c] = s + blockIdx.y;\n", "names blockIdx.y"),  # then the chunk
])
def test_no_site_where_a_split_would_not_be_legal(transform, body, why):
    state = KernelState(source=HEAD + body + "}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, Anchor("kernel", "function", "c"))


def test_a_guard_count_named_by_a_local_is_read_as_its_value(transform):
    """`int n = rows * cols; if (c >= n) return;`: a count local the kernel never changes is the product itself
    (`_index_locals.counts_inlined`, as the warp reductions read it), so the guard is the split's."""
    body = "    int n = rows * cols;\n    if (c >= n) return;\n" + SUM + "    y[c] = s;\n"
    state = KernelState(source=HEAD + body + "}\n", plan=PLAN)
    (site,) = transform.forward_sites(state)
    assert "if (c >= rows * cols) return;" in transform.forward(state, site).state.source


def _chunks(case: str, params: dict) -> int:
    """How many chunks the golden split form's plan launches for `params` on the default GPU."""
    grid_y = golden(case, "before").plan.launches[0].grid[1]
    return expr.evaluate_int(grid_y, {**devices.DEFAULT.facts(), **params})


def _columns(case: str, rows: int, cols: int) -> tuple[dict, dict, dict]:
    """(params, inputs, outputs with the scratch) for a rows x cols matrix: integer values for the sum (any order of
    the adds gives the same bits), for the argmax the hard rows' columns (ties, NaNs, infinities, signed zeros)."""
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    chunks = _chunks(case, {"rows": rows, "cols": cols})
    if case == "colsum":
        x = torch.randint(-8, 9, (rows, cols), generator=g).float()
        return ({"rows": rows, "cols": cols}, {"dy": x.flatten()},
                {"db": (torch.float32, cols), "split_sum": (torch.float32, chunks * cols)})
    x = hard_rows(rows, g).t().contiguous()[:, :cols]
    cols = x.shape[1]
    return ({"rows": rows, "cols": cols}, {"x": x.flatten()},
            {"values": (torch.float32, cols), "rows_at": (torch.int64, cols),
             "split_best": (torch.float32, chunks * cols), "split_at": (torch.int64, chunks * cols)})


def _batched(batches: int, rows: int, cols: int) -> tuple[dict, dict, dict]:
    """(params, inputs, outputs with the scratch) for a batch of rows x cols matrices: integer values (any order of
    the adds gives the same bits)."""
    g = torch.Generator().manual_seed(batches * 100000 + rows * 1000 + cols)
    x = torch.randint(-8, 9, (batches, rows, cols), generator=g).float()
    params = {"B": batches, "N": rows, "D": cols}
    return (params, {"x": x.flatten()},
            {"out": (torch.float32, batches * cols),
             "split_s": (torch.float32, _chunks("batched_mean", params) * batches * cols)})


def _differences(tmp_path, naive: KernelState, split: KernelState, shapes, inputs_of, names) -> list:
    """(shape, output) wherever the split form's output `names` differ from the naive kernel's bits."""
    binaries = {"naive": emulate.build(tmp_path / "naive", naive), "split": emulate.build(tmp_path / "split", split)}
    found = []
    for shape in shapes:
        params, inputs, outputs = inputs_of(*shape)
        folder = "x".join(map(str, shape))
        runs = {form: emulate.run(binaries[form], tmp_path / f"{form}-{folder}", state, params, inputs, outputs)
                for form, state in (("naive", naive), ("split", split))}
        found += [(shape, name) for name in names
                  if not torch.equal(runs["split"][name].view(torch.uint8), runs["naive"][name].view(torch.uint8))]
    return found


@pytest.mark.parametrize("case", sampled(["colsum", "colargmax"], keep=["colargmax"]))
def test_the_split_form_computes_the_naive_kernels_bits_on_the_cpu(case, tmp_path):
    """Rows in one chunk, in two at a chunk's edge (chunks of 32 steps on these few columns), in ten (the last one
    short): the merge's answer is the loop's."""
    names = ("db",) if case == "colsum" else ("values", "rows_at")
    assert [_chunks(case, {"rows": rows, "cols": cols}) for rows, cols in ((1, 5), (64, 12), (300, 9))] == [1, 2, 10]
    assert _differences(tmp_path, golden(case, "after"), golden(case, "before"), ((1, 5), (64, 12), (300, 9)),
                        lambda rows, cols: _columns(case, rows, cols), names) == []


# a row's sum started from its bias (`_sum_starts`) and an argmin that reads its best value back (`held_best`): the
# warp reductions' readings, which the split reads too
ROW_HEAD = ("__global__ void kernel(const float* w, const float* b, float* y, float* at, int rows, int n) {\n"
            "    int row = blockIdx.x * blockDim.x + threadIdx.x;\n    if (row >= rows) return;\n")
ROW_READINGS = {
    "bias": ROW_HEAD + "    float acc = b[row];\n    for (int j = 0; j < n; ++j) acc += w[row * n + j];\n"
                       "    y[row] = acc;\n}\n",
    "argmin": ROW_HEAD + "    int best = 0;\n    for (int j = 1; j < n; ++j)\n"
                         "        if (w[row * n + j] < w[row * n + best]) best = j;\n    at[row] = (float)best;\n}\n",
}
ROW_PLAN = plan_of('"w", "b", "y", "at", { scalar = "rows", type = "i32" }, { scalar = "n", type = "i32" }',
                   grid="cdiv(rows, 128)", block=128)


@pytest.mark.parametrize("case", ["bias", "argmin"])
def test_a_sum_from_a_bias_and_an_argmin_read_back_are_split_to_their_bits(case, tmp_path):
    """The split reads rows as the warp reductions do: a sum from a bias is chunked from zero and the bias added
    after the merge, an argmin read back holds its value; on integer values (ties among few) the merged answers
    are the loop's bits, in one chunk and in many."""
    naive = KernelState(source=ROW_READINGS[case], plan=ROW_PLAN)
    (site,) = get("unsplit_reduction").forward_sites(naive)
    split = get("unsplit_reduction").forward(naive, site).state
    scratch = [arg.name for arg in split.plan.launches[0].args if arg.name and arg.name.startswith("split_")]

    def inputs_of(rows: int, n: int) -> tuple[dict, dict, dict]:
        g = torch.Generator().manual_seed(rows * 1000 + n)
        chunks = expr.evaluate_int(str(split.plan.launches[0].grid[1]), {**devices.DEFAULT.facts(), "rows": rows,
                                                                         "n": n})
        kinds = {"split_best": torch.int32, "split_best_value": torch.float32, "split_acc": torch.float32}
        return ({"rows": rows, "n": n}, {"w": torch.randint(-3, 4, (rows * n,), generator=g).float(),
                                         "b": torch.randint(-50, 51, (rows,), generator=g).float()},
                {"y": (torch.float32, rows), "at": (torch.float32, rows),
                 **{name: (kinds[name], chunks * rows) for name in scratch}})

    assert _differences(tmp_path, naive, split, ((3, 5), (2, 3000)), inputs_of, ("y", "at")) == []


BATCHES = ((1, 1, 5), (3, 129, 12), (2, 300, 9), (4, 128, 33))  # (B, N, D): columns of no warp multiple, ragged chunks


def test_the_split_batch_computes_the_naive_kernels_bits_on_the_cpu(tmp_path):
    """Every batch's partials apart in the scratch (chunk * B * D + i), whatever the chunks and the columns."""
    naive, split = golden("batched_mean", "after"), golden("batched_mean", "before")
    assert _differences(tmp_path, naive, split, BATCHES, _batched, ("out",)) == []


def test_a_scratch_offset_of_one_batch_is_caught(tmp_path):
    """Chunks offset by D instead of B * D: one chunk's partials overwrite another's, and the merge sums the wrong
    ones."""
    split = golden("batched_mean", "before")
    chunk = "split_s[(size_t)blockIdx.y * B * D + i] = s;"
    assert chunk in split.source
    broken = KernelState(source=split.source.replace(chunk, chunk.replace("B * D", "D")), plan=split.plan)
    assert _differences(tmp_path, golden("batched_mean", "after"), broken, BATCHES[1:2], _batched, ("out",))


@pytest.mark.parametrize("mutant", [("r < split_first + split_steps", "r <= split_first + split_steps"),
                                    ("split_index < at", "split_index > at")])
def test_a_chunk_that_overlaps_or_a_merge_that_breaks_ties_otherwise_is_caught(mutant, tmp_path):
    case = "colsum" if "split_steps" in mutant[0] else "colargmax"
    split = golden(case, "before")
    assert mutant[0] in split.source
    broken = KernelState(source=split.source.replace(*mutant), plan=split.plan)
    params, inputs, outputs = _columns(case, 300, 12)
    naive = golden(case, "after")
    want = emulate.run(emulate.build(tmp_path / "naive", naive), tmp_path / "naive-run", naive, params, inputs,
                       outputs)
    got = emulate.run(emulate.build(tmp_path / "broken", broken), tmp_path / "broken-run", broken, params, inputs,
                      outputs)
    name = "db" if case == "colsum" else "rows_at"
    assert not torch.equal(got[name], want[name])


def test_a_case_with_no_rows_launches_one_chunk_and_the_merge_reads_none():
    split = golden("colsum", "before")
    env = {**devices.DEFAULT.facts(), **parse_constants(split.source), "rows": 0, "cols": 5}
    launches = resolve(split.plan, env, {"dy", "db", "split_sum"})
    assert [launch.grid for launch in launches] == [(1, 1, 1), (1, 1, 1)]
    assert "split < (rows + split_steps - 1) / split_steps" in split.source  # no rows: no chunk is merged, sum 0


@pytest.mark.parametrize("rows, cols, gpu, steps, chunks", [
    (16384, 1024, devices.H200, 63, 261),  # a bias gradient: 1,024 threads x 261 chunks, one wave of 132 SMs
    (16384, 1024, replace(devices.H200, num_sms=16), 512, 32),  # a smaller GPU fills with fewer, longer chunks
    (262144, 64, devices.H200, 63, 4162),  # few columns: many chunks
    (64, 65536, devices.H200, 32, 2),  # many columns: chunks of 32 steps at least
    (10_000_000, 64, devices.H200, 2368, 4223),  # 78,125 chunks of 128 rows would not launch
    (10_000_000, 1, devices.H200, 153, 65360),  # one output: grid y's limit makes the chunks longer
    (5, 33, devices.H200, 32, 1),
])
def test_the_chunks_fill_the_gpu_once(rows, cols, gpu, steps, chunks):
    """The plan sizes the chunks by the case and the GPU: the outputs' threads times the chunks about fill every SM
    once (2,048 threads each), no chunk shorter than 32 steps, no more chunks than grid y holds; the chunk kernel and
    the merge read the same steps, and the scratch holds every chunk's partials."""
    split = golden("colsum", "before")
    env = {**gpu.facts(), "rows": rows, "cols": cols}
    launches = resolve(split.plan, env, {"dy", "db", "split_sum"})
    assert [launch.args[4][1] for launch in launches] == [steps, steps]
    assert launches[0].grid[1] == chunks == -(-rows // steps)
    assert expr.evaluate_int(split.plan.scratch[0].count, env) == chunks * cols


def test_a_loop_bound_that_is_a_product_is_said_in_the_plan_by_the_launchs_values(transform):
    plan = plan_of('"x", "y", { scalar = "cols", type = "i32" }, { scalar = "c", type = "i32" }, '
                   '{ scalar = "2 * h", type = "i32" }', "cdiv(cols, 128)", 128)
    naive = KernelState(source="__global__ void kernel(const float* x, float* y, int cols, int c, int hw) {\n"
                               "    int k = blockIdx.x * blockDim.x + threadIdx.x;\n    if (k >= cols) return;\n"
                               "    float s = 0.0f;\n    for (int r = 0; r < c * hw; ++r) s += x[r * cols + k];\n"
                               "    y[k] = s;\n}\n", plan=plan)
    split = transform.forward(naive, Anchor("kernel", "function", "k")).state
    assert split.plan.launches[0].grid[1].startswith("cdiv(max(c * (2 * h), 1), max(32, cdiv(max(c * (2 * h), 1)")
    assert "for (int split = 0; split < (c * hw + split_steps - 1) / split_steps; ++split)" in split.source


def test_a_count_cast_to_size_t_is_the_count_in_the_plan_and_stays_cast_in_the_kernel(transform, cache):
    naive = KernelState(source="__global__ void kernel(const float* x, float* y, int rows, int cols) {\n"
                               "    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
                               "    if (c >= (size_t)cols) return;\n    float s = 0.0f;\n"
                               "    for (size_t r = 0; r < (size_t)rows; ++r) s += x[r * cols + c];\n"
                               "    y[c] = s;\n}\n", plan=PLAN)
    (site,) = transform.forward_sites(naive)
    split = transform.forward(naive, site).state
    assert split.plan.launches[0].grid[1] == golden("colsum", "before").plan.launches[0].grid[1]
    assert "r < (size_t)rows && r < split_first + split_steps" in split.source
    assert get("serialize_reduction").forward_sites(naive)  # the warp reductions read the cast bound too
    compiles_without_spills(split, cache)


BATCHED = "__global__ void kernel(const float* x, float* y, int B, int N, int D) {\n" \
          "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (GUARD) return;\n" \
          "    int b = i / D, d = i % D;\n    float s = 0.0f;\n" \
          "    for (int n = 0; n < N; ++n) s += x[((size_t)b * N + n) * D + d];\n    y[i] = s;\n}\n"
BATCHED_ARGS = '"x", "y", ' + ", ".join(f'{{ scalar = "{name}", type = "i32" }}' for name in "BND")


@pytest.mark.parametrize("guard, offset, count", [
    ("i >= B * D", "(size_t)blockIdx.y * B * D + i", "B * D"),
    ("B * D <= i", "(size_t)blockIdx.y * B * D + i", "B * D"),
    ("i >= (long long)B * D", "(size_t)blockIdx.y * B * D + i", "B * D"),  # the author's 64-bit product: one count
    ("i >= B + D", "(size_t)blockIdx.y * ((size_t)B + D) + i", "B + D"),  # a sum is one factor, widened
])
def test_a_guard_count_of_several_names_is_one_factor_of_the_scratch_offsets(transform, cache, guard, offset, count):
    naive = KernelState(source=BATCHED.replace("GUARD", guard), plan=plan_of(BATCHED_ARGS, "cdiv(B * D, 128)", 128))
    split = transform.forward(naive, Anchor("kernel", "function", "i")).state
    assert f"split_s[{offset}] = s;" in split.source
    assert f"s += split_s[{offset.replace('blockIdx.y', 'split')}];" in split.source
    assert split.plan.scratch[0].count == f"{split.plan.launches[0].grid[1]} * ({count})"
    assert f"max({count}, 1)" in split.plan.launches[0].grid[1]  # the outputs' count sizes the chunks
    compiles_without_spills(split, cache)


def test_no_site_on_a_grid_whose_y_the_kernel_names(transform):
    """A batch on grid y (`b = blockIdx.y`): the chunks would take grid y from it."""
    source = BATCHED.replace("GUARD", "d >= D").replace("int i = ", "int d = ").replace(", d = i % D", "") \
        .replace("int b = i / D", "int b = blockIdx.y").replace("y[i]", "y[b * D + d]")
    naive = KernelState(source=source, plan=plan_of(BATCHED_ARGS, 'cdiv(D, 128)", "B', 128))
    assert transform.forward_sites(naive) == []
    with pytest.raises(NotApplicable, match="names blockIdx.y"):
        transform.forward(naive, Anchor("kernel", "function", "d"))


def test_a_perfect_nest_is_split_into_chunks_of_its_pairs_and_computes_the_nests_bits(transform, tmp_path):
    """Per-channel batch-norm statistics written as a nest over images and pixels (serialize_reduction's golden
    `bn_stats/written.cu`) are one loop over the (n, k) pairs (`_nests.py`), which forward splits into chunks of
    pairs; the product's 64-bit cast is the plan's product. On integer values (exact sums in any order) the split
    form's mean and variance are the nest's bits, for pairs in one chunk, in several with a short last one, and at
    a chunk's edge."""
    nest = KernelState(source=(HERE / "serialize_reduction" / "bn_stats" / "written.cu").read_text(),
                       plan=load(HERE / "serialize_reduction" / "bn_stats", "after", "kernel").plan)
    (site,) = transform.forward_sites(nest)
    split = transform.forward(nest, site).state
    assert "n_k < (long long)N * HW && n_k < split_first + split_steps" in split.source
    assert split.plan.launches[0].grid[1].startswith("cdiv(max(N * HW, 1), max(32, ")

    def statistics(n: int, c: int, hw: int) -> tuple[dict, dict, dict]:
        x = torch.randint(-3, 4, (n, c, hw), generator=torch.Generator().manual_seed(n * 1000 + c * 10 + hw)).float()
        chunks = expr.evaluate_int(split.plan.launches[0].grid[1], {**devices.DEFAULT.facts(), "N": n, "C": c,
                                                                    "HW": hw})
        return ({"N": n, "C": c, "HW": hw}, {"x": x.flatten()},
                {"mean": (torch.float32, c), "var": (torch.float32, c), "split_s": (torch.float32, chunks * c),
                 "split_q": (torch.float32, chunks * c)})

    assert _differences(tmp_path, nest, split, ((1, 3, 1), (2, 5, 64), (3, 130, 100), (4, 2, 33)), statistics,
                        ("mean", "var")) == []


TOTAL = KernelState(source="__global__ void kernel(const float* x, float* total, int rows, int cols) {\n"
                           "    int c = blockIdx.x * blockDim.x + threadIdx.x;\n    if (c >= cols) return;\n"
                           "    float s = 0.0f;\n    for (int r = 0; r < rows; ++r) s += x[r * cols + c];\n"
                           "    atomicAdd(total, s * s);\n}\n",
                    plan=plan_of('"x", "total", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }',
                                 "cdiv(cols, 128)", 128))


def test_an_atomic_after_the_loop_is_made_once_an_output_by_the_merge(transform, tmp_path):
    """The sum of the columns' squared sums: the chunks store partials in place of the atomic, the merge makes it
    once per column from the merged sum; on integer values the total is the naive kernel's. An atomic before the
    loop would be made once a chunk: no site."""
    (site,) = transform.forward_sites(TOTAL)
    split = transform.forward(TOTAL, site).state
    chunk, merge = split.source.split("kernel_merge")
    assert "atomicAdd" not in chunk and "atomicAdd(total, s * s);" in merge
    params = {"rows": 300, "cols": 9}
    x = torch.randint(-8, 9, (300, 9), generator=torch.Generator().manual_seed(3)).float()
    chunks = expr.evaluate_int(split.plan.launches[0].grid[1], {**devices.DEFAULT.facts(), **params})
    outputs = {"naive": {"total": (torch.float32, 1)},
               "split": {"total": (torch.float32, 1), "split_s": (torch.float32, chunks * 9)}}
    totals = {form: emulate.run(binary, tmp_path / f"{form}-run", state, params, {"x": x.flatten()},
                                outputs[form], starting={"total": torch.zeros(1)})["total"]
              for form, (binary, state) in emulate.builds(tmp_path, {"naive": TOTAL, "split": split}).items()}
    assert chunks == 10 and torch.equal(totals["split"], totals["naive"])
    assert totals["naive"].item() == float((x.sum(0) ** 2).sum())
    counted = KernelState(source=TOTAL.source.replace("float* total,", "float* total, float* y,")
                          .replace("    float s = 0.0f;\n", "    atomicAdd(total, 1.0f);\n    float s = 0.0f;\n")
                          .replace("atomicAdd(total, s * s);", "y[c] = s;"),
                          plan=plan_of('"x", "total", "y", { scalar = "rows", type = "i32" }, '
                                       '{ scalar = "cols", type = "i32" }', "cdiv(cols, 128)", 128))
    assert transform.forward_sites(counted) == []
    with pytest.raises(NotApplicable, match="makes an atomic before its loop"):
        transform.forward(counted, Anchor("kernel", "function", "c"))


def _lone(which: str) -> KernelState:
    """test_flatten's kernel one thread runs (`<<<1, 1>>>`): the sum and the largest of every element."""
    return load(HERE / "flatten" / "one_thread", which, "kernel")


def test_a_kernel_one_thread_runs_is_split_over_the_gpu_and_its_chunks_and_merge_then_take_a_warp_each(
        transform, tmp_path, cache):
    """The whole reduction of a `<<<1, 1>>>` kernel is one row (`_flatten.py`): forward splits its loop into chunks
    on grid y, one block of one warp a chunk; serialize_reduction then gives each chunk's loop and the merge's walk
    over the chunks a warp, on the grid they had (one warp already holds the row's lanes). On integer values every
    form stores the single thread's sum and largest element, over one chunk, several, and a short last one."""
    lone, flat = _lone("written"), _lone("flat")
    (site,) = transform.forward_sites(lone)
    split = transform.forward(lone, site).state
    warps = get("serialize_reduction")
    chunked = warps.forward(split, Anchor("kernel", "function", "row")).state
    both = warps.forward(chunked, Anchor("kernel_merge", "function", "row")).state
    assert "for (int i = split_first + lane; i < rows * cols && i < split_first + split_steps; i += 32)" in both.source
    assert "for (int split = lane; split < (rows * cols + split_steps - 1) / split_steps; split += 32)" in both.source
    assert [(launch.grid[0], launch.block) for launch in both.plan.launches] == [(1, (32, 1, 1))] * 2
    assert warps.backward(warps.backward(both, Anchor("kernel_merge", "function", "row")).state,
                          Anchor("kernel", "function", "row")).state == split
    compiles_without_spills(both, cache)

    def inputs_of(rows: int, cols: int) -> tuple[dict, dict, dict]:
        params = {"rows": rows, "cols": cols}
        chunks = expr.evaluate_int(split.plan.launches[0].grid[1], {**devices.DEFAULT.facts(), **params})
        x = torch.randint(-8, 9, (rows * cols,), generator=torch.Generator().manual_seed(rows * cols)).float()
        return params, {"x": x}, {"y": (torch.float32, 2), "split_s": (torch.float32, chunks),
                                  "split_best": (torch.float32, chunks)}

    shapes = ((1, 5), (40, 32), (70, 65))  # 1 chunk, 40 of 32 steps, 143 with a short last one
    assert [expr.evaluate_int(split.plan.launches[0].grid[1], {**devices.DEFAULT.facts(), "rows": r, "cols": c})
            for r, c in shapes] == [1, 40, 143]
    found = []
    for name, form in {"split": split, "chunks in warps": chunked, "both in warps": both}.items():
        found += _differences(tmp_path / name.replace(" ", "_"), flat, form, shapes, inputs_of, ("y",))
    assert found == []
