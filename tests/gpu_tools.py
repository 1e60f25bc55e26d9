"""What the GPU tests of the Hopper experts share: a pycuda module of probe kernels built for
sm_90a in torch's primary context, a launcher that packs a probe's parameters as the runner does,
and the gate on the expert (every case it supports, timing against the vendor and a baseline
expert, the target ratio, memcheck and racecheck).

Importing this module needs neither a GPU nor torch nor pycuda (the CPU tests build the probes too);
only the functions that touch the device import them."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from klineage import corpus
from klineage.gate.cache import GateCache
from klineage.gate.params import as_pycuda_words, pack_parameters, read_kernel_parameters
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Sanitize
from klineage.gate.verdict import Status
from klineage.kernel import KernelState
from klineage.toolchain import find_toolchain

# ---------------------------------------------------------------------------------------------
# Probe kernels
# ---------------------------------------------------------------------------------------------


def build_probes(work: Path, source: str, *flags: str) -> tuple[bytes, str]:
    """`source` written to work/probes.cu and built into a cubin for sm_90a (with `flags`); the
    cubin and the build's stderr."""
    toolchain = find_toolchain()
    (work / "probes.cu").write_text(source)
    build = subprocess.run([toolchain.nvcc, "-cubin", "-gencode=arch=compute_90a,code=sm_90a", *flags,
                            "-o", "probes.cubin", "probes.cu"], cwd=work, capture_output=True, text=True,
                           env=toolchain.environment(work), timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    return (work / "probes.cubin").read_bytes(), build.stderr


@contextlib.contextmanager
def probe_driver(work: Path, source: str, *flags: str):
    """torch's primary context shared with pycuda (as the runner does), and the probes' module:
    yields (pycuda.driver, torch, module, cubin)."""
    import pycuda.driver as drv
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    drv.init()
    context = drv.Device(torch.cuda.current_device()).retain_primary_context()
    context.push()
    try:
        cubin, _ = build_probes(work, source, *flags)
        yield drv, torch, drv.module_from_buffer(cubin), cubin
    finally:
        context.pop()


def launch_probe(drv, module, cubin: bytes, name: str, args, pointers, maps, shared: int = 0) -> None:
    """One block of 128 threads of probe `name`, its parameters packed at the offsets its cubin
    declares; waits for it."""
    declared = read_kernel_parameters(cubin, name)
    assert declared is not None
    words = as_pycuda_words(pack_parameters(args, pointers, maps, declared, name))
    module.get_function(name)(*words, block=(128, 1, 1), grid=(1, 1), shared=shared)
    drv.Context.synchronize()


# ---------------------------------------------------------------------------------------------
# The gate
# ---------------------------------------------------------------------------------------------


def kernel_named(name: str) -> KernelState:
    """A bundled kernel by name, or a kernel folder (a variant outside the corpus) by path."""
    return corpus.kernel_entry(name).load()


def gate_cache(tmp_path_factory) -> GateCache:
    """A module's own gate cache, reading (and recording into) KLINEAGE_RECORDED_DIR where it is set."""
    recorded = os.environ.get("KLINEAGE_RECORDED_DIR")
    return GateCache(tmp_path_factory.mktemp("gate-cache"), recorded or None)


@pytest.fixture(scope="module", name="cache")
def module_cache(tmp_path_factory) -> GateCache:
    """The test module's own gate cache (gate_cache), as the fixture `cache` of a module that imports this."""
    return gate_cache(tmp_path_factory)


def timed_gate(problem: Path, expert: str, baseline: str, cache: GateCache, record: bool = True):
    """The full gate on `expert` with timing against the vendor and `baseline`; sanitizers run
    separately (assert_clean_under_the_sanitizers). Recorded where KLINEAGE_RECORDED_DIR is set and
    `record` (off for kernels outside the corpus: the importer links every recording to a corpus kernel)."""
    return run_gate(problem, kernel_named(expert), against=kernel_named(baseline),
                    cache=cache, policy=GatePolicy(sanitize=Sanitize.NEVER),
                    record=record and bool(os.environ.get("KLINEAGE_RECORDED_DIR")))


def gate_fixtures(problem: Path, expert: str, baseline: str, record: bool = True):
    """A test module's fixtures `cache` (gate_cache) and `timed` (timed_gate of `expert` against the
    vendor and `baseline`), both module-scoped: `cache, timed = gate_fixtures(...)` at module level."""

    @pytest.fixture(scope="module", name="cache")
    def cache_fixture(tmp_path_factory) -> GateCache:
        """The module's own gate cache (gpu_tools.gate_cache)."""
        return gate_cache(tmp_path_factory)

    @pytest.fixture(scope="module", name="timed")
    def timed_fixture(cache):
        """The full gate with timing against the vendor and the baseline; sanitizers run separately."""
        return timed_gate(problem, expert, baseline, cache, record)

    return cache_fixture, timed_fixture


def assert_passes_every_case(timed, cases: set[str], skipped: set[str] = frozenset()) -> None:
    """The gate passed, ran exactly `cases` and the candidate passed each; `skipped` are outside its domain."""
    assert timed.status is Status.PASSED, timed.findings
    assert set(timed.cases) == cases
    assert {r["case"] for r in timed.correctness if r["passed"] and r["kernel"] == "candidate"} == cases
    assert set(timed.domain["skipped"]) == set(skipped)


def timing_ratios(timed, expert: str, vendor: str, baseline: str, case: str | None = "headline",
                  graph: bool = False) -> tuple[float, float]:
    """The candidate's overall speed ratios (vs the vendor, vs the baseline expert) from a passed,
    timed gate (on `case`, where one is named), printed with the medians and the roofline fraction
    (run with -s to see them); the fraction of the roofline is a real one. `graph`: the problem
    also times its vendor replayed from a CUDA graph (VENDOR_TIMING), printed beside the eager one."""
    assert timed.status is Status.PASSED, timed.findings
    profile = timed.profile
    if case is not None:
        assert profile["case"] == case
    expected = {"candidate", "baseline", "vendor"} | ({"vendor_graph"} if graph else set())
    # the gate adds the graph replay by itself where the eager vendor launch proved host-bound
    assert expected <= set(profile["contenders"]) <= expected | {"vendor_graph"}, profile.get("notes")
    vs_vendor = profile["ratios"]["vs_vendor"]["overall"]
    vs_baseline = profile["ratios"]["vs_baseline"]["overall"]
    graph_ratio = profile["ratios"].get("vs_vendor_graph")
    from_graph = f", {graph_ratio['overall']:.3f}x from a CUDA graph" if graph_ratio else ""
    medians = {role: round(c["median_us"], 1) for role, c in profile["contenders"].items()}
    print(f"\n{expert} on {timed.environment.get('gpu')}: median us {medians}; "
          f"{vs_vendor:.3f}x {vendor}{from_graph}, {vs_baseline:.3f}x {baseline}; "
          f"{profile['roofline']['fraction']['candidate']:.2f} of the roofline")
    assert 0 < profile["roofline"]["fraction"]["candidate"] <= 1.05
    return vs_vendor, vs_baseline


def assert_reaches_target(timed, target: float) -> None:
    ratio = timed.profile["ratios"]["vs_vendor"]
    assert ratio["overall"] >= target, ratio


def assert_clean_under_the_sanitizers(problem: Path, expert: str, cache: GateCache, cases: list[str]) -> None:
    """The gate on `cases` with memcheck and racecheck and without timing: passed, both clean."""
    verdict = run_gate(problem, kernel_named(expert), cache=cache, cases=cases,
                       policy=GatePolicy(sanitize=Sanitize.ALWAYS, timing=False))
    assert verdict.status is Status.PASSED, verdict.findings
    assert verdict.sanitizer["memcheck"]["status"] == "clean", verdict.sanitizer["memcheck"]
    assert verdict.sanitizer["racecheck"]["status"] == "clean", verdict.sanitizer["racecheck"]


def forwarded(state: KernelState, name: str) -> KernelState:
    """`state` after transform `name`'s forward at the first site its analysis finds."""
    from klineage.transforms import get

    transform = get(name)
    (site, *_) = transform.forward_sites(state)
    return transform.forward(state, site).state


def passes_against(problem: Path, candidate: KernelState, baseline: KernelState, cases: set[str], cache: GateCache,
                   what: str, against: str, vendor: str = "torch") -> None:
    """`candidate` gated against `baseline` on `problem`: every case of `cases` passes (under the sanitizer), and
    its ratios against the baseline and the vendor are printed with whether the timing settled (-s)."""
    verdict = run_gate(problem, candidate, against=baseline, cache=cache)
    assert_passes_every_case(verdict, cases)
    print(said_ratios(verdict, what, against, vendor=vendor))


def said_ratios(verdict, what: str, against: str, vendor: str = "torch") -> str:
    """One line for -s: the candidate's speed against the baseline it was gated with and the vendor on the timed
    case, the median times behind them, and whether the timing settled."""
    profile = verdict.profile
    ratios = profile["ratios"]
    medians = {role: round(c["median_us"], 1) for role, c in profile["contenders"].items()}
    return (f"\n{what} on {verdict.environment.get('gpu')}, {profile['case']} case: "
            f"{ratios['vs_baseline']['overall']:.3f}x {against}, {ratios['vs_vendor']['overall']:.3f}x {vendor} "
            f"(median us {medians}); timing {profile['settlement']['state']}")
