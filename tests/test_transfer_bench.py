"""The transfer benchmark's held-out operators (bench/transfer/): every naive kernel passes the compile-only
gate on its own problem (static check, nvcc, SASS features, the plan resolved for every case), and so
does every kernel an analysis forward makes of it: a warp per row, 16-byte vectors, a shared tile. Every
operator's forwards find their sites in the default run; the compiles are sampled (tests/sampled.py)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from bench_tools import bench_script, session_stage
from klineage.config import GateMode, recorded_dir
from klineage.gate.pipeline import run_gate
from klineage.gate.verdict import Status
from klineage.kernel import load_kernel
from klineage.skills.library import bundled_library
from klineage.specialize import specialized
from klineage.transforms import catalog
from klineage.transforms.base import Placement
from sampled import sampled

BENCH = Path(__file__).resolve().parent.parent / "bench" / "transfer"
OPERATORS = sorted(p.name for p in BENCH.iterdir() if (p / "problem.py").is_file())
# operator -> the analysis forwards that must find a site in its naive kernel (the rest must find none); every
# naive kernel reads a const array it never writes (ldg_subscript); their data is 32-bit (no scalarize_half_packs)
# a row's reductions a warp a row or a block a row (a block combines no running sum)
_ROWS = {"serialize_reduction", "serialize_block_reduction"}
_BY_STRUCTURE = {"rms_norm": _ROWS, "layer_norm": _ROWS, "log_softmax": _ROWS, "l2_normalize": _ROWS,
            "batched_matvec": _ROWS | {"unsplit_reduction"}, "cumsum": {"serialize_reduction"},
            "row_argmax": _ROWS | {"unsplit_reduction"},  # one loop each: its chunks can be split
            "gelu_mul": {"scalarize_elementwise", "uncoarsen_grid_stride"},
            # its two bias corrections divide by constants (1 - beta^t), folded into products by their reciprocals
            "adam_update": {"scalarize_elementwise", "uncoarsen_grid_stride", "reciprocal_constant"},
            "transpose": {"untile_transpose", "uncoarsen_grid_stride"},  # its 2-D copy read flat (`_flatten`)
            # its guard `i >= (long long)rows * cols` a count formed in 64 bits: its output stores packed too
            "gather_rows": {"uncoarsen_grid_stride", "scalarize_row_gather", "scalarize_elementwise"},
            # its table-zeroing kernel, both; its adds four to a vector atomicAdd where a row holds whole packs
            "scatter_add": {"scalarize_elementwise", "uncoarsen_grid_stride", "scalarize_row_gather"},
            "bias_relu": {"scalarize_elementwise", "scalarize_row_gather", "uncoarsen_grid_stride"},  # 2-D, read flat
            # a thread's grid-stride sum: its atomic aggregated a warp at a time, its loop walked as 16-byte vectors
            # and its grid, capped at 256 blocks, sized to the GPU, or its loop unrolled
            "mse_loss": {"unaggregate_atomics", "scalarize_grid_stride", "fix_grid_cap", "reroll_grid_stride"},
            "masked_scale": {"scalarize_elementwise", "uncoarsen_grid_stride"},
            # a grid-stride loop: read as one thread per element, or walked as 16-byte vectors as it is, or unrolled;
            # its fixed grid of 1024 blocks sized to the GPU
            "softplus": {"scalarize_elementwise", "scalarize_grid_stride", "fix_grid_cap", "reroll_grid_stride"},
            "bmm_small": {"untile_matmul"},  # a batch of small products, one layer of blocks per matrix
            "bias_grad": _ROWS | {"serialize_column_reduction", "unsplit_reduction"},  # down columns
            # templates over the element type, as PyTorch extensions write them: read as their float instance
            # (hardswish's `/ scalar_t(6)` a division by `float(6)`, a constant)
            "hardswish": {"scalarize_elementwise", "uncoarsen_grid_stride", "reciprocal_constant"},
            "row_logsumexp": _ROWS}
TEMPLATES = ("hardswish", "row_logsumexp")  # written as templates; run on the H200 only
EXPECTED = {operator: _BY_STRUCTURE.get(operator, set()) | {"ldg_subscript"} for operator in OPERATORS}


def test_at_least_ten_held_out_operators_outside_the_corpus():
    from klineage import config

    assert len(OPERATORS) >= 10
    corpus_operators = {p.stem for p in (config.corpus_dir() / "problems").glob("*.py")}
    assert not corpus_operators & set(OPERATORS)


def _analysis_forwards(naive) -> dict[str, list]:
    """transform name -> the kernels each analysis forward makes of `naive`, one a site; a template read as its
    launched instance, as every planner reads it (`klineage.specialize`)."""
    found, instance = {}, specialized(naive).state
    for transform in (t for t in catalog().values() if t.placement is Placement.ANALYSIS):
        for anchor in transform.forward_sites(instance):
            found.setdefault(transform.name, []).append(transform.forward(instance, anchor).state)
    return found


@pytest.mark.parametrize("operator", OPERATORS)
def test_the_analysis_forwards_find_their_sites_in_the_naive_kernel(operator):
    naive = load_kernel(BENCH / operator / "naive")
    found = _analysis_forwards(naive)
    assert set(found) == EXPECTED.get(operator, set())
    for states in found.values():
        assert all(state.fingerprint != naive.fingerprint for state in states)


# The compiles sampled: the default run keeps operators whose forwards together are every analysis forward that
# finds a site in some naive kernel (a test keeps it so), and a template (its instance's forwards compile as plain
# kernels); the others compile under -m slow.
COMPILED_BY_DEFAULT = ("bias_grad", "bias_relu", "bmm_small", "hardswish", "mse_loss", "transpose")


def test_the_operators_compiled_by_default_cover_every_expected_forward():
    assert set().union(*(EXPECTED[o] for o in COMPILED_BY_DEFAULT)) == set().union(*EXPECTED.values())


@pytest.mark.parametrize("operator", sampled(OPERATORS, keep=COMPILED_BY_DEFAULT))
def test_naive_and_analysis_forwards_pass_the_compile_only_gate(operator, gate_cache):
    problem = BENCH / operator / "problem.py"
    naive = load_kernel(BENCH / operator / "naive")
    verdict = run_gate(problem, naive, mode=GateMode.COMPILE_ONLY, cache=gate_cache)
    assert verdict.status is Status.COMPILED, verdict.findings
    found = _analysis_forwards(naive)
    assert set(found) == EXPECTED.get(operator, set())
    for states in found.values():
        for state in states:
            forwarded = run_gate(problem, state, mode=GateMode.COMPILE_ONLY, cache=gate_cache)
            assert forwarded.status is Status.COMPILED, forwarded.findings


def test_the_gpu_session_transfer_stage_writes_a_part_per_operator(gate_cache, tmp_path):
    """transfer:OP,OP runs bench/transfer_eval.py once an operator, each its own part, with the session's
    budget and jobs (python3 a shim that turns the GPU gate into the compile gate: no GPU here)."""
    recorded = set(recorded_dir().rglob("*.json*"))
    done, argv = session_stage("transfer:gelu_mul,rms_norm@200", tmp_path,
                               {"TRANSFER_BUDGET": "1", "TRANSFER_JOBS": "2"})
    assert done.returncode == 0, done.stdout + done.stderr
    # --record keeps GPU verdicts only: a compile-only gate (the shim's) leaves the committed store alone
    assert set(recorded_dir().rglob("*.json*")) == recorded
    assert "=== transfer:gelu_mul,rms_norm" in done.stdout and "limit 200 s" in done.stdout
    assert argv[:3] == ["bench/transfer_eval.py", "--gate", "gpu"] and "--record" in argv
    assert argv[argv.index("--budget") + 1] == "1" and argv[argv.index("--jobs") + 1] == "2"
    parts = tmp_path / "out" / "results" / "transfer"
    assert sorted(p.name for p in parts.iterdir()) == ["gelu_mul.json", "gelu_mul.log.jsonl", "rms_norm.json",
                                                       "rms_norm.log.jsonl"]
    for name in ("gelu_mul", "rms_norm"):
        part = json.loads((parts / f"{name}.json").read_text())
        assert list(part["runs"]) == [name] and part["provenance"]["budget"] == 1
        assert part["partial"] == f"ran 1 of {len(OPERATORS)} operators"
        assert {r["workload"] for r in part["rows"]} == {name}
        # each run's progress as it happened, beside its part: the strategies that ran, each from its start kernel
        log = [json.loads(line) for line in (parts / f"{name}.log.jsonl").open()]
        assert {line["workload"] for line in log} == {name}
        assert {line["strategy"] for line in log} == set(part["runs"][name])
        assert sum("gating the start kernel" in line.get("message", "") for line in log) == len(part["runs"][name])


def test_pending_names_what_no_committed_part_measured_on_this_card_with_these_settings(monkeypatch, capsys):
    """The committed parts: with the code check, budget 8, 3 rivals and the measured order, the H100 ran the 18
    operators of sessions 50 and 52, hardswish in session 61 and row_logsumexp in session 62: all twenty; the H200
    seventeen (two in session 51, six in session 59: the templates and four row operators, and thirteen in session
    60), all but bias_relu, bmm_small and mse_loss; without the check, the H200's measured parts of session 49 hold
    six."""
    transfer = bench_script("transfer_eval")
    parts = sorted(str(p) for p in (BENCH.parent / "results" / "transfer-parts").glob("*/*.json"))
    settings = ["--budget", "8", "--rivals", "3", "--ordering", "measured"]

    def pending(gpu: str, *more: str) -> list[str]:
        monkeypatch.setenv("KLINEAGE_GPU_NAME", gpu)
        assert transfer.main(["--pending", *parts, *settings, *more]) == 0
        return [op for op in capsys.readouterr().out.strip().split(",") if op]

    assert pending("NVIDIA H100 80GB HBM3") == []
    assert pending("NVIDIA H200") == ["bias_relu", "bmm_small", "mse_loss"]
    measured_s49 = ("bias_grad", "bias_relu", "bmm_small", "masked_scale", "mse_loss", "softplus")
    assert pending("NVIDIA H200", "--code-check", "none") == [op for op in OPERATORS if op not in measured_s49]
    assert pending("NVIDIA H200", "--budget", "24") == OPERATORS  # no part ran that budget


def _part(name: str, library: float | None, unconditioned: float, budget: int = 8, stop: str = "no_candidate",
          commit: str = "aaaaaaa"):
    """A part as bench/transfer_eval.py writes it for one operator (rows and runs; what merge reads)."""
    runs = {"library": {"stop": stop, "speedup": library or 1.0},
            "unconditioned_random": {"stop": stop, "speedup": unconditioned},
            "unconditioned_greedy": {"stop": stop, "speedup": 1.0}}
    rows = [{"workload": name, "kernel": "library_best", "vs": vs, "ratio": ratio, "correct": library is not None}
            for vs, ratio in (("naive", library), ("eager", None))]
    return {"provenance": {"gpu": "NVIDIA H200", "gate": "gpu", "budget": budget, "seed": 0,
                           "library": "corpus/library/library.json", "git_commit": commit, "date": "2026-12-02"},
            "rows": rows, "runs": {name: runs}}


def test_a_partial_merge_keeps_the_headline_null_and_says_what_it_measured():
    transfer = bench_script("transfer_eval")
    parts = [_part("rms_norm", 8.0, 4.0), _part("gelu_mul", 2.0, 2.0),
             _part("adam_update", None, 1.0, stop="start_failed")]
    document = transfer.merged(parts, OPERATORS)
    assert document["library_geomean_vs_naive"] is None and document["vs_unconditioned_geomean"] is None
    measured = document["where_measured"]
    assert measured["library_geomean_vs_naive"] == {"value": pytest.approx(4.0), "of": len(OPERATORS),
                                                   "operators": ["gelu_mul", "rms_norm"]}
    # a run that could not gate its start kernel measured no speedup: it is left out, not counted as 1
    assert measured["vs_unconditioned_geomean"]["operators"] == ["gelu_mul", "rms_norm"]
    assert measured["vs_unconditioned_geomean"]["value"] == pytest.approx(2 ** 0.5)
    assert measured["library_beats_eager_fraction"] == {"value": None, "operators": [], "of": len(OPERATORS)}


def test_parts_run_with_other_settings_are_not_merged():
    transfer = bench_script("transfer_eval")
    with pytest.raises(ValueError, match=r"the part of gelu_mul ran with other settings \(budget 12, not 8\)"):
        transfer.merged([_part("rms_norm", 8.0, 4.0), _part("gelu_mul", 2.0, 2.0, budget=12)], OPERATORS)


def test_parts_drawn_from_different_cards_are_not_merged():
    """Two libraries at one path (a library file rebuilt or admitted again) differ by their content fingerprint."""
    transfer = bench_script("transfer_eval")
    first, second = _part("rms_norm", 8.0, 4.0), _part("gelu_mul", 2.0, 2.0)
    first["provenance"]["library_fingerprint"], second["provenance"]["library_fingerprint"] = "a" * 64, "b" * 64
    with pytest.raises(ValueError, match=r"the part of gelu_mul ran with other settings \(library_fingerprint 'bbb"):
        transfer.merged([first, second], OPERATORS)



def test_parts_of_two_orderings_are_not_merged():
    """How the library strategy ordered its rounds (Ordering) is a setting; a part from before orderings ran them
    as planned."""
    transfer = bench_script("transfer_eval")
    older, measured = _part("rms_norm", 8.0, 4.0), _part("gelu_mul", 2.0, 2.0)
    measured["provenance"]["ordering"] = "measured"
    with pytest.raises(ValueError, match=r"ordering 'measured', not 'as_planned'"):
        transfer.merged([older, measured], OPERATORS)
    planned = _part("gelu_mul", 2.0, 2.0)
    planned["provenance"]["ordering"] = "as_planned"
    assert transfer.merged([older, planned], OPERATORS)["operators"] == 2

def test_a_run_records_the_library_it_drew_on_and_its_fingerprint(tmp_path):
    """--library: the path as given (relative inside the checkout) and what its cards were."""
    from klineage.fingerprint import sha256_json
    from klineage.skills.library import load_library

    transfer = bench_script("transfer_eval")
    library = BENCH.parent / "results" / "transfer-library.json"
    out = tmp_path / "part.json"
    assert transfer.main(["--gate", "compile", "--budget", "1", "--only", "gelu_mul", "--library", str(library),
                          "--out", str(out)]) == 0
    provenance = json.loads(out.read_text())["provenance"]
    assert provenance["library"] == "bench/results/transfer-library.json"
    assert provenance["library_fingerprint"] == sha256_json(load_library(library).to_dict())
    assert provenance["library_fingerprint"] != sha256_json(load_library(bundled_library()).to_dict())


def test_a_remeasured_operator_replaces_the_earlier_one_only_when_asked():
    transfer = bench_script("transfer_eval")
    earlier = transfer.merged([_part("rms_norm", 8.0, 4.0), _part("gelu_mul", 2.0, 2.0)], OPERATORS)
    again = _part("rms_norm", 6.0, 3.0, commit="bbbbbbb")
    with pytest.raises(ValueError, match=r"operator\(s\) rms_norm are in two parts \(--replace takes the later\)"):
        transfer.merged([earlier, again], OPERATORS)
    document = transfer.merged([earlier, again], OPERATORS, replace=True)
    assert [r["ratio"] for r in document["rows"] if r["workload"] == "rms_norm" and r["vs"] == "naive"] == [6.0]
    assert document["runs"]["rms_norm"]["library"]["speedup"] == 6.0
    assert document["where_measured"]["library_geomean_vs_naive"]["value"] == pytest.approx(12 ** 0.5)
    # which commit measured which operator survives the merge of a merged document
    assert document["provenance"]["parts"] == [
        {"operators": ["gelu_mul"], "git_commit": "aaaaaaa", "date": "2026-12-02"},
        {"operators": ["rms_norm"], "git_commit": "bbbbbbb", "date": "2026-12-02"}]


def test_the_ceiling_is_the_roofline_floor_over_the_naive_kernels_time():
    """What a kernel at the memory bound would gain over naive, per operator, in the geometric mean; null in the
    headline while some operator's naive kernel has no settled timing."""
    transfer = bench_script("transfer_eval")
    parts = [_part("rms_norm", 8.0, 4.0), _part("gelu_mul", 2.0, 2.0)]
    for part, fraction in zip(parts, (0.125, 0.5)):
        name = next(iter(part["runs"]))
        part["rows"].append({"workload": name, "kernel": "naive", "vs": "eager", "ratio": 0.5, "correct": True,
                             "floor_fraction": fraction})
    measured = transfer.merged(parts, OPERATORS)["where_measured"]["ceiling_geomean_vs_naive"]
    assert measured == {"value": pytest.approx(4.0), "operators": ["gelu_mul", "rms_norm"], "of": len(OPERATORS)}
    whole = transfer.merged(parts, ["gelu_mul", "rms_norm"])
    assert whole["ceiling_geomean_vs_naive"] == pytest.approx(4.0)
    parts[0]["rows"][-1]["floor_fraction"] = None  # unsettled: no ceiling for rms_norm
    assert transfer.merged(parts, ["gelu_mul", "rms_norm"])["ceiling_geomean_vs_naive"] is None


