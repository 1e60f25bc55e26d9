"""Which walk steps ran their parent's machine code (klineage.walk.step_code): the census with real nvcc and
cuobjdump on steps of the bundled softmax GPU walk, its record, and `library build` reading it."""

from __future__ import annotations

import time

import pytest

from klineage import config
from klineage.cli import main
from klineage.errors import DocumentError
from klineage.gate.machine_code import CodeIdentity
from klineage.lineage import Lineage
from klineage.skills.library import load_library
from klineage.skills.when import SAME_CODE, WhenKind, card_when
from klineage.toolchain import find_toolchain
from klineage.walk.step_code import StepCodes, census, walk_steps

WALK = config.corpus_dir() / "lineages" / "row_softmax_warp_vec4.gpu.json"
RESTRICT_STEP = 9  # `__restrict__` on a pointer nvcc already treats as unaliased: the same SASS
SHUFFLE_STEP = 5  # warp shuffles for the shared-memory tree: other instructions
UNROLL_STEPS = range(17, 22)  # the walk's unroll steps: loops nvcc had unrolled already


@pytest.fixture(scope="module")
def walk() -> Lineage:
    return Lineage.load(WALK)


@pytest.fixture(scope="module")
def codes(walk) -> StepCodes:
    steps = walk_steps(walk)
    return census([steps[RESTRICT_STEP], steps[SHUFFLE_STEP], *(steps[i] for i in UNROLL_STEPS)],
                  find_toolchain().key, jobs=2)


def test_the_census_tells_a_step_nvcc_had_done_from_one_that_changes_the_code(walk, codes):
    assert walk.transitions[RESTRICT_STEP].transform == "restrict"
    assert codes.of(walk, RESTRICT_STEP) is CodeIdentity.SAME
    assert codes.of(walk, SHUFFLE_STEP) is CodeIdentity.DIFFERENT
    assert codes.of(walk, 0) is CodeIdentity.UNCHECKED  # not compared: nothing is known
    assert (codes.same(), codes.decided()) == (1 + len(UNROLL_STEPS), 2 + len(UNROLL_STEPS))


def test_a_census_resumes_from_its_record_and_a_deadline_leaves_the_rest_open(walk, codes, tmp_path):
    steps = walk_steps(walk)
    saved = StepCodes.load(codes.save(tmp_path / "step_code.json"))
    assert saved == codes
    # a deadline already past compiles nothing: the steps the record decided stay, the others stay open
    resumed = census(steps[:6] + [steps[RESTRICT_STEP]], codes.toolchain, deadline=time.monotonic(), earlier=saved)
    assert resumed == codes
    # another compiler's record says nothing of this one's code
    elsewhere = census([steps[RESTRICT_STEP]], "cuda-0.0", deadline=time.monotonic(), earlier=saved)
    assert elsewhere.decided() == 0


@pytest.mark.parametrize("document, problem", [
    ({"version": 2, "toolchain": "t", "steps": {}}, "unsupported version 2"),
    ({"version": 1, "toolchain": "", "steps": {}}, "toolchain"),
    ({"version": 1, "toolchain": "t", "steps": {"a": {"b": "alike"}}}, "alike"),
    ({"version": 1, "toolchain": "t", "steps": {"a": "same"}}, "child fingerprint"),
    ({"version": 1, "toolchain": "t"}, "steps"),
])
def test_a_bad_record_is_refused_naming_what_is_wrong(document, problem):
    with pytest.raises(DocumentError, match=problem):
        StepCodes.from_dict(document)


def test_a_record_that_is_not_json_is_refused_naming_its_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(DocumentError, match="bad.json.*not JSON"):
        StepCodes.load(path)


def test_library_build_leaves_the_same_code_steps_out_of_the_effects_and_says_so(walk, codes, tmp_path, capsys):
    record = codes.save(tmp_path / "step_code.json")
    with_record, without = tmp_path / "with.json", tmp_path / "without.json"
    assert main(["library", "build", str(WALK), "--step-code", str(record), "--out", str(with_record)]) == 0
    assert main(["library", "build", str(WALK), "--step-code", "none", "--out", str(without)]) == 0
    built, plain = load_library(with_record), load_library(without)
    assert built.provenance["step_code"] == {"toolchain": codes.toolchain, "same": codes.same()}
    assert "step_code" not in plain.provenance
    restrict = next(c for c in built.cards if any(r.index == RESTRICT_STEP for r in c.evidence))
    before = plain.by_id(restrict.id)
    assert any(e.source.index == RESTRICT_STEP for e in before.effects)
    assert not any(e.source.index == RESTRICT_STEP for e in restrict.effects)
    [said] = [d for d in restrict.diagnostics if d.category == SAME_CODE]
    assert [r.index for r in said.evidence] == [RESTRICT_STEP] and "true ratio is 1" in said.description
    # a step that changed the code keeps its effect, and a card without such steps is as before
    shuffle = next(c for c in built.cards if any(r.index == SHUFFLE_STEP for r in c.evidence))
    assert any(e.source.index == SHUFFLE_STEP for e in shuffle.effects)
    assert shuffle == plain.by_id(shuffle.id)
    # a card whose every step ran its parent's code was never measured, and says why
    unroll = next(c for c in built.cards if c.transform == "unroll")
    assert {r.index for r in unroll.evidence} <= set(UNROLL_STEPS) and not unroll.effects
    assert plain.by_id(unroll.id).effects
    when = card_when(unroll)
    assert when.kind is WhenKind.UNMEASURED and "ran its parent's machine code" in when.sentence


def test_library_build_names_a_missing_record(tmp_path, capsys):
    assert main(["library", "build", str(WALK), "--step-code", str(tmp_path / "nope.json"),
                 "--out", str(tmp_path / "out.json")]) != 0
    assert "nope.json" in capsys.readouterr().err and not (tmp_path / "out.json").exists()


def test_the_committed_record_decides_every_step_of_the_gpu_walks_and_the_percase_library_reads_it():
    """corpus/step_code.json covers every accepted step of the GPU walks a library is built from (a walk added
    without running bench/step_code.py fails here), and the per-case library was built with it."""
    from klineage.config import GateMode
    from klineage.documents import document_files

    record = StepCodes.load(config.corpus_dir() / "step_code.json")
    walks = [lineage for folder in (config.corpus_dir() / "lineages", config.bench_walks_dir())
             for lineage in map(Lineage.load, document_files(folder)) if lineage.gate is GateMode.GPU]
    undecided = [f"{w.expert.name} step {i}" for w in walks for i in range(len(w.transitions))
                 if record.of(w, i) is CodeIdentity.UNCHECKED]
    assert len(walks) >= 20 and not undecided
    percase = load_library(config.REPO_ROOT / "bench" / "results" / "percase" / "library.json")
    assert percase.provenance["step_code"] == {"toolchain": record.toolchain, "same": record.same()}
