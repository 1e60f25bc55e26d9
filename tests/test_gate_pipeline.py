"""The gate end to end without a GPU: real nvcc, real sandboxed problem probe, real cache."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from klineage import config, corpus
from klineage.config import GateMode
from klineage.errors import DocumentError, ReplayMiss
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy
from klineage.gate.verdict import Reason, Status
from klineage.kernel import load_kernel
from shared_cache import PROBES, share

REPO = Path(__file__).resolve().parent.parent
SOFTMAX = corpus.problem_path("row_softmax")


@pytest.fixture()
def cache(tmp_path, monkeypatch, shared_cache) -> GateCache:
    """The test's own cache; its compiles are judged afresh (one runs past its time limit), its problem
    probes are the run's."""
    share(tmp_path / "cache", shared_cache, PROBES)
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(tmp_path / "cache"))
    return GateCache(tmp_path / "cache", tmp_path / "recorded")


def gate(kernel_name: str, cache: GateCache, **kwargs):
    return run_gate(SOFTMAX, corpus.kernel_entry(kernel_name).load(), mode=GateMode.COMPILE_ONLY, cache=cache,
                    **kwargs)


def test_compile_only_verdict_carries_static_compile_and_features(cache):
    verdict = gate("row_softmax/naive", cache)
    assert verdict.status is Status.COMPILED
    assert verdict.static["ok"] is True
    assert verdict.compile["ok"] is True and set(verdict.compile["targets"]) == {"sm_90", "sm_90a"}
    source = {(f["locus"], f["name"]) for f in verdict.features["source"]}
    assert any(name == "syncthreads" for _, name in source)
    assert verdict.features["sass"], "SASS features are read from the cubin"
    assert verdict.cases == ("headline", "ragged", "long_rows", "narrow", "mid_aligned", "small")
    assert verdict.provenance["origin"] == "measured" and len(verdict.provenance["key"]) == 64
    # a verdict is committed and replayed elsewhere: it names its cubins by content, not by this cache's paths
    assert "cubin_paths" not in verdict.compile and set(verdict.compile["cubin_sha256"]) == {"sm_90", "sm_90a"}
    assert str(config.cache_dir()) not in json.dumps(verdict.to_dict())


def test_second_gate_is_served_from_the_cache(cache):
    first = gate("row_softmax/warp_vec4", cache)
    again = gate("row_softmax/warp_vec4", cache)
    assert again.provenance["served_from"] == "cache"
    assert again.provenance["key"] == first.provenance["key"]
    assert again.features == first.features


@pytest.mark.parametrize("name, reason, words", [
    ("adversarial/huge_shared", Reason.RESOURCE_LIMIT, "shared memory"),
    ("adversarial/hidden_library", Reason.STATIC_CHECK, "include"),
    ("adversarial/cache_by_pointer", Reason.STATIC_CHECK, "__device__"),
])
def test_adversarial_kernels_caught_before_any_gpu(cache, name, reason, words):
    verdict = gate(name, cache)
    assert verdict.status is Status.REJECTED
    assert verdict.reason is reason
    assert words in verdict.findings[0].message
    assert corpus.kernel_entry(name).expectation["reason"] == reason.value


def _copy_kernel(tmp_path: Path, name: str) -> Path:
    target = tmp_path / "kernel"
    shutil.copytree(corpus.kernel_entry(name).path, target)
    return target


def test_compile_error_names_the_line(cache, tmp_path):
    folder = _copy_kernel(tmp_path, "row_softmax/naive")
    source = folder / "kernel.cu"
    lines = source.read_text().splitlines()
    body = next(i for i, line in enumerate(lines) if line.rstrip().endswith("{") and i > 5)
    lines.insert(body + 1, "    int broken = undeclared_name + 1;")
    source.write_text("\n".join(lines) + "\n")
    verdict = run_gate(SOFTMAX, load_kernel(folder), mode=GateMode.COMPILE_ONLY, cache=cache)
    assert verdict.reason is Reason.COMPILE_ERROR
    assert "undeclared_name" in verdict.findings[0].message
    assert f"({body + 2})" in verdict.findings[0].message or f":{body + 2}" in verdict.compile["log"]


def test_a_compile_past_its_time_limit_judges_nothing(cache, monkeypatch):
    """nvcc's time depends on the machine and its load (six gates side by side on the GPU host
    once took a scalarized FMHA state past 120 s): no rejection, nothing cached or recorded."""
    monkeypatch.setenv("KLINEAGE_COMPILE_TIMEOUT_S", "0.001")
    verdict = gate("row_softmax/naive", cache)
    assert verdict.status is Status.ERROR and not verdict.findings
    assert "ran past 0.001 s" in verdict.environment["error"]
    assert cache.lookup(verdict.provenance["key"]) is None
    monkeypatch.delenv("KLINEAGE_COMPILE_TIMEOUT_S")
    assert gate("row_softmax/naive", cache).status is Status.COMPILED


