"""The top-k problem and its two corpus kernels, on the CPU with the real nvcc.

No GPU here, so the kernels' algorithms are also emulated step for step in numpy (same traversal
order, digit passes, bucket scan, tie handling, compaction slots and bitonic network) and checked
against torch.topk through the problem's own `check`: logic errors show up before any GPU run.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from klineage.devices import H200
from klineage.kernel import load_kernel
from klineage.launch import resolve
from klineage.problem import load_problem, validate_numerics

ROOT = Path(__file__).resolve().parent.parent
PROBLEM = ROOT / "corpus" / "problems" / "topk.py"
KERNELS = {name: ROOT / "corpus" / "kernels" / "topk" / name for name in ("radix_select", "naive")}
ENTRIES = {"radix_select": "topk_radix_select", "naive": "topk_naive"}
SMALL_CASES = ("small", "narrow", "ragged", "k1", "k_eq_s", "ties", "infinities", "mid")


@pytest.fixture(scope="module")
def problem():
    return load_problem(PROBLEM)


def case_params(problem, name):
    return dict(problem.info.case(name).params)


# ---- The problem ------------------------------------------------------------------------------------


def test_problem_loads_and_declares_the_cases(problem):
    info = problem.info
    assert info.operator == "topk" and info.headline == "headline" and info.math == "fp32"
    assert info.has_vendor and info.has_check
    names = {c.name for c in info.cases}
    assert {"headline", "ragged", "k1", "k_eq_s", "ties", "infinities", "large", "small"} <= names
    assert case_params(problem, "headline") == {"B": 64, "S": 4096, "K": 512, "mode": "mixed"}
    large = case_params(problem, "large")
    assert (large["B"], large["S"], large["K"]) == (4096, 32768, 64)
    assert case_params(problem, "k1")["K"] == 1
    k_eq_s = case_params(problem, "k_eq_s")
    assert k_eq_s["K"] == k_eq_s["S"]
    assert case_params(problem, "ragged")["S"] % 4 != 0
    roof = info.roofline["headline"]
    assert roof["flops"] == 0.0 and roof["bytes"] == 64 * 4096 * 4 + 64 * 512 * 12


def test_validate_numerics_passes_on_cpu(problem):
    assert validate_numerics(problem, "cpu") == []


@pytest.mark.parametrize("name", [*SMALL_CASES, "headline", "wide_k"])
def test_reference_has_the_declared_shapes_and_passes_check(problem, name):
    params = case_params(problem, name)
    inputs = problem.make_inputs(params, 0, "cpu")
    x = inputs["x"]
    assert x.dtype == torch.float32 and tuple(x.shape) == (params["B"], params["S"]) and x.is_contiguous()
    assert not x.isnan().any()
    ref = problem.reference({k: v.clone() for k, v in inputs.items()})
    for out in problem.info.outputs:
        dims, dtype = out.resolve(params)
        assert tuple(ref[out.name].shape) == dims and str(ref[out.name].dtype) == f"torch.{dtype}"
    assert problem.check(params, inputs, ref, ref) is None
    assert torch.equal(problem.make_inputs(params, 0, "cpu")["x"], x)  # deterministic per seed


def test_inputs_cover_the_tricky_values(problem):
    mixed = problem.make_inputs(case_params(problem, "headline"), 0, "cpu")["x"]
    assert (mixed == float("inf")).any() and (mixed == float("-inf")).any()
    zeros = mixed[mixed == 0]
    assert (zeros.view(torch.int32) < 0).any() and (zeros.view(torch.int32) == 0).any()  # -0.0 and +0.0
    tiny = mixed.abs()
    assert ((tiny > 0) & (tiny < torch.finfo(torch.float32).tiny)).any()  # subnormals
    rows = [r for r in mixed if bool((r == r[0]).all())]
    assert rows, "a constant row"
    assert any(bool((r[1:] >= r[:-1]).all()) for r in mixed) and any(bool((r[1:] <= r[:-1]).all()) for r in mixed)
    ties = problem.make_inputs(case_params(problem, "ties"), 0, "cpu")["x"]
    assert max(len(torch.unique(r)) for r in ties) < 64
    inf = problem.make_inputs(case_params(problem, "infinities"), 1, "cpu")["x"]
    per_row_pos = (inf == float("inf")).sum(dim=1)
    assert (per_row_pos > case_params(problem, "infinities")["K"]).any()  # more +inf than K somewhere
    assert bool((inf == float("-inf")).all(dim=1).any())  # a row of -inf only


# ---- check -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tie_case(problem):
    params = case_params(problem, "ties")
    inputs = problem.make_inputs(params, 3, "cpu")
    ref = problem.reference(inputs)
    return params, inputs, ref


def _copy(ref):
    return {k: v.clone() for k, v in ref.items()}


def test_check_accepts_a_tie_permuted_answer(problem, tie_case):
    params, inputs, ref = tie_case
    out = _copy(ref)
    vals, idx = out["values"], out["indices"]
    swapped = 0
    for r in range(vals.shape[0]):
        same = (vals[r, 1:] == vals[r, :-1]).nonzero()
        if len(same):
            p = int(same[0, 0])
            idx[r, p], idx[r, p + 1] = int(idx[r, p + 1]), int(idx[r, p])
            swapped += 1
    assert swapped > 10
    assert not torch.equal(idx, ref["indices"])
    assert problem.check(params, inputs, out, ref) is None
    # A tie at the cut may also pick another element of equal value outside the reference's set.
    x = inputs["x"]
    out = _copy(ref)
    for r in range(x.shape[0]):
        last = out["values"][r, -1]
        outside = [i for i in (x[r] == last).nonzero().squeeze(1).tolist() if i not in set(out["indices"][r].tolist())]
        if outside:
            out["indices"][r, -1] = outside[0]
            out["values"][r, -1] = x[r, outside[0]]
            break
    else:
        pytest.fail("no row with a tie across the cut")
    assert problem.check(params, inputs, out, ref) is None


def test_check_rejects_wrong_answers_with_a_precise_message(problem, tie_case):
    params, inputs, ref = tie_case
    x = inputs["x"]
    S = params["S"]

    out = _copy(ref)
    out["values"][5, 7] = out["values"][5, 7] + 1000.0
    msg = problem.check(params, inputs, out, ref)
    assert msg and "row 5, position 7" in msg

    out = _copy(ref)
    out["indices"][2, 3] = out["indices"][2, 4]
    out["values"][2, 3] = out["values"][2, 4]
    msg = problem.check(params, inputs, out, ref)
    assert msg and "row 2" in msg and "more than once" in msg

    for bad in (S, -1, 2**40):
        out = _copy(ref)
        out["indices"][1, 0] = bad
        msg = problem.check(params, inputs, out, ref)
        assert msg and "row 1, position 0" in msg and "outside" in msg

    # An index that points at another value (the value itself left right).
    out = _copy(ref)
    r = next(r for r in range(x.shape[0]) if bool((x[r] != x[r, 0]).any()))
    other = int((x[r] != out["values"][r, 0]).nonzero()[0, 0])
    out["indices"][r, 0] = other
    msg = problem.check(params, inputs, out, ref)
    assert msg and f"row {r}, position 0" in msg and "different value" in msg

    # Unsorted: the same elements, two of different value swapped.
    out = _copy(ref)
    r = next(r for r in range(x.shape[0]) if out["values"][r, 0] != out["values"][r, -1])
    for t in ("values", "indices"):
        out[t][r, 0], out[t][r, -1] = out[t][r, -1].item(), out[t][r, 0].item()
    msg = problem.check(params, inputs, out, ref)
    assert msg and f"row {r}" in msg and "not sorted" in msg

    # A sorted, consistent but wrong selection: the smallest elements.
    out = _copy(ref)
    low = torch.topk(x, params["K"], dim=-1, largest=False, sorted=True)
    out["values"], out["indices"] = low.values.flip(1).contiguous(), low.indices.flip(1).contiguous()
    msg = problem.check(params, inputs, out, ref)
    assert msg and "expected" in msg

    # Never written: NaN poison in the values.
    out = _copy(ref)
    out["values"][0, 0] = float("nan")
    assert "NaN" in problem.check(params, inputs, out, ref)


def test_check_judges_signed_zeros_by_value_but_the_element_bit_for_bit(problem):
    params = {"B": 1, "S": 4, "K": 2, "mode": "mixed"}
    x = torch.tensor([[-0.0, 0.0, -1.0, -2.0]])
    ref = {"values": torch.tensor([[0.0, -0.0]]), "indices": torch.tensor([[1, 0]])}
    either = {"values": torch.tensor([[-0.0, 0.0]]), "indices": torch.tensor([[0, 1]])}
    assert problem.check(params, {"x": x}, either, ref) is None
    lying = {"values": torch.tensor([[0.0, 0.0]]), "indices": torch.tensor([[0, 1]])}  # x[0] is -0.0
    assert "different value" in problem.check(params, {"x": x}, lying, ref)


# ---- The kernels: plans, constants, compile -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_loads_and_its_plan_resolves_for_every_case(problem, name):
    state = load_kernel(KERNELS[name])
    assert state.plan.problem == "topk"
    constants = state.constants
    assert constants["THREADS"] == 1024
    inputs = set(problem.make_inputs(case_params(problem, "small"), 0, "cpu"))
    buffers = inputs | {o.name for o in problem.info.outputs} | {s.name for s in state.plan.scratch}
    for case in problem.info.cases:
        params = dict(case.params)
        assert state.plan.supports_case(params), f"{name} does not support case {case.name}"
        env = {**params, **constants, **H200.facts()}
        (launch,) = resolve(state.plan, env, buffers)
        assert launch.grid == (params["B"], 1, 1) and launch.block == (1024, 1, 1)
        assert launch.shared + 2048 <= H200.smem_per_block_optin
        assert [a[1] for a in launch.args] == ["x", "values", "indices", params["B"], params["S"], params["K"]]
        if name == "radix_select":
            size = 1 << (params["K"] - 1).bit_length()
            assert launch.shared == 4 * (-(-params["S"] // 4) * 4) + 8 * size


def test_radix_select_names_its_mechanisms():
    constants = load_kernel(KERNELS["radix_select"]).constants
    for key in ("THREADS", "RADIX_BITS", "VEC", "LOAD_BATCH", "WARP_AGGREGATE", "WARP_SORT_STRIDES"):
        assert key in constants
    source = (KERNELS["radix_select"] / "kernel.cu").read_text()
    for helper in ("load_row_keys", "count_digits", "histogram_add", "select_bucket", "radix_select",
                   "block_exclusive_scan", "gather_selected", "bitonic_sort_desc", "store_topk"):
        assert re.search(rf"\b{helper}\s*\(", source), helper


def _ptxas(path: Path, tmp_path: Path) -> dict[str, int]:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        pytest.skip("nvcc not found")
    out = tmp_path / (path.parent.name + ".cubin")
    proc = subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-lineinfo", "-Xptxas", "-v",
                           str(path), "-o", str(out)], capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert out.read_bytes().startswith(b"\x7fELF")
    regs = re.search(r"Used (\d+) registers", log)
    smem = re.search(r"(\d+) bytes smem", log)
    spills = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert regs and spills, log
    return {"registers": int(regs.group(1)), "smem": int(smem.group(1)) if smem else 0,
            "stack": int(spills.group(1)), "spill_stores": int(spills.group(2)), "spill_loads": int(spills.group(3))}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_compiles_for_sm_90_without_spills(name, tmp_path):
    res = _ptxas(KERNELS[name] / "kernel.cu", tmp_path)
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0 and res["stack"] == 0, res
    # 1024 threads per block: more than 64 registers a thread and the block cannot launch at all.
    assert res["registers"] * 1024 <= 65536, res
    assert res["smem"] <= 2048, res  # the plans' supports bound reserves 2 KiB of static shared memory


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_static_check_passes_when_available(name):
    if importlib.util.find_spec("klineage.gate.static") is None:
        pytest.skip("klineage.gate.static does not exist yet")
    from klineage.gate.static import static_check

    result = static_check(load_kernel(KERNELS[name]))
    assert result.ok, result


# ---- CPU emulation of the radix-select kernel ---------------------------------------------------------------
# Every constant comes from the kernel source, so a change there is emulated too.

RS = load_kernel(KERNELS["radix_select"]).constants
THREADS, VEC, RADIX_BITS = RS["THREADS"], RS["VEC"], RS["RADIX_BITS"]
BINS, PASSES, BINS_PER_LANE = RS["RADIX_BINS"], RS["RADIX_PASSES"], RS["BINS_PER_LANE"]
M32 = np.uint64(0xFFFFFFFF)


def to_keys(row: torch.Tensor) -> np.ndarray:
    bits = row.contiguous().view(torch.int32).numpy().view(np.uint32).astype(np.uint64)
    return np.where(bits & np.uint64(0x80000000), ~bits & M32, bits | np.uint64(0x80000000))


def from_keys(keys: np.ndarray) -> torch.Tensor:
    keys = keys.astype(np.uint64)
    bits = np.where(keys & np.uint64(0x80000000), keys & np.uint64(0x7FFFFFFF), ~keys & M32)
    return torch.from_numpy(bits.astype(np.uint32).view(np.int32).copy()).view(torch.float32)


def traversal(S: int) -> list[np.ndarray]:
    """Per thread, the element indices for_each_key visits, in its order."""
    nvec, tail = S // VEC, S % VEC
    per_thread = []
    for t in range(THREADS):
        own = [VEC * j + c for j in range(t, nvec, THREADS) for c in range(VEC)]
        if t < tail:  # warp 0's lanes take the tail
            own.append(nvec * VEC + t)
        per_thread.append(np.array(own, dtype=np.int64))
    return per_thread


def select_bucket(hist: np.ndarray, prefix: int, mask: int, k_left: int, shift: int) -> tuple[int, int, int, bool]:
    """The selecting warp, lane by lane; exactly one lane must find the bucket."""
    winners = []
    lanes = []
    for lane in range(32):
        first = BINS - (lane + 1) * BINS_PER_LANE
        lanes.append((first, [int(hist[first + i]) for i in range(BINS_PER_LANE)]))
    totals = [sum(c) for _, c in lanes]
    for lane, (first, count) in enumerate(lanes):
        above = sum(totals[:lane])  # the shuffle scan's inclusive sum minus the lane's own
        for i in range(BINS_PER_LANE - 1, -1, -1):
            if above < k_left <= above + count[i]:
                left = k_left - above
                winners.append((prefix | ((first + i) << shift), mask | ((BINS - 1) << shift), left,
                                left == count[i] or shift == 0))
            above += count[i]
    assert len(winners) == 1, f"{len(winners)} lanes claimed the bucket"
    return winners[0]


def bitonic_in_warps(buf: np.ndarray, size: int, k_lo: int, k_hi: int) -> None:
    groups = size // THREADS if size > THREADS else 1
    for g in range(groups):
        e = g * THREADS + np.arange(THREADS)
        live_warp = (e & ~31) < size
        inside = e < size
        v = np.where(inside, buf[np.minimum(e, size - 1)], np.uint64(0))
        k = k_lo
        while k <= k_hi:
            j = min(k >> 1, RS["WARP_SORT_STRIDES"] // 2)
            while j > 0:
                other = v[np.arange(THREADS) ^ j]  # __shfl_xor_sync(v, j)
                keep_max = ((e & j) == 0) == ((e & k) == 0)
                v = np.where(keep_max, np.maximum(v, other), np.minimum(v, other))
                j >>= 1
            k <<= 1
        write = inside & live_warp
        buf[e[write]] = v[write]


def bitonic_shared_step(buf: np.ndarray, size: int, k: int, j: int) -> None:
    p = np.arange(size // 2)
    i = ((p & ~(j - 1)) << 1) | (p & (j - 1))
    touched = np.concatenate([i, i + j])
    assert len(np.unique(touched)) == size, "pairs must cover the buffer exactly once"
    a, b = buf[i].copy(), buf[i + j].copy()
    descending = (i & k) == 0
    swap = np.where(descending, a < b, a > b)
    buf[i] = np.where(swap, b, a)
    buf[i + j] = np.where(swap, a, b)


def bitonic_sort_desc(buf: np.ndarray, size: int) -> None:
    w = RS["WARP_SORT_STRIDES"]
    bitonic_in_warps(buf, size, 2, min(size, w))
    k = 2 * w
    while k <= size:
        j = k >> 1
        while j >= w:
            bitonic_shared_step(buf, size, k, j)
            j >>= 1
        bitonic_in_warps(buf, size, k, k)
        k <<= 1


def emulate_radix_select_row(row: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    S = row.numel()
    keys = to_keys(row)
    order = traversal(S)

    prefix, mask, ties, passes = 0, 0, K, 0
    for p in range(PASSES):
        shift = 32 - RADIX_BITS * (p + 1)
        candidate = (keys & np.uint64(mask)) == np.uint64(prefix)
        digits = ((keys[candidate] >> np.uint64(shift)) & np.uint64(BINS - 1)).astype(np.int64)
        hist = np.bincount(digits, minlength=BINS)
        prefix, mask, ties, done = select_bucket(hist, prefix, mask, ties, shift)
        passes += 1
        if done:
            break

    masked = keys & np.uint64(mask)
    above, equal = masked > np.uint64(prefix), masked == np.uint64(prefix)
    assert int(above.sum()) == K - ties and int(equal.sum()) >= ties
    counts = [(int(above[o].sum()) << 16) + int(equal[o].sum()) for o in order]
    assert int(equal.sum()) < 1 << 16  # the packed counts never carry
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])  # block_exclusive_scan

    size = 1 << (K - 1).bit_length()
    sel = np.zeros(size, dtype=np.uint64)
    written = np.zeros(K, dtype=np.int64)
    for own, off in zip(order, offsets):
        slot_above, tie_rank = int(off) >> 16, int(off) & 0xFFFF
        for idx in own:
            packed = (keys[idx] << np.uint64(32)) | np.uint64(~np.uint32(idx))
            if masked[idx] > prefix:
                sel[slot_above] = packed
                written[slot_above] += 1
                slot_above += 1
            elif masked[idx] == prefix:
                if tie_rank < ties:
                    sel[K - ties + tie_rank] = packed
                    written[K - ties + tie_rank] += 1
                tie_rank += 1
    assert (written == 1).all(), "every slot of the top K is written exactly once"

    bitonic_sort_desc(sel, size)
    assert (sel[1:] <= sel[:-1]).all()
    top = sel[:K]
    values = from_keys(top >> np.uint64(32))
    indices = torch.from_numpy((~(top & M32).astype(np.uint32)).astype(np.int64))
    return values, indices, passes


def emulate_naive_row(row: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    keys = to_keys(row).copy()
    out = []
    for _ in range(K):
        i = int(np.argmax(keys))  # the first maximum: the smallest index among equal keys
        out.append((keys[i], i))
        keys[i] = 0  # TAKEN
    return from_keys(np.array([k for k, _ in out])), torch.tensor([i for _, i in out], dtype=torch.int64)


def emulate(kernel, x: torch.Tensor, K: int) -> dict:
    vals, idxs = [], []
    for row in x:
        result = kernel(row, K)
        vals.append(result[0])
        idxs.append(result[1])
    return {"values": torch.stack(vals), "indices": torch.stack(idxs)}


def _emulators():
    return {"radix_select": lambda r, k: emulate_radix_select_row(r, k)[:2], "naive": emulate_naive_row}


@pytest.mark.parametrize("kernel", ["radix_select", "naive"])
@pytest.mark.parametrize("name", ["small", "narrow", "k1", "k_eq_s", "ties", "infinities", "ragged"])
def test_emulated_kernel_matches_torch_topk_on_the_cases(problem, kernel, name):
    params = case_params(problem, name)
    rows = {"ties": 24, "infinities": 24, "k1": 40, "ragged": 12}.get(name)
    for seed in (0, 1):
        inputs = problem.make_inputs(params, seed, "cpu")
        x = inputs["x"][:rows] if rows else inputs["x"]
        sub = {**params, "B": x.shape[0]}
        ref = {"values": torch.topk(x, params["K"], dim=-1).values}
        got = emulate(_emulators()[kernel], x, params["K"])
        assert problem.check(sub, {"x": x}, got, ref) is None


def test_emulated_radix_select_on_wide_k_and_mid_rows(problem):
    for name, rows in (("wide_k", 3), ("mid", 10), ("headline", 6)):
        params = case_params(problem, name)
        x = problem.make_inputs(params, 2, "cpu")["x"][:rows]
        got = emulate(_emulators()["radix_select"], x, params["K"])
        ref = {"values": torch.topk(x, params["K"], dim=-1).values}
        assert problem.check({**params, "B": rows}, {"x": x}, got, ref) is None


TRICKY_ROWS = {
    "all_equal": [3.5] * 37,
    "all_neg_inf": [float("-inf")] * 12,
    "all_pos_inf": [float("inf")] * 9,
    "signed_zeros": [0.0, -0.0, -0.0, 0.0, 1e-45, -1e-45, 0.0, -0.0],
    "inf_mix": [float("-inf"), 1.0, float("inf"), -1.0, float("inf"), float("-inf"), 0.0, 2.0, float("-inf")],
    "one": [-7.25],
    "tail_only": [2.0, -3.0, 2.0],
    "one_vector_and_tail": [1.0, 5.0, 5.0, -2.0, 5.0],
    "extremes": [3.4028235e38, -3.4028235e38, 1.1754944e-38, -1.1754944e-38, 1e-45, -1e-45, float("inf"),
                 float("-inf")],
}


@pytest.mark.parametrize("kernel", ["radix_select", "naive"])
@pytest.mark.parametrize("label", sorted(TRICKY_ROWS))
def test_emulated_kernel_on_tricky_rows_for_every_k(problem, kernel, label):
    row = torch.tensor(TRICKY_ROWS[label], dtype=torch.float32)
    x = row.unsqueeze(0)
    for K in range(1, row.numel() + 1):
        got = emulate(_emulators()[kernel], x, K)
        ref = {"values": torch.topk(x, K, dim=-1).values}
        params = {"B": 1, "S": row.numel(), "K": K, "mode": "mixed"}
        assert problem.check(params, {"x": x}, got, ref) is None, (label, K)


def test_emulated_radix_select_exits_early_and_runs_all_passes_when_needed():
    # K == S: the lowest non-empty bucket of the first digit is wholly needed.
    row = torch.randn(1000, generator=torch.Generator().manual_seed(7))
    assert emulate_radix_select_row(row, 1000)[2] == 1
    # A constant row: one bucket per pass holds everything, the cut lies inside it until the last digit.
    assert emulate_radix_select_row(torch.full((4096,), 1.5), 512)[2] == PASSES
    # Distinct values close together: the last digit decides.
    close = torch.arange(4096, dtype=torch.float32).mul_(1e-3).add_(1000.0)
    values, _, passes = emulate_radix_select_row(close, 100)
    assert torch.equal(values, torch.topk(close, 100).values) and passes >= 3


def test_emulated_radix_select_picks_the_same_elements_every_time(problem):
    params = case_params(problem, "ties")
    x = problem.make_inputs(params, 0, "cpu")["x"][:4]
    a = emulate(_emulators()["radix_select"], x, params["K"])
    b = emulate(_emulators()["radix_select"], x, params["K"])
    assert torch.equal(a["indices"], b["indices"])
    # Output order is total: value descending, then index ascending among equal values.
    for r in range(x.shape[0]):
        v, i = a["values"][r], a["indices"][r]
        same = v[1:] == v[:-1]
        assert (i[1:][same] > i[:-1][same]).all()
