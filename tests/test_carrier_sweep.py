"""bench/carrier_sweep.py: sweep files, variants built by the transforms, the compile-only path with
real nvcc, and variants that fail becoming rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench_tools import bench_script
from klineage import corpus
from klineage.errors import DocumentError
from klineage.gate.cache import VerdictStore, read_verdict_file
from klineage.kernel import parse_constants

REPO = Path(__file__).resolve().parent.parent
sweep_tool = bench_script("carrier_sweep")

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                                reason="needs nvcc")


def write(tmp_path: Path, text: str, name: str = "sweep.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, text: str):
    return sweep_tool.load_sweep(write(tmp_path, text))


CONV = 'kernel = "conv2d/implicit_gemm"\n'


# ---- the sweep file ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["conv2d", "gemm", "fmha"])
def test_committed_sweeps_parse_with_the_expert_first(name):
    sweep = sweep_tool.load_sweep(REPO / "bench" / "sweeps" / f"{name}.toml")
    assert sweep.variants[0].name == "expert" and sweep.variants[0].is_expert
    assert 6 <= len(sweep.variants) - 1 <= 10
    assert sweep.policy.seeds == 1 and sweep.policy.sanitize.value == "never" and sweep.policy.vendor
    assert all(v.constants or v.launch_bounds for v in sweep.variants[1:])


def test_a_sweep_file_sets_names_values_flags_and_policy(tmp_path):
    sweep = load(tmp_path, CONV + """
