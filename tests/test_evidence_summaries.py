"""The home page's evidence cards: each results file in bench/results gets a headline that says
what was measured (read from the committed files), and a file missing its numbers says so."""

from __future__ import annotations

import json

from skills_app.evidence import load_all


def _by_name(folder=None):
    return {e.name: e for e in load_all(folder)}


def test_committed_results_have_headlines():
    found = _by_name()
    corpus = found["corpus.json"]
    assert corpus.title == "Expert corpus vs the vendor path"
    assert "targets met" in corpus.headline and "gemm/wgmma_tma 0.99x" in corpus.headline
    assert ["gemm/wgmma_tma", "0.991x", "0.95x"] == corpus.rows[[r[0] for r in corpus.rows].index("gemm/wgmma_tma")][:3]
    skills = found["skills.json"]
    assert skills.headline.startswith("admission 6/26 cards (23%)") and "roundtrip not measured" in skills.headline
    multigpu = found["multigpu.json"]
    assert multigpu.headline.startswith("2 GPUs at 0.95 efficiency")
    sweep = found["sweep-conv2d.json"]
    assert sweep.title == "Tuning sweep: conv2d_implicit_gemm"
    assert sweep.headline.startswith("best m96_w2x4_s3_lb2: 0.878x vendor, 1.040x the expert (10 variants timed)")


def test_results_without_numbers_say_so(tmp_path):
    (tmp_path / "skills.json").write_text(json.dumps({"admission_rate": {"value": None}}), encoding="utf-8")
    (tmp_path / "sweep-x.json").write_text(json.dumps({"rows": [{"variant": {"name": "v"}, "status": "incorrect"}]}),
                                           encoding="utf-8")
    (tmp_path / "corpus.json").write_text(json.dumps({"rows": []}), encoding="utf-8")
    found = _by_name(tmp_path)
    assert found["skills.json"].headline == "admission unknown; roundtrip not measured; vs unconditioned not measured"
    assert found["sweep-x.json"].headline == "1 variants, none timed" and found["sweep-x.json"].rows[0][1] == "incorrect"
    assert found["corpus.json"].headline == "0 of 0 targets met"