def test_plan_naming_an_unknown_buffer_is_a_plan_error(cache, tmp_path):
    folder = _copy_kernel(tmp_path, "row_softmax/naive")
    plan = folder / "launch.toml"
    text = plan.read_text()
    assert '"x"' in text
    plan.write_text(text.replace('"x"', '"not_a_buffer"', 1))
    verdict = run_gate(SOFTMAX, load_kernel(folder), mode=GateMode.COMPILE_ONLY, cache=cache)
    assert verdict.reason is Reason.PLAN_ERROR
    assert "not_a_buffer" in verdict.findings[0].message and "x" in verdict.findings[0].message


def test_unknown_case_is_refused_by_name(cache):
    with pytest.raises(DocumentError, match="no case 'huge'"):
        gate("row_softmax/naive", cache, cases=["huge"])


def test_replay_serves_only_recorded_verdicts(cache, tmp_path):
    kernel = corpus.kernel_entry("row_softmax/naive").load()
    policy = GatePolicy()
    with pytest.raises(ReplayMiss, match="no recorded verdict"):
        run_gate(SOFTMAX, kernel, mode=GateMode.REPLAY, cache=cache, policy=policy, cases=["small"])
    # Record a compile-only verdict under the replay key by storing it as the GPU run would.
    measured = run_gate(SOFTMAX, kernel, mode=GateMode.COMPILE_ONLY, cache=cache, policy=policy, cases=["small"])
    key_parts = measured.provenance["key_parts"]
    from klineage.gate.cache import verdict_key

    replay_key, _ = verdict_key(**{**{k: v for k, v in key_parts.items() if k != "version"},
                                   "gpu": config.replay_gpu(), "mode": GateMode.GPU.value})
    cache.recorded.put(replay_key, measured)
    served = run_gate(SOFTMAX, kernel, mode=GateMode.REPLAY, cache=cache, policy=policy, cases=["small"])
    assert served.provenance["served_from"] == "recorded"
    assert served.kernel == measured.kernel


def test_problem_with_near_zero_outputs_is_refused(cache, tmp_path):
    text = SOFTMAX.read_text().replace(
        'return {"y": torch.softmax(x.to(torch.float64), dim=-1).to(torch.float32)}',
        'return {"y": (torch.softmax(x.to(torch.float64), dim=-1) * 1e-12).to(torch.float32)}')
    assert "1e-12" in text
    problem = tmp_path / "tiny_softmax.py"
    problem.write_text(text)
    with pytest.raises(DocumentError, match="near zero"):
        run_gate(problem, corpus.kernel_entry("row_softmax/naive").load(), mode=GateMode.COMPILE_ONLY, cache=cache)


@pytest.fixture()
def cli_cache(tmp_path, shared_cache) -> Path:
    """The CLI's cache for one test, its problem probes the run's."""
    return share(tmp_path, shared_cache, PROBES)


def _cli(*args: str, env_cache: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "KLINEAGE_CACHE_DIR": str(env_cache), "HOME": str(env_cache)}
    return subprocess.run([sys.executable, "-m", "klineage", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_cli_gate_compile_only_json(cli_cache):
    done = _cli("gate", "row_softmax", "row_softmax/naive", "--compile-only", "--json", env_cache=cli_cache)
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["status"] == "compiled" and verdict["kernel"]["name"] == "row_softmax_naive"
    assert "placement" not in verdict["policy"]
    exchanged = _cli("gate", "row_softmax", "row_softmax/naive", "--compile-only", "--json", "--placement", "exchanged",
                     env_cache=cli_cache)
    assert exchanged.returncode == 0 and json.loads(exchanged.stdout)["policy"]["placement"] == "exchanged"
    wrong = _cli("gate", "row_softmax", "row_softmax/naive", "--placement", "best", env_cache=cli_cache)
    assert wrong.returncode == 2 and "--placement: invalid choice: 'best'" in wrong.stderr


def test_cli_rejection_exits_1_and_error_exits_2(cli_cache):
    rejected = _cli("gate", "row_softmax", "adversarial/hidden_library", "--compile-only", env_cache=cli_cache)
    assert rejected.returncode == 1 and "static_check" in rejected.stdout
    missing = _cli("gate", "no_such_problem", "row_softmax/naive", "--compile-only", env_cache=cli_cache)
    assert missing.returncode == 2 and "no_such_problem" in missing.stderr


def test_cli_lists_kernels_and_the_adversarial_suite(cli_cache):
    done = _cli("kernels", "--adversarial", "--json", env_cache=cli_cache)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert {r["expected"] for r in rows} >= {"timeout", "memcheck", "race", "unwritten_output", "static_check"}
    assert len(rows) >= 12
    problems = _cli("problems", "--json", env_cache=cli_cache)
    assert problems.returncode == 0, problems.stderr
    assert "row_softmax" in {r["name"] for r in json.loads(problems.stdout)}
