"""Recording a walk's verdicts and prefetching its states, without a GPU: what can be checked here
(the recorded copy of a verdict, the refusals); tests/test_gpu_walk.py walks on a GPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from klineage import cli, config, corpus
from klineage.config import GateMode
from klineage.documents import document_files, document_stem
from klineage.errors import KLineageError
from klineage.gate.cache import GateCache
from klineage.gate.compile import RESULT_FILE
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy
from klineage.gate.prefetch import Prefetched, prefetch, warming
from klineage.gate.verdict import Status, Verdict
from klineage.lineage import Lineage
from klineage.walk.prefetch import guessed_states, guessed_walk, untimed_states
from klineage.walk.walker import DEFAULT_POLICY, forward_timing_policy
from sampled import sampled
from shared_cache import PROBES, share
from verdict_tools import store_gpu_verdict

SOFTMAX = corpus.problem_path("row_softmax")
DRY = config.corpus_dir() / "lineages" / "row_softmax_warp_vec4.full.dry.json"
# gate_cache takes the run's probes, compiles, SASS features and artifact reports (tests/shared_cache.py): the
# walk's first states are row_softmax kernels that other modules compile too. The test that empties the compile
# cache and counts what warming puts there has a compile cache of its own.


def test_keep_copies_a_cached_verdict_into_the_recorded_store_as_measured(gate_cache):
    kernel = corpus.kernel_entry("row_softmax/naive").load()
    run_gate(SOFTMAX, kernel, policy=GatePolicy(timing=False), mode=GateMode.COMPILE_ONLY, cache=gate_cache)
    served = run_gate(SOFTMAX, kernel, policy=GatePolicy(timing=False), mode=GateMode.COMPILE_ONLY, cache=gate_cache)
    assert served.provenance["served_from"] == "cache"
    key = served.provenance["key"]
    assert gate_cache.recorded.get(key) is None
    gate_cache.keep(served)
    kept = gate_cache.recorded.get(key)
    assert kept is not None and "served_from" not in kept.provenance
    assert kept.to_dict() == gate_cache.local.get(key).to_dict()


def test_keep_never_records_an_error(gate_cache):
    kernel = corpus.kernel_entry("row_softmax/naive").load()
    verdict = run_gate(SOFTMAX, kernel, policy=GatePolicy(timing=False), mode=GateMode.COMPILE_ONLY,
                       cache=gate_cache)
    data = verdict.to_dict()
    data.update(status=Status.ERROR.value)
    data["provenance"]["key"] = "0" * 64
    gate_cache.keep(Verdict.from_dict(data))
    assert gate_cache.recorded.get("0" * 64) is None


def test_guessed_states_are_the_walks_states_in_order():
    expert = corpus.kernel_entry("row_softmax/warp_vec4").load()
    states = guessed_states(DRY, expert)
    recorded = json.loads(DRY.read_text())["states"]
    assert [s.fingerprint for s in states] == [s["fingerprint"] for s in recorded]
    assert states[0].fingerprint == expert.fingerprint and len(states) > 10


def test_a_lineage_of_another_expert_is_refused():
    with pytest.raises(KLineageError, match="not row_softmax_naive"):
        guessed_states(DRY, corpus.kernel_entry("row_softmax/naive").load())


def test_prefetch_judges_states_side_by_side_into_one_cache(gate_cache):
    """Threads of one process probe the problem, compile and store verdicts at the same time (one more state
    than threads: one waits for a free thread)."""
    expert = corpus.kernel_entry("row_softmax/warp_vec4").load()
    states = guessed_states(DRY, expert)[:5]
    done = prefetch(SOFTMAX, states, DEFAULT_POLICY, gate_cache, jobs=4, mode=GateMode.COMPILE_ONLY)
    assert done == Prefetched(5, {"compiled": 5}, ())
    for state in states:
        again = run_gate(SOFTMAX, state, policy=DEFAULT_POLICY, mode=GateMode.COMPILE_ONLY, cache=gate_cache)
        assert again.provenance["served_from"] == "cache"
    leftovers = [p for p in gate_cache.local.root.rglob("*.tmp")]
    assert not leftovers


def test_prefetch_keeps_its_verdicts_when_asked(gate_cache):
    """A walk with --record keeps what it prefetched: cut by a time limit, it resumes from them."""
    expert = corpus.kernel_entry("row_softmax/warp_vec4").load()
    states = guessed_states(DRY, expert)[:3]
    before = set(gate_cache.recorded.keys())  # the module's cache: earlier tests recorded into it
    prefetch(SOFTMAX, states[:1], DEFAULT_POLICY, gate_cache, jobs=1, mode=GateMode.COMPILE_ONLY)
    assert set(gate_cache.recorded.keys()) == before
    prefetch(SOFTMAX, states, DEFAULT_POLICY, gate_cache, jobs=3, mode=GateMode.COMPILE_ONLY, keep=True)
    kept = [gate_cache.recorded.get(k) for k in set(gate_cache.recorded.keys()) - before]
    assert sorted(v.kernel["fingerprint"] for v in kept) == sorted(s.fingerprint for s in states)


def test_prefetch_refuses_timed_gates(gate_cache):
    with pytest.raises(KLineageError, match="untimed"):
        prefetch(SOFTMAX, [], GatePolicy(timing=True), gate_cache)
    assert not DEFAULT_POLICY.timing, "the walk's state gates are what prefetch judges"


def test_cli_prefetch_needs_a_gpu_walk(tmp_path, capsys):
    code = cli.main(["walk", "row_softmax/warp_vec4", "--gate", "compile", "--prefetch", str(DRY),
                     "--out", str(tmp_path / "l.json")])
    assert code == 2 and "--prefetch speeds up a GPU walk" in capsys.readouterr().err
    assert not (tmp_path / "l.json").exists()


def test_states_are_compiled_ahead_of_the_walk_in_the_background(gate_cache, monkeypatch, tmp_path, shared_cache):
    """A walk resumed on a fresh GPU host finds its states' verdicts recorded, so prefetch compiles
    nothing there; its forward timings would then compile the states one at a time. `warming`
    compiles them in the background, in the order given, while the walk goes on."""
    monkeypatch.setenv("KLINEAGE_GPU_NAME", "NVIDIA H200")
    # compiles of its own (emptied and counted below); the verdicts stay the module's gate cache's
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(share(tmp_path / "cache", shared_cache, PROBES)))
    # two of the states the side-by-side prefetch above judged: their compile-only verdicts are the module's
    states = guessed_states(DRY, corpus.kernel_entry("row_softmax/warp_vec4").load())[3:5]
    recorded = [store_gpu_verdict(gate_cache, SOFTMAX, state, DEFAULT_POLICY, "passed", store=gate_cache.recorded)
                for state in states]
    compiles = config.cache_dir() / "compile"
    if compiles.exists():  # the compile-only gates that made the verdicts filled it, unless their verdicts were
        shutil.rmtree(compiles)  # the module's already (an earlier test gated the same states)
    done = prefetch(SOFTMAX, states, DEFAULT_POLICY, gate_cache, jobs=2, mode=GateMode.GPU)
    assert done == Prefetched(2, {"passed": 2}, ())
    assert not compiles.exists() or not list(compiles.rglob(RESULT_FILE)), "served verdicts compile nothing"
    with warming(states, jobs=1) as pending:
        assert all(future.result().ok for future in pending)
    assert sorted(p.parent.name for p in compiles.rglob(RESULT_FILE)) == sorted(v.compile["key"] for v in recorded)


def test_only_the_steps_whose_forward_timing_is_not_stored_are_warmed(gate_cache, monkeypatch):
    """A resumed walk replays its timed steps from the store: compiling their states (265 s for
    fmha/flash_wgmma's 44 on the H200) would only delay the first step that runs."""
    monkeypatch.setenv("KLINEAGE_GPU_NAME", "NVIDIA H200")
    guess = guessed_walk(DRY, corpus.kernel_entry("row_softmax/warp_vec4").load())
    states = {s.fingerprint: s.kernel for s in guess.states}
    timing = forward_timing_policy(DEFAULT_POLICY)
    every_end = {f for step in guess.transitions for f in (step.parent, step.child)}
    assert untimed_states(SOFTMAX, guess, timing, gate_cache) == every_end
    first, second = guess.transitions[:2]
    store_gpu_verdict(gate_cache, SOFTMAX, states[first.parent], timing, "passed", against=states[first.child])
    assert untimed_states(SOFTMAX, guess, timing, gate_cache) == every_end - {first.parent}
    store_gpu_verdict(gate_cache, SOFTMAX, states[second.parent], DEFAULT_POLICY, "passed",
                      against=states[second.child])  # the state gate's policy: not the timing's
    assert second.parent in untimed_states(SOFTMAX, guess, timing, gate_cache)


def gpu_walks_with_their_dry_walks() -> dict[str, Path]:
    """Kernel name -> the dry walk in bench/walks of each GPU walk made from one (a file is named
    after its kernel with '/' as '_', which no two corpus kernels share), so a new GPU walk is
    covered here without editing this test."""
    walks = config.bench_walks_dir()
    kernels = {entry.name.replace("/", "_"): entry.name for entry in corpus.list_kernels()}
    gpu = {document_stem(path, ".gpu.json") for path in document_files(walks, "*.gpu.json")}
    dry = {document_stem(path, ".dry.json"): path for path in document_files(walks, "*.dry.json")}
    return {kernels[stem]: path for stem, path in dry.items() if stem in gpu}


RESUMED = gpu_walks_with_their_dry_walks()


def test_the_resumed_walks_are_found():
    assert {"fmha/flash_mma", "fmha/flash_wgmma", "gemm/wgmma_tma", "conv2d/implicit_wgmma", "gdn/chunked_mma",
            "gemm/mma_sync_any", "conv2d/implicit_gemm_any"} <= set(RESUMED)


# every walk's recorded timings are replayed under -m slow; the default run keeps the one whose GPU walk went another
# way than its dry walk, a tensor-core walk and a conv walk (about 2 s each, 18 walks)
@pytest.mark.parametrize("name", sampled(sorted(RESUMED), keep=("causal_softmax/warp_vec4", "gdn/chunked_mma",
                                                                "conv2d/implicit_gemm_any")))
def test_a_resumed_gpu_walk_warms_only_the_steps_it_has_not_timed(name):
    """The forward timings a GPU walk recorded are found under the keys the walk looked them up by:
    a complete walk, resumed, warms none of the guessed states it took. Where the GPU refused a guessed
    step the dry walk took (causal_softmax: three `restrict` steps incorrect on the GPU), the walk went
    another way, and only the ends of the guessed steps it did not take are left to warm."""
    guess = guessed_walk(RESUMED[name], corpus.kernel_entry(name).load())
    untimed = untimed_states(corpus.problem_path(name.split("/")[0]), guess, forward_timing_policy(DEFAULT_POLICY),
                             GateCache(None, config.recorded_dir()), mode=GateMode.REPLAY)
    gpu = Lineage.load(config.bench_walks_dir() / RESUMED[name].name.replace(".dry.json", ".gpu.json"))
    taken = {(a.fingerprint, b.fingerprint) for a, b in zip(gpu.states, gpu.states[1:])}
    not_taken = {end for step in guess.transitions if (step.parent, step.child) not in taken
                 for end in (step.parent, step.child)}
    assert untimed <= not_taken


def test_a_share_of_the_prefetch_judges_only_its_states(gate_cache, monkeypatch, capsys):
    """Eight GPUs split one walk's prefetch: lane 1 of 8 judges states 1, 9, 17, ... and nothing else
    (here each of them is served from the cache; a state outside the share would have to run, and
    this machine has no GPU, and the module's recorded store holds none of them), then stops
    without walking."""
    monkeypatch.setenv("KLINEAGE_GPU_NAME", "NVIDIA H200")
    monkeypatch.setenv("KLINEAGE_RECORDED_DIR", str(gate_cache.recorded.root))  # not the repo's H200 verdicts
    states = guessed_states(DRY, corpus.kernel_entry("row_softmax/warp_vec4").load())
    for state in states[1::8]:
        store_gpu_verdict(gate_cache, SOFTMAX, state, DEFAULT_POLICY, "passed")
    code = cli.main(["walk", "row_softmax/warp_vec4", "--gate", "gpu", "--prefetch", str(DRY),
                     "--prefetch-share", "1/8", "--prefetch-only"])
    assert code == 0
    assert f"prefetched {len(states[1::8])} states: {len(states[1::8])} passed" in capsys.readouterr().out


@pytest.mark.parametrize("share", ["2/2", "1", "a/3", "0/0"])
def test_a_share_that_is_not_i_of_n_is_refused(share, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["walk", "row_softmax/warp_vec4", "--gate", "gpu", "--prefetch", str(DRY),
                  "--prefetch-share", share])
    assert exit_.value.code == 2 and f"'{share}' is not I/N" in capsys.readouterr().err


def test_prefetch_only_needs_a_guess(capsys):
    assert cli.main(["walk", "row_softmax/warp_vec4", "--gate", "gpu", "--prefetch-only"]) == 2
    assert "--prefetch-only needs --prefetch" in capsys.readouterr().err