[policy]
trials = 2
[[variant]]
constants = { BLOCK_M = 96, WARPS_M = 2, BLOCK_N = 128 }
nvcc_flags = ["-lineinfo"]
[[variant]]
name = "deep"
constants = { STAGES = 5 }
launch_bounds = "THREADS,   2"
""")
    assert [v.name for v in sweep.variants] == ["expert", "BLOCK_M=96,WARPS_M=2,-lineinfo", "deep"]
    first = sweep.variants[1]
    assert first.constants == {"BLOCK_M": 96, "WARPS_M": 2} and first.unchanged == ("BLOCK_N",)
    assert first.nvcc_flags == ("-lineinfo",)
    assert sweep.variants[2].launch_bounds == "THREADS, 2"
    assert sweep.policy.trials == 2 and sweep.policy.seeds == 1  # the file's value over the sweep's default
    assert sweep.problem == "conv2d" and sweep.problem_path.name == "conv2d.py"


@pytest.mark.parametrize("text, message", [
    (CONV + "[[variant]]\nconstants = { BLOCK_Q = 64 }\n", "unknown constant 'BLOCK_Q'"),
    (CONV + "[[variant]]\nconstants = { THREADS = 128 }\n", "THREADS is not a tuning constant"),
    (CONV + "[[variant]]\nconstants = { BLOCK_M = 0 }\n", "BLOCK_M = 0: needs a whole number"),
    (CONV + "[[variant]]\nconstants = { BLOCK_M = \"96\" }\n", "BLOCK_M = '96': needs a whole number"),
    (CONV + "[[variant]]\nconstants = { STAGES = true }\n", "STAGES = True: needs a whole number"),
    (CONV + "[[variant]]\nconstants = { STAGES = 2.5 }\n", "STAGES = 2.5: needs a whole number"),
    (CONV + "[[variant]]\nconstants = [1, 2]\n", "constants must be a table"),
    ('kernel = "conv2d/no_such"\n[[variant]]\nconstants = { STAGES = 3 }\n', "unknown kernel 'conv2d/no_such'"),
    ('[[variant]]\nconstants = { STAGES = 3 }\n', "needs kernel ="),
    ('kernel = "conv2d/implicit_gemm"\nproblem = "gemm"\n[[variant]]\nconstants = { STAGES = 3 }\n',
     "problem 'gemm' is not the kernel's ('conv2d')"),
    (CONV + "colour = 1\n[[variant]]\nconstants = { STAGES = 3 }\n", "unknown keys ['colour']"),
    (CONV + "[[variant]]\nconstant = { STAGES = 3 }\n", "unknown keys ['constant']"),
    (CONV, "needs at least one [[variant]]"),
    (CONV + "[[variant]]\nconstants = { STAGES = 4 }\n", "changes nothing"),
    (CONV + "[[variant]]\nname = \"a\"\nconstants = { STAGES = 3 }\n"
     "[[variant]]\nname = \"a\"\nconstants = { STAGES = 5 }\n",
     "name 'a' is used twice"),
    (CONV + "[[variant]]\nconstants = { STAGES = 3 }\n[[variant]]\nname = \"b\"\nconstants = { STAGES = 3 }\n",
     "the same changes as variant 'STAGES=3'"),
    (CONV + "[[variant]]\nname = \"expert\"\nconstants = { STAGES = 3 }\n", "name 'expert'"),
    (CONV + "[[variant]]\nconstants = { STAGES = 3 }\nnvcc_flags = [\"-Xcompiler -fopenmp\"]\n", "nvcc_flags"),
    (CONV + "[[variant]]\nconstants = { STAGES = 3 }\nlaunch_bounds = \"THREADS; 2\"\n", "launch_bounds must be"),
    (CONV + "[policy]\nseeds = 0\n[[variant]]\nconstants = { STAGES = 3 }\n", "seeds must be between 1 and 16"),
    (CONV + "[policy]\nsanitise = \"never\"\n[[variant]]\nconstants = { STAGES = 3 }\n", "unknown keys ['sanitise']"),
    (CONV + "[[variant]\n", "not a TOML file"),
])
def test_malformed_sweep_files_are_refused_with_the_reason(tmp_path, text, message):
    with pytest.raises(DocumentError) as caught:
        load(tmp_path, text)
    assert message in str(caught.value)
    assert str(tmp_path / "sweep.toml") in str(caught.value)


def test_the_command_line_reports_a_malformed_file_without_a_traceback(tmp_path, capsys):
    path = write(tmp_path, CONV + "[[variant]]\nconstants = { BLOCK_Q = 64 }\n")
    assert sweep_tool.main([str(path), "--out", str(tmp_path / "out.json"), "--compile-only"]) == 2
    assert "unknown constant 'BLOCK_Q'" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


# ---- building variants -------------------------------------------------------------------------------

def test_a_variant_is_a_chain_of_tile_constant_rewrites_of_the_real_kernel(tmp_path):
    sweep = load(tmp_path, CONV + "[[variant]]\nconstants = { BLOCK_M = 96, WARPS_M = 2 }\n")
    built = sweep_tool.build_variant(sweep.expert, sweep.variants[1])
    assert built.state is not None and built.reason == ""
    constants = parse_constants(built.state.source)
    assert (constants["BLOCK_M"], constants["WARPS_M"]) == (96, 2)
    # the derived ones follow
    assert (constants["THREADS"], constants["WARP_TILE_M"], constants["A_PASSES"]) == (128, 48, 6)
    # BLOCK_M = 96 under 4 warps makes 24-row warp tiles (an assert fails): WARPS_M had to change first.
    assert [s["note"] for s in built.steps] == ["WARPS_M: 4 -> 2", "BLOCK_M: 192 -> 96"]
    assert all(s["transform"] == "tile_constant" for s in built.steps) and built.mode == "sequential"
    changed = [(a, b) for a, b in zip(sweep.expert.source.splitlines(), built.state.source.splitlines()) if a != b]
    assert len(changed) == 2 and built.state.plan == sweep.expert.plan


def test_constants_tied_by_an_assert_change_together_under_the_same_check(tmp_path):
    sweep = load(tmp_path, 'kernel = "fmha/flash_mma"\n[[variant]]\nconstants = { BLOCK_M = 64, WARPS = 4 }\n'
                           '[[variant]]\nconstants = { BLOCK_M = 96, WARPS = 6 }\n')
    built = sweep_tool.build_variant(sweep.expert, sweep.variants[1])
    assert built.mode == "joint" and built.state is not None
    constants = parse_constants(built.state.source)
    assert (constants["BLOCK_M"], constants["WARPS"], constants["WARP_ROWS"], constants["THREADS"]) == (64, 4, 16, 128)
    assert built.steps[0]["carrier"]["constants"] == {"BLOCK_M": {"old": 128, "new": 64}, "WARPS": {"old": 8, "new": 4}}
    # 6 warps: 96 threads per loader pass do not divide a 64-key tile; the joint check says so.
    refused = sweep_tool.build_variant(sweep.expert, sweep.variants[2])
    assert refused.state is None
    assert "the loaders cover whole tiles" in refused.reason and "one at a time" in refused.reason


def test_the_transform_refuses_what_breaks_the_kernel(tmp_path):
    sweep = load(tmp_path, 'kernel = "gemm/mma_sync"\n[[variant]]\nconstants = { BLOCK_K = 32 }\n')
    built = sweep_tool.build_variant(sweep.expert, sweep.variants[1])
    assert built.state is None and "the XOR swizzle assumes 8 chunks per row" in built.reason


def test_launch_bounds_are_replaced_through_the_launch_bounds_transform(tmp_path):
    sweep = load(tmp_path, CONV + '[[variant]]\nconstants = { STAGES = 3 }\nlaunch_bounds = "THREADS, 2"\n'
                                  '[[variant]]\nlaunch_bounds = "THREADS, 1"\n'
                                  '[[variant]]\nnvcc_flags = ["-maxrregcount=128"]\n')
    built = sweep_tool.build_variant(sweep.expert, sweep.variants[1])
    assert "__launch_bounds__(THREADS, 2)" in built.state.source
    assert "__launch_bounds__(THREADS, 1)" not in built.state.source
    # The constants come first, so that removing the attribute is checked at the variant's block size.
    assert [s["transform"] for s in built.steps] == ["tile_constant", "launch_bounds", "launch_bounds"]
    same = sweep_tool.build_variant(sweep.expert, sweep.variants[2])
    assert same.state is None and "already has __launch_bounds__(THREADS, 1)" in same.reason
    flagged = sweep_tool.build_variant(sweep.expert, sweep.variants[3])
    assert flagged.state.plan.nvcc_flags[-1] == "-maxrregcount=128"
    assert any("ignores -maxrregcount" in note for note in flagged.notes)


def test_occupancy_counts_registers_threads_and_shared_memory():
    assert sweep_tool.occupancy(212, 256, 160 * 1024)["ctas_per_sm"] == 1  # the conv2d expert
    three = sweep_tool.occupancy(166, 128, 72 * 1024)
    assert three["ctas_per_sm"] == 3 and three["limited_by"] == ["registers", "shared"]
    two = sweep_tool.occupancy(254, 128, 96 * 1024)  # 256 registers x 128 threads: half the register file
    assert two["ctas_per_sm"] == 2 and "registers" in two["limited_by"]
    assert sweep_tool.occupancy(32, 1024, 0)["ctas_per_sm"] == 2  # threads


def test_the_estimate_scales_the_recorded_stage_timings(tmp_path, monkeypatch):
    sweep = load(tmp_path, CONV + "[[variant]]\nconstants = { STAGES = 3 }\n")
    recorded = {"timings": {"run": 10.0, "run.correctness": 3.0, "run.profile": 3.0, "static": 0.0, "features": 0.0},
                "policy": {"seeds": 3, "input_sets": 3}, "provenance": {"created": "2026-01-01"}}
    monkeypatch.setattr(sweep_tool, "recorded_basis", lambda name: recorded)
    guess = sweep_tool.estimate(sweep, 2, compile_only=False)
    # fixed 4 s + correctness 3 s x 1/3 seeds + profile 3 s x 2/3 input sets x 1.3 (paired with the expert)
    assert guess["per_variant_s"] == pytest.approx(4 + 1 + 2.6, abs=0.05)
    assert guess["gpu_s"] == pytest.approx(2 * 7.6, abs=0.1)
    monkeypatch.setattr(sweep_tool, "recorded_basis", lambda name: None)
    assert sweep_tool.estimate(sweep, 3, compile_only=False)["gpu_s"] == 3 * sweep_tool.FALLBACK_GATE_S


# ---- the compile-only path, end to end ---------------------------------------------------------------

SOFTMAX = """kernel = "row_softmax/naive"
description = "test sweep"
[[variant]]
name = "t128"
constants = { THREADS = 128 }
[[variant]]
name = "bad_flag"
constants = { THREADS = 64 }
nvcc_flags = ["-maxrregcount=lots"]
[[variant]]
name = "zero"
constants = { THREADS = 1 }
"""


@needs_nvcc
def test_a_register_cap_ptxas_cannot_meet_is_a_row_that_says_so(tmp_path, gate_cache):
    # 5 CTAs of 160 threads per SM cap registers at 80; a wgmma m64n128 needs 90. ptxas says so only in a
    # `fatal` line (C7602) followed by a generic `aborted due to errors`: the row must carry the first.
    sweep = load(tmp_path, 'kernel = "conv2d/implicit_wgmma"\n[[variant]]\nname = "lb5"\n'
                           'constants = { CONSUMER_WARPGROUPS = 1, STAGES = 2 }\nlaunch_bounds = "THREADS, 5"\n')
    document = sweep_tool.run_sweep(sweep, out=None, compile_only=True, only=["lb5"], say=lambda line: None)
    row = next(row for row in document["rows"] if row["variant"]["name"] == "lb5")
    assert row["status"] == "rejected" and row["reason"] == "compile_error"
    assert "Insufficient registers (" in row["message"] and "aborted" not in row["message"]


@needs_nvcc
def test_compile_only_sweep_reports_each_variant_and_failures_are_rows(tmp_path, gate_cache):
    sweep = load(tmp_path, SOFTMAX)
    lines = []
    out = tmp_path / "results" / "sweep.json"
    document = sweep_tool.run_sweep(sweep, out=out, compile_only=True, max_variants=3, say=lines.append)
    assert json.loads(out.read_text()) == json.loads(json.dumps(document))
    rows = {row["variant"]["name"]: row for row in document["rows"]}
    assert list(rows) == ["expert", "t128", "bad_flag"] and document["left_out"] == ["zero"]
    expert, t128, bad = rows["expert"], rows["t128"], rows["bad_flag"]
    assert expert["status"] == t128["status"] == "compiled"
    # The compiled variant really has 128 threads: its plan launches 128 and ptxas sizes the
    # kernel's __shared__ reduction buffer (THREADS floats) at 512 bytes, half the expert's.
    assert expert["compile"]["threads"] == 256 and t128["compile"]["threads"] == 128
    assert t128["compile"]["static_shared_bytes"] * 2 == expert["compile"]["static_shared_bytes"]
    assert t128["compile"]["registers"] > 0 and t128["compile"]["spill_store_bytes"] == 0
    assert t128["compile"]["ctas_per_sm"] >= 1 and t128["kernel"]["fingerprint"] != expert["kernel"]["fingerprint"]
    assert t128["rewrite"]["steps"][0]["note"] == "THREADS: 256 -> 128"
    # a flag outside the allow-list never reaches nvcc: the static check refuses it, naming the flag
    assert bad["status"] == "rejected" and bad["reason"] == "static_check" and "compile" not in bad
    assert document["provenance"]["gpu"] == "none (compile only)"
    assert document["provenance"]["written_by"] == "bench/carrier_sweep.py"
    assert document["provenance"]["git_commit"] and document["provenance"]["toolchain"].startswith("cuda-")
    assert any(line.startswith("[2/3] t128: compiled") for line in lines)
    assert lines[1].startswith("estimate: 3 x")
    table = sweep_tool.table(document["rows"])
    assert "t128" in table and "why not:" in table and "bad_flag: static_check" in table


@needs_nvcc
def test_a_variant_the_gate_cannot_judge_is_a_row_not_a_crash(tmp_path, gate_cache, monkeypatch):
    import klineage.gate.pipeline as pipeline

    sweep = load(tmp_path, SOFTMAX)
    real = pipeline.run_gate

    def flaky(problem, kernel, **kwargs):
        if kernel.constants["THREADS"] == 128:
            raise RuntimeError("the runner fell over")
        return real(problem, kernel, **kwargs)

    monkeypatch.setattr(pipeline, "run_gate", flaky)
    monkeypatch.setattr(sweep_tool, "precompile", lambda built: {})
    document = sweep_tool.run_sweep(sweep, out=None, compile_only=True, only=["t128", "zero"], say=lambda line: None)
    rows = {row["variant"]["name"]: row for row in document["rows"]}
    assert rows["t128"]["status"] == "error" and "the runner fell over" in rows["t128"]["message"]
    # THREADS = 1 breaks nothing tile_constant can see, so the variant is built and compiled; the row
    # says whatever the gate says (here: compiled), and the sweep went on past the failing one.
    assert rows["zero"]["status"] in ("compiled", "rejected")


def test_unknown_variant_names_in_only_are_an_error(tmp_path):
    sweep = load(tmp_path, SOFTMAX)
    with pytest.raises(DocumentError, match="no variants named"):
        sweep_tool.run_sweep(sweep, out=None, compile_only=True, only=["nope"], say=lambda line: None)


def test_every_corpus_expert_in_the_sweeps_is_a_corpus_kernel():
    names = {entry.name for entry in corpus.list_kernels()}
    for path in (REPO / "bench" / "sweeps").glob("*.toml"):
        assert sweep_tool.load_sweep(path).kernel in names


def _recorded_conv2d_verdict() -> dict | None:
    found = [read_verdict_file(p) for p in VerdictStore(REPO / "recorded").files()]
    found = [v for v in found if v["kernel"]["name"] == "conv2d_implicit_gemm" and v.get("profile", {}).get("ratios")
             and v["provenance"]["key_parts"].get("against") == "none"]
    return max(found, key=lambda v: v["provenance"]["created"], default=None)


def test_the_gpu_path_turns_verdicts_into_timed_rows(tmp_path, monkeypatch):
    """The GPU path without a GPU: run_gate answers with the expert's recorded H200 verdict (paired
    with a made-up expert timing for variants), and the rows, table and provenance come from it."""
    import copy

    import klineage.gate.pipeline as pipeline
    from klineage.gate.verdict import Verdict

    recorded = _recorded_conv2d_verdict()
    if recorded is None:
        pytest.skip("no recorded timed verdict of conv2d/implicit_gemm")
    sweep = load(tmp_path, CONV + '[[variant]]\nname = "s3"\nconstants = { STAGES = 3 }\n')
    calls = []

    def answer(problem, kernel, *, against=None, policy, mode, cache, record):
        calls.append((kernel.constants["STAGES"], against is not None, policy.seeds, mode.value, record))
        data = copy.deepcopy(recorded)
        if against is not None:
            candidate = data["profile"]["contenders"]["candidate"]["median_us"]
            data["profile"]["contenders"]["baseline"] = {**data["profile"]["contenders"]["candidate"],
                                                         "median_us": candidate * 1.1}
            data["profile"]["ratios"]["vs_baseline"] = {"overall": 1.1, "per_trial": [1.1, 1.09, 1.11]}
        return Verdict.from_dict(data)

    monkeypatch.setattr(pipeline, "run_gate", answer)
    monkeypatch.setattr(sweep_tool, "precompile", lambda built: {})
    monkeypatch.setenv("KLINEAGE_GPU_NAME", "NVIDIA H200")
    out = tmp_path / "gpu.json"
    document = sweep_tool.run_sweep(sweep, out=out, say=lambda line: None)
    assert calls == [(4, False, 1, "gpu", False), (3, True, 1, "gpu", False)]  # sequential; the expert unpaired
    expert, s3 = document["rows"]
    vendor = recorded["profile"]["ratios"]["vs_vendor"]["overall"]
    assert expert["timing"]["vs_vendor"] == pytest.approx(vendor) and expert["timing"]["vs_expert"] == 1.0
    assert s3["timing"]["vs_expert"] == 1.1 and s3["timing"]["vs_expert_how"] == "paired"
    assert expert["timing"]["median_us"] == recorded["profile"]["contenders"]["candidate"]["median_us"]
    resources = recorded["compile"]["resources"]["sm_90"]["conv2d_implicit_gemm"]
    assert expert["compile"]["registers"] == resources["registers"]
    assert expert["compile"]["ctas"] == 131 and expert["compile"]["ctas_per_sm"] == 1
    assert all(c["passed"] and c["worst_rel_l2"] is not None for c in expert["correctness"])
    assert document["provenance"]["gpu"] == recorded["environment"]["gpu"]
    assert document["provenance"]["torch"] == recorded["environment"]["torch"]
    assert json.loads(out.read_text())["rows"][1]["variant"]["name"] == "s3"
    table = sweep_tool.table(document["rows"])
    assert f"{vendor:.3f}x" in table and "1.100x" in table


def test_without_a_gpu_the_gpu_path_stops_before_building_anything(tmp_path, monkeypatch, capsys):
    import klineage.gate.execute as execute
    from klineage.errors import KLineageError

    def no_gpu() -> str:
        raise KLineageError("no GPU here (nvidia-smi not found)")

    monkeypatch.setattr(execute, "gpu_name", no_gpu)
    monkeypatch.setattr(sweep_tool, "build_variant", lambda expert, variant: pytest.fail("built without a GPU"))
    path = write(tmp_path, SOFTMAX)
    assert sweep_tool.main([str(path), "--out", str(tmp_path / "out.json")]) == 2
    assert "no GPU here" in capsys.readouterr().err


def test_estimate_only_prints_gpu_seconds_and_runs_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sweep_tool, "run_sweep", lambda *a, **k: pytest.fail("ran the sweep"))
    sweep = str(REPO / "bench" / "sweeps" / "gemm.toml")
    assert sweep_tool.main([sweep, "--estimate-only", "--max-variants", "3"]) == 0
    assert "3 variant(s) x ~" in capsys.readouterr().out
