"""The bundled corpus's lineages as `import_corpus()` stores them (tests/dashboard_data.py's `corpus`: the
import of this worker, restored from its snapshot rather than run again): GPU walks kept beside the corpus
come in with it, and each step says whether its timing is evidence. The rest of the import's own behaviour
(all-or-nothing, other corpus folders) is tests/test_lineage_models.py's, and a second import of the
committed lineages changing none is tests/test_skills_models.py's."""

from __future__ import annotations

import pytest

from dashboard_data import corpus  # noqa: F401
from klineage import config
from klineage.documents import document_files
from skills_app.card_refs import resolve_refs
from skills_app.importer import import_corpus
from skills_app.models import Lineage, LineageStep

pytestmark = pytest.mark.django_db


def test_load_corpus_imports_committed_lineages(corpus):
    """The first import is the worker's (its report, the rows restored from its snapshot): an import into an
    empty database, without paying for the corpus a second time. A second import leaving every lineage
    unchanged is tests/test_skills_models.py's (`load_corpus`)."""
    assert corpus.counts["lineages"]["created"] >= 1
    lineage = Lineage.objects.get(source_path="corpus/lineages/row_softmax_warp_vec4.dry.json")
    assert lineage.problem is not None and lineage.problem.operator == "row_softmax"
    assert lineage.expert_state.kernel is not None and lineage.expert_state.kernel.name == "row_softmax/warp_vec4"


def test_load_corpus_shows_the_gpu_walks_kept_beside_the_corpus(corpus):
    """bench/walks/*.gpu.json.gz, GPU walks the library is not built from yet, come in with the bundled
    corpus, their states with the verdicts the H200 recorded for them; a card's evidence still
    resolves into the walk the library was built from (its ref names the gate mode)."""
    walk = Lineage.objects.get(source_path="bench/walks/fmha_flash_mma.gpu.json.gz")
    assert walk.gate_mode == "gpu" and walk.accepted_count == 36 and walk.termination_kind == "complete"
    assert walk.expert_state.kernel.name == "fmha/flash_mma"
    first = walk.steps.get(kind=LineageStep.Kind.ACCEPTED, index=0)
    assert first.child_state.verdicts.filter(status="passed").exists()
    ref = {"lineage": f"fmha_flash_mma@{walk.expert_state.fingerprint[:12]}:compile", "kind": "transition", "index": 0}
    (step,) = resolve_refs([ref]).values()
    assert step.lineage.gate_mode == "compile" and step.lineage.source_path.startswith("corpus/lineages/")


def test_gpu_walk_steps_say_whether_their_timing_is_evidence(corpus):
    """conv2d/implicit_gemm_any's states 12-29 timed about 543 us as candidates and 376 us as
    baselines (docs/perf-notes.md): their steps were biased, and each was re-timed with its kernels
    exchanging places (session 16), which is stored with the walk's own ratio; a walk whose states
    agree is consistent but for its first and last step, whose end state was timed once."""
    conv = Lineage.objects.get(source_path="bench/walks/conv2d_implicit_gemm_any.gpu.json.gz")
    step = conv.steps.get(kind=LineageStep.Kind.ACCEPTED, index=13)
    assert step.pairing == "exchanged" and step.retimed_ratio == pytest.approx(0.992, abs=0.001)
    assert "the walk's pairing gave 0.691" in step.pairing_note
    assert not LineageStep.objects.filter(pairing__in=["biased", "outweighed"]).exists()
    # conv2d/implicit_gemm's first steps: state 2 timed 1.06x apart (outweighed), re-timed 1.997 and 0.770
    plain = Lineage.objects.get(source_path="corpus/lineages/conv2d_implicit_gemm.gpu.json")
    assert plain.steps.get(kind=LineageStep.Kind.ACCEPTED, index=1).retimed_ratio == pytest.approx(1.997, abs=0.001)
    # gemm/mma_sync's doubtful steps were re-timed with their kernels exchanging places (session 15)
    gemm = Lineage.objects.get(source_path="corpus/lineages/gemm_mma_sync.gpu.json")
    unpad = gemm.steps.get(kind=LineageStep.Kind.ACCEPTED, index=7)
    assert unpad.pairing == "exchanged" and unpad.retimed_ratio == pytest.approx(1.003, abs=0.001)
    assert "the walk's pairing gave 0.848" in unpad.pairing_note
    softmax = Lineage.objects.get(source_path="corpus/lineages/row_softmax_warp_vec4.gpu.json")
    pairings = list(
        softmax.steps.filter(kind=LineageStep.Kind.ACCEPTED).order_by("index").values_list("pairing", flat=True)
    )
    assert pairings[0] == pairings[-1] == "unchecked" and set(pairings[1:-1]) == {"consistent"}
    dry = Lineage.objects.get(source_path="corpus/lineages/row_softmax_warp_vec4.dry.json")
    assert set(dry.steps.values_list("pairing", flat=True)) == {""}  # a compile gate timed nothing
    assert not softmax.steps.filter(kind=LineageStep.Kind.REJECTED).exclude(pairing="").exists()
    # steps stored before the audit existed get it on the next import, and a biased step re-timed since
    # (its recording added after the import) becomes exchanged
    def marks():
        return {
            i: (pairing, ratio)
            for i, pairing, ratio in LineageStep.objects.values_list("id", "pairing", "retimed_ratio")
        }

    marked = marks()
    LineageStep.objects.exclude(pairing="exchanged").update(pairing="", pairing_note="")
    LineageStep.objects.filter(pairing="exchanged").update(pairing="biased", retimed_ratio=None)
    gpu_walks = [*document_files(config.corpus_dir() / "lineages", "*.gpu.json"),
                 *document_files(config.bench_walks_dir(), "*.gpu.json")]
    assert import_corpus().counts["lineages"]["updated"] == len(gpu_walks) >= 14  # each GPU walk's marks again
    assert marks() == marked