def test_the_library_strategy_is_a_setting_of_the_part(tmp_path):
    """--library-strategy library_then_catalog: its run is the library's row and the part says which strategy
    it was; parts of two strategies never merge, and a part from before the setting reads as `library`."""
    transfer = bench_script("transfer_eval")
    out = tmp_path / "part.json"
    assert transfer.main(["--gate", "compile", "--budget", "2", "--only", "gelu_mul",
                          "--library-strategy", "library_then_catalog", "--out", str(out)]) == 0
    part = json.loads(out.read_text())
    assert part["provenance"]["library_strategy"] == "library_then_catalog"
    assert list(part["runs"]["gelu_mul"]) == ["library_then_catalog", "unconditioned_random", "unconditioned_greedy"]
    # its best kernel went to the judging gate (compile-only here: no ratio, and the rows say why)
    assert [r["reason"] for r in part["rows"] if r["kernel"] == "library_best"] == ["the gate said compiled"] * 2

    older, library = _part("rms_norm", 8.0, 4.0), _part("gelu_mul", 2.0, 2.0)
    library["provenance"]["library_strategy"] = "library"
    assert transfer.merged([older, library], OPERATORS)["where_measured"]["library_geomean_vs_naive"]["value"] \
        == pytest.approx(4.0)
    then = _part("gelu_mul", 2.0, 2.0)
    then["provenance"]["library_strategy"] = "library_then_catalog"
    then["runs"]["gelu_mul"]["library_then_catalog"] = then["runs"]["gelu_mul"].pop("library")
    with pytest.raises(ValueError, match=r"library_strategy 'library_then_catalog', not 'library'"):
        transfer.merged([older, then], OPERATORS)
    # the summaries read the run of the strategy the part measured
    alone = transfer.merged([then], OPERATORS)["where_measured"]["vs_unconditioned_geomean"]
    assert alone == {"value": pytest.approx(1.0), "operators": ["gelu_mul"], "of": len(OPERATORS)}


