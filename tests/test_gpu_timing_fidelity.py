"""Timings that cannot mislead, on a real GPU (skipped without one; issue 29).

A vendor that burns a random amount of host time before each launch must end `unsettled`, or settle
to the true ratio (timed from a CUDA graph, where the host's time is gone); never a confident wrong
ratio. And the guard check sees a kernel that copies one element past its input into one past its
output (distinct poison for every guard).
"""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from bench_tools import bench_script
from klineage import corpus
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Sanitize
from klineage.gate.timing import Settlement
from klineage.gate.verdict import Reason, Status
from klineage.kernel import load_kernel

pytestmark = pytest.mark.gpu

CASES = ["mid_aligned", "small"]  # a kernel of about ten microseconds: where host time shows most
POLICY = GatePolicy(sanitize=Sanitize.NEVER, seeds=1)

FIDELITY = bench_script("timing_fidelity")  # the noisy problems are the benchmark's own


@pytest.fixture(scope="module")
def problems(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("problems")
    quiet = root / "quiet.py"
    quiet.write_text(Path(corpus.problem_path("row_softmax")).read_text(encoding="utf-8") +
                     '\nHEADLINE = "mid_aligned"\n', encoding="utf-8")
    return {"quiet": quiet, **{name: FIDELITY.noisy_problem(root, name, "mid_aligned") for name in FIDELITY.NOISY}}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> GateCache:
    return GateCache(tmp_path_factory.mktemp("gate-cache"), None)


def expert():
    return corpus.kernel_entry("row_softmax/warp_vec4").load()


def test_a_host_bound_vendor_is_timed_from_a_graph_and_never_settles_eagerly(problems, cache):
    noisy = run_gate(problems["noisy_vendor"], expert(), cases=CASES, policy=POLICY, cache=cache)
    assert noisy.status is Status.PASSED, noisy.describe()
    launch = noisy.profile["vendor_launch"]
    assert launch["host_bound"] and launch["host_us_median"] > 100, launch
    assert launch["graph"] == "captured"
    assert {"candidate", "vendor", "vendor_graph"} <= set(noisy.profile["contenders"])
    settlement = noisy.profile["settlement"]
    assert settlement["ratios"]["vs_vendor"] == "unsettled", settlement  # the eager ratio is never claimed
    if noisy.settlement is Settlement.UNSETTLED:
        assert noisy.paired_ratio("vs_vendor_graph") is None
        return
    quiet = run_gate(problems["quiet"], expert(), cases=CASES, policy=POLICY, cache=cache)
    assert quiet.status is Status.PASSED, quiet.describe()
    if quiet.settlement is Settlement.SETTLED:  # the truth, where it could be measured
        truth = quiet.paired_ratio("vs_vendor").overall
        graph = noisy.paired_ratio("vs_vendor_graph").overall
        assert abs(graph / truth - 1) <= 0.10, (graph, truth)


def test_a_vendor_that_cannot_be_captured_ends_unsettled_and_is_measured_again_later(problems, cache):
    verdict = run_gate(problems["noisy_vendor_uncapturable"], expert(), cases=CASES, policy=POLICY, cache=cache)
    assert verdict.status is Status.PASSED, verdict.describe()
    assert verdict.profile["vendor_launch"]["graph"].startswith("vendor not timed from a CUDA graph")
    assert "vendor_graph" not in verdict.profile["contenders"]
    assert verdict.settlement is Settlement.UNSETTLED, verdict.profile["settlement"]
    settlement = verdict.profile["settlement"]
    assert [a["trials"] for a in settlement["attempts"]] == [3, 6]  # warmed the clocks, then more trials
    assert any(r.startswith("vendor spread") for r in settlement["reasons"])
    assert verdict.paired_ratio("vs_vendor") is None and "timing: unsettled" in verdict.describe()
    assert cache.lookup(verdict.provenance["key"]) is None  # not final: the next call measures again
    assert cache.lookup(verdict.provenance["key"], final_only=False)[0].unsettled


def test_a_steady_expert_settles_against_the_bundled_vendor(cache):
    # row_softmax's headline is not among CASES: name the timing case, or nothing is timed
    policy = replace(POLICY, timing_case=CASES[0])
    verdict = run_gate(corpus.problem_path("row_softmax"), expert(), cases=CASES, policy=policy, cache=cache)
    assert verdict.status is Status.PASSED, verdict.describe()
    settlement = verdict.profile["settlement"]
    assert set(settlement["spreads"]) == {"candidate", "vendor"} and settlement["limits"]["spread"] > 0
    assert verdict.settlement is Settlement.SETTLED or len(settlement["attempts"]) == 2  # retried before giving up
    assert verdict.provenance["gate_version"] == 2 and verdict.provenance["key_parts"]["gate"] == 2


OOB_COPY = textwrap.dedent('''\
    // Correct softmax, one thread per row; the last thread also copies x[rows*cols] into
    // y[rows*cols]: one element past its input into one past its output.
    extern "C" __global__ void row_softmax_copy(const float* __restrict__ x, float* __restrict__ y,
                                                int rows, int cols, int copy_past_end)
    {
        const int row = blockIdx.x * blockDim.x + threadIdx.x;
        if (row >= rows) return;
        const float* xr = x + static_cast<size_t>(row) * cols;
        float* yr = y + static_cast<size_t>(row) * cols;
        float m = -INFINITY;
        for (int c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
        double s = 0.0;
        for (int c = 0; c < cols; ++c) s += exp(static_cast<double>(xr[c] - m));
        for (int c = 0; c < cols; ++c) yr[c] = static_cast<float>(exp(static_cast<double>(xr[c] - m)) / s);
        if (copy_past_end && row == rows - 1) {
            const size_t end = static_cast<size_t>(rows) * cols;
            y[end] = x[end];
        }
    }
    ''')


def copy_kernel(root: Path, copy_past_end: int):
    folder = root / f"copy_{copy_past_end}"
    folder.mkdir()
    (folder / "kernel.cu").write_text(OOB_COPY, encoding="utf-8")
    (folder / "launch.toml").write_text(textwrap.dedent(f'''\
        name = "row_softmax_copy_{copy_past_end}"
        problem = "row_softmax"
        source = "kernel.cu"
        arch = "sm_90"
        description = "One thread per row{', and a copy from past the end of x to past the end of y' * copy_past_end}."
        nvcc_flags = ["-O3"]

        [[launch]]
        entry = "row_softmax_copy"
        grid = ["cdiv(rows, 128)"]
        block = [128]
        shared = 0
        args = ["x", "y", {{ scalar = "rows", type = "i32" }}, {{ scalar = "cols", type = "i32" }},
                {{ scalar = "{copy_past_end}", type = "i32" }}]
        '''), encoding="utf-8")
    return load_kernel(folder)


def test_a_copy_from_past_the_input_to_past_the_output_is_an_out_of_bounds_write(tmp_path, cache):
    policy = GatePolicy(sanitize=Sanitize.NEVER, timing=False)
    clean = run_gate(corpus.problem_path("row_softmax"), copy_kernel(tmp_path, 0), cases=["small", "narrow"],
                     policy=policy, cache=cache)
    assert clean.status is Status.PASSED, clean.describe()  # the same kernel without the copy is right
    copying = run_gate(corpus.problem_path("row_softmax"), copy_kernel(tmp_path, 1), cases=["small", "narrow"],
                       policy=policy, cache=cache)
    assert copying.status is Status.REJECTED
    assert copying.reason is Reason.OUT_OF_BOUNDS_WRITE, copying.findings
    assert "wrote outside buffer(s) y" in copying.findings[0].message