def test_the_paired_comparison_divides_the_judging_gates_ratios():
    """vs_unconditioned_paired_geomean: library best / naive over the better search's best / naive, both from the
    judging gate; an operator whose search's best was not judged has no paired ratio (unknown, not 1)."""
    transfer = bench_script("transfer_eval")
    judged, unjudged = _part("rms_norm", 9.0, 10.0), _part("gelu_mul", 2.0, 2.0)
    judged["rows"].append({"workload": "rms_norm", "kernel": "unconditioned_best", "vs": "naive", "ratio": 9.5,
                           "correct": True})
    document = transfer.merged([judged, unjudged], OPERATORS)
    paired = document["where_measured"]["vs_unconditioned_paired_geomean"]
    assert paired == {"value": pytest.approx(9.0 / 9.5), "operators": ["rms_norm"], "of": len(OPERATORS)}
    # each search's own speedup is still reported beside it, as before
    assert document["where_measured"]["vs_unconditioned_geomean"]["value"] == pytest.approx((0.9 * 1.0) ** 0.5)


def test_the_better_search_is_unknown_where_no_search_measured_a_speedup(tmp_path):
    """Under the compile gate neither search times anything: no search is "the better" one, and its row says so
    instead of judging an arbitrary one."""
    transfer = bench_script("transfer_eval")
    out = tmp_path / "part.json"
    assert transfer.main(["--gate", "compile", "--budget", "2", "--only", "gelu_mul", "--out", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["kernel"] == "unconditioned_best"]
    assert [(r["vs"], r["ratio"], r["reason"]) for r in rows] == [
        ("naive", None, "no unconditioned search measured a speedup")]


def test_the_better_search_is_the_one_with_the_larger_speedup_of_those_that_measured_one():
    from klineage.optimize.result import better_unconditioned, library_run

    runs = {"library_then_catalog": {"stop": "budget", "speedup": 5.0},
            "unconditioned_random": {"stop": "budget", "speedup": 3.0, "best": "r"},
            "unconditioned_greedy": {"stop": "budget", "speedup": 4.0, "best": "g"}}
    assert library_run(runs) == {"stop": "budget", "speedup": 5.0} and library_run({}) == {}
    assert better_unconditioned(runs)["best"] == "g"
    runs["unconditioned_greedy"]["stop"] = "start_failed"
    assert better_unconditioned(runs)["best"] == "r"
    runs["unconditioned_random"]["speedup"] = None  # the compile gate measures none
    assert better_unconditioned(runs) is None


def _run(stop: str, evaluations: int, speedup: float, by_budget: list[list[float]]) -> dict:
    return {"stop": stop, "evaluations": evaluations, "speedup": speedup, "speedups_by_budget": by_budget}


def test_the_budget_curve_reads_each_run_as_if_it_had_stopped_at_every_smaller_budget():
    """The library ended on its own after 2 evaluations at 4x; random search reached 2x at its 3rd and 5x at its 6th;
    greedy 3x at its 7th. At each budget: each strategy's speedup then, and the library over the better search."""
    transfer = bench_script("transfer_eval")
    runs = {"rms_norm": {"library": _run("no_candidate", 2, 4.0, [[2, 4.0]]),
                         "unconditioned_random": _run("budget", 8, 5.0, [[3, 2.0], [6, 5.0]]),
                         "unconditioned_greedy": _run("budget", 8, 3.0, [[7, 3.0]])}}
    curve = {p["budget"]: p for p in transfer.by_budget(runs, ["rms_norm"], 8)}
    assert [curve[n]["library"] for n in range(1, 9)] == pytest.approx([1.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0])
    assert [curve[n]["unconditioned_random"] for n in range(1, 9)] == pytest.approx([1, 1, 2, 2, 2, 5, 5, 5])
    assert [curve[n]["vs_unconditioned"] for n in (1, 2, 3, 6, 7, 8)] == pytest.approx([1, 4, 2, 0.8, 0.8, 0.8])
    assert all("reason" not in p for p in curve.values())


def test_the_budget_curve_is_unknown_where_a_run_cannot_tell_its_speedup_then():
    """A run cut by its time limit after 3 evaluations, from a part that kept no speedups_by_budget, says nothing of
    budgets 1-2 (it may have improved at either) nor past 3; nor does a run whose start failed."""
    transfer = bench_script("transfer_eval")
    runs = {"gelu_mul": {"library": {"stop": "time_limit", "evaluations": 3, "speedup": 1.3},
                         "unconditioned_random": _run("budget", 4, 1.2, [[2, 1.2]]),
                         "unconditioned_greedy": {"stop": "start_failed", "evaluations": 1, "speedup": 1.0}}}
    curve = transfer.by_budget(runs, ["gelu_mul"], 4)
    assert [p["library"] for p in curve] == [None, None, 1.3, None]
    assert all(p["unconditioned_greedy"] is None and p["vs_unconditioned"] is None for p in curve)
    assert all(p["reason"] == "some operator's run cannot tell its speedup at this budget" for p in curve)


LIBRARY_RUN = BENCH.parent / "results" / "transfer-library-run.json"
PARTS = BENCH.parent / "results" / "transfer-library-parts"


def test_a_parts_runs_get_their_budgets_by_replaying_the_recorded_searches():
    """The committed gelu_mul part (H200, written before runs kept speedups_by_budget): each search replays off the
    committed verdicts to the very run the part describes, and gives the curve the committed merge holds."""
    transfer = bench_script("transfer_eval")
    part = json.loads((PARTS / "gelu_mul.json").read_text())
    assert all("speedups_by_budget" not in run for run in part["runs"]["gelu_mul"].values())
    library = transfer.replayed_library(part, str(BENCH.parent / "results" / "transfer-library.json"))
    runs = transfer.with_budgets(part, library)["runs"]["gelu_mul"]
    committed = json.loads(LIBRARY_RUN.read_text())["runs"]["gelu_mul"]
    assert {s: r["speedups_by_budget"] for s, r in runs.items()} == \
        {s: r["speedups_by_budget"] for s, r in committed.items()}
    assert runs["library"]["speedups_by_budget"][-1] == [2, pytest.approx(runs["library"]["speedup"])]


def test_a_replay_that_is_not_the_parts_run_or_another_library_is_refused():
    transfer = bench_script("transfer_eval")
    part = json.loads((PARTS / "gelu_mul.json").read_text())
    with pytest.raises(ValueError, match=r"drew on library d4e44b0915c0, not on .*library\.json: --library must"):
        transfer.replayed_library(part, str(bundled_library()))
    library = transfer.replayed_library(part, str(BENCH.parent / "results" / "transfer-library.json"))
    part["runs"]["gelu_mul"]["unconditioned_greedy"]["evaluations"] = 5
    with pytest.raises(ValueError, match=r"gelu_mul unconditioned_greedy: the replay is not the run its part "
                                         r"describes \(evaluations 7, not 5\)"):
        transfer.with_budgets(part, library)



def _as_emulated(state, source: str, grid: tuple | None = None):
    """mse_loss's kernel on `source`, its entry named `kernel` (the emulator's), its grid `grid` where given."""
    launches = tuple(dataclasses.replace(launch, entry="kernel", grid=grid or launch.grid)
                     if launch.entry == "mse_loss" else launch for launch in state.plan.launches)
    return dataclasses.replace(state, source=source.replace("void mse_loss(", "void kernel("),
                               plan=dataclasses.replace(state.plan, launches=launches))


def _mse_error_on_the_cpu(tmp_path: Path, state, n: int) -> float:
    """The relative error of the kernel's loss on `n` elements against the float64 reference (CPU emulator)."""
    import torch

    from tests.transforms import emulate

    spec = importlib.util.spec_from_file_location("mse_loss_problem", BENCH / "mse_loss" / "problem.py")
    problem = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(problem)
    inputs = problem.make_inputs({"n": n}, 0, "cpu")
    want = float(problem.reference(inputs)["loss"][0])
    [got] = emulate.run(emulate.build(tmp_path / "bin", state), tmp_path / "run", state, {"n": n}, inputs,
                        {"loss": (torch.float32, 1)}, starting={"loss": torch.full((1,), 7.0)}).values()
    return abs(float(got[0]) - want) / want


PER_THREAD_SUM = ("    float s = 0.0f;\n"
                  "    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {\n"
                  "        float d = a[i] - b[i];\n        s += d * d;\n    }\n    atomicAdd(loss, s / n);\n")
PER_ELEMENT_ADD = ("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                   "    if (i < n) {\n        float d = a[i] - b[i];\n        atomicAdd(loss, d * d / n);\n    }\n")


@pytest.mark.slow  # why the problem's naive kernel is written so (a million elements emulated twice, about 8 s)
def test_the_mse_loss_naive_kernel_meets_its_tolerance_and_one_atomic_an_element_would_not(tmp_path):
    """Each thread's grid-stride sum added by one atomic stays well within the problem's rtol (1e-4) on the ragged
    case; one atomic per element rounds away too much of a million tiny shares (the naive kernel this operator
    first had, which the gate rejected)."""
    naive = load_kernel(BENCH / "mse_loss" / "naive")
    assert PER_THREAD_SUM in naive.source
    assert _mse_error_on_the_cpu(tmp_path / "naive", _as_emulated(naive, naive.source), 1000003) < 2.5e-5
    per_element = _as_emulated(naive, naive.source.replace(PER_THREAD_SUM, PER_ELEMENT_ADD), ("cdiv(n, 256)", 1, 1))
    assert _mse_error_on_the_cpu(tmp_path / "per-element", per_element, 1000003) > 1e-4
