"""The home page's evidence cards: each results file in bench/results gets a headline that says
what was measured (read from the committed files), and a file missing its numbers says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.conf import settings

from skills_app.evidence import load_all

pytestmark = pytest.mark.django_db  # a report computed from a stored library links to its cards


def _by_name(folder=None):
    return {e.name: e for e in load_all(folder)}


def test_committed_results_have_headlines():
    """Each headline restates the committed file's own numbers (read here from the file, not copied)."""
    found = _by_name()
    results = Path(settings.BASE_DIR) / "bench" / "results"

    def data(name: str) -> dict:
        return json.loads((results / name).read_text(encoding="utf-8"))

    corpus, rows = found["corpus.json"], data("corpus.json")["rows"]
    targeted = [r for r in rows if r.get("target") is not None and isinstance(r.get("ratio"), float)]
    assert corpus.title == "Expert corpus vs the vendor path" and targeted
    assert corpus.headline.startswith(f"{sum(r['meets_target'] for r in targeted)} of {len(targeted)} targets met: ")
    for row in targeted:
        assert f"{row['kernel']['name']} {row['ratio']:.2f}x" in corpus.headline
        assert [row["kernel"]["name"], f"{row['ratio']:.3f}x", f"{row['target']:.2f}x"] in [r[:3] for r in corpus.rows]

    skills = data("skills.json")
    admission = skills["admission_rate"]
    assert found["skills.json"].headline.startswith(
        f"admission {admission['admitted']}/{admission['cards']} cards ({admission['value']:.0%})")
    waste = skills["library_wasted"]
    assert found["skills.json"].headline.endswith(
        f"; roundtrip {skills['roundtrip_min_vs_expert']['value']:.2f}x; vs unconditioned "
        f"{skills['vs_unconditioned_geomean']['value']:.2f}x; library wasted {waste['wasted']}/"
        f"{waste['evaluations']} evaluations ({waste['value']:.0%})"), "every strategy ran: the headline itself"
    assert len(found["skills.json"].rows) == len(skills["workloads"])
    for shown, row in zip(found["skills.json"].rows, skills["workloads"]):
        library = row["strategies"]["library"]
        assert shown[0] == row["lineage"].split("@")[0] and shown[1] == f"{row['vs_expert']:.3f}"
        assert shown[2] == f"{library['speedup']:.2f}x" and shown[-1] == f"{library['wasted']}/{library['evaluations']}"

    replayed, replay = found["skills-passed-over-replay.json"], data("skills-passed-over-replay.json")
    assert replayed.title.startswith("Skills: today's planner replayed") and replay["provenance"]["gate"] == "replay"
    assert [r[-1] for r in replayed.rows] == ["{wasted}/{evaluations}".format(**w["strategies"]["library"])
                                              for w in replay["workloads"]]

    peak, ceiling = found["mma-peak.json"], data("mma-peak.json")
    best = max(ceiling["rows"], key=lambda r: r["vs_cublas"])
    assert peak.where == ceiling["gpu"] and peak.headline.startswith(
        f"best {best['kernel']} {best['tflops']:.0f} TFLOP/s = {best['vs_cublas']:.3f}x cuBLAS")
    assert len(peak.rows) == len(ceiling["rows"])

    runs = [r for r in data("multigpu.json")["rows"] if isinstance(r.get("efficiency"), float)]
    widest = max(runs, key=lambda r: r["gpus"])
    assert found["multigpu.json"].headline.startswith(f"{widest['gpus']} GPUs at {widest['efficiency']:.2f} efficiency")

    when, report = found["preconditions.json"], data("preconditions.json")
    kept = report["kept_out"]
    assert kept  # the committed report keeps cards out: its library was built with every per-case timing
    assert when.title == "When cards pay (per-case timings)" and when.where == report["provenance"]["gpu"]
    assert when.headline == (f"of {report['admitted']} admitted cards, {report['with_preconditions']} with a timing "
                             f"precondition, {report['whens']['uniform']} paid on every case measured, "
                             f"{report['whens']['never']} paid on none, {report['whens']['mixed']} mixed with nothing "
                             f"forced; {len(report['pending'])} card(s) with a new precondition await admission; "
                             f"{sum(kept.values())} kept out because their per-case effects do not say where they pay: "
                             f"{kept.get('mixed', 0)} paid on some with nothing saying where, {kept.get('never', 0)} "
                             f"paid on none of their cases (a case paid where the forward step's paired time ratio "
                             f"to its parent reached 1.01x by more than the gate's 1.5% run-to-run spread, per case "
                             f"of its problem); the admitted preconditions predict {report['loo_accuracy']:.2f} of "
                             f"their cases with each case left out and {report['kernel_loo_accuracy']:.2f} with each "
                             f"kernel left out: how they carry to a kernel not measured")
    assert [r[:3] for r in when.rows] == [[r["card"], r["transform"], r.get("status", "admitted")]
                                          for r in report["rows"] + report["pending"]]
    assert when.link is None  # the library it was computed from is not stored here

    sweep_rows = [r for r in data("sweep-conv2d.json")["rows"] if r.get("timing")]
    best = max(sweep_rows, key=lambda r: r["timing"]["vs_vendor"])
    sweep = found["sweep-conv2d.json"]
    assert sweep.title == f"Tuning sweep: {best['kernel']['name']}"
    assert sweep.headline == (f"best {best['variant']['name']}: {best['timing']['vs_vendor']:.3f}x vendor, "
                              f"{best['timing']['vs_expert']:.3f}x the expert ({len(sweep_rows)} variants timed)")


def test_results_without_numbers_say_so(tmp_path):
    (tmp_path / "skills.json").write_text(json.dumps({"admission_rate": {"value": None}}), encoding="utf-8")
    (tmp_path / "sweep-x.json").write_text(json.dumps({"rows": [{"variant": {"name": "v"}, "status": "incorrect"}]}),
                                           encoding="utf-8")
    (tmp_path / "corpus.json").write_text(json.dumps({"rows": []}), encoding="utf-8")
    (tmp_path / "mma-peak.json").write_text(
        json.dumps({"rows": [{"kernel": "k", "vs_cublas": None}]}), encoding="utf-8"
    )
    found = _by_name(tmp_path)
    assert found["mma-peak.json"].headline == "no rows" and not found["mma-peak.json"].rows
    assert found["skills.json"].headline == "admission unknown; roundtrip not measured; vs unconditioned not measured"
    assert (
        found["sweep-x.json"].headline == "1 variants, none timed" and found["sweep-x.json"].rows[0][1] == "incorrect"
    )
    assert found["corpus.json"].headline == "0 of 0 targets met"


def test_a_partly_run_skills_file_shows_what_was_measured_as_not_the_headline(tmp_path):
    unknown = {"value": None, "reason": "1 workload(s) did not run every strategy (not_run)"}
    subset = {"workloads": ["a@1:gpu", "b@2:gpu"], "roundtrip_min_vs_expert": {"value": 0.97},
              "vs_unconditioned_geomean": {"value": 2.5}}
    (tmp_path / "skills.json").write_text(json.dumps({
        "admission_rate": {"value": 0.5, "admitted": 1, "cards": 2}, "roundtrip_min_vs_expert": unknown,
        "vs_unconditioned_geomean": unknown, "library_wasted": unknown, "measured_subset": subset,
        "not_run": [{"lineage": "c@3:gpu", "strategies": ["library"]}]}), encoding="utf-8")
    assert _by_name(tmp_path)["skills.json"].headline == (
        "admission 1/2 cards (50%); roundtrip not measured; vs unconditioned not measured (1 workload(s) not fully "
        "run); over the 2 workload(s) measured: roundtrip 0.97x, vs unconditioned 2.50x")


def test_the_skills_card_draws_library_against_unconditioned_on_a_log_scale(client, db):
    """A bar per strategy and a tick where the expert stands, per workload that ran the library,
    read from the committed skills.json; on the home page as an SVG figure."""
    import math
    import re

    skills = json.loads((Path(settings.BASE_DIR) / "bench" / "results" / "skills.json").read_text(encoding="utf-8"))
    ran = [w for w in skills["workloads"] if (w["strategies"].get("library") or {}).get("speedup")]
    chart = _by_name()["skills.json"].chart
    assert [b["label"] for b in chart["bars"]] == [w["lineage"].split("@")[0] for w in ran]
    widest = max(max(b["library"], b["unconditioned"] or 0, b["expert"] or 0) for b in chart["bars"])
    for bar, row in zip(chart["bars"], ran):
        library = row["strategies"]["library"]["speedup"]
        assert bar["library"] == library and bar["expert"] == library / row["vs_expert"]
        assert bar["library_w"] == round(250 * math.log(library) / math.log(widest * 1.3), 1)
        compared = row.get("vs_unconditioned")  # skills_eval's comparison at one budget, or none
        assert (bar["unconditioned"] is None) is (compared is None) and (bar["unconditioned_w"] is None) is \
            (compared is None)
        if compared:
            best = max(row["strategies"][s]["speedup"] for s in row["vs_unconditioned_over"])
            assert bar["unconditioned"] == pytest.approx(best)
            assert (bar["library_w"] > bar["unconditioned_w"]) is (library > best)
    page = client.get("/").content.decode()
    assert page.count('<g class="skills-row"') == len(ran)
    assert re.search(r'<rect class="skills-library" x="0" y="15" width="[\d.]+" height="11"><title>library: '
                     + f'{ran[0]["strategies"]["library"]["speedup"]:.2f}', page)


def test_no_chart_without_a_library_speedup():
    from skills_app.evidence import skills_chart

    assert skills_chart([{"lineage": "x@1:gpu", "strategies": {"unconditioned_random": {"speedup": 1.5}}}]) is None
    alone = {"lineage": "x@1:gpu", "vs_expert": None, "strategies": {"library": {"speedup": 2.0}}}
    [bar] = skills_chart([alone])["bars"]
    assert bar["expert"] is None and bar["unconditioned"] is None and bar["library_w"] > 0
    refused = {"lineage": "x@1:gpu", "vs_unconditioned": None, "vs_unconditioned_reason": "not at one budget: ...",
               "strategies": {"library": {"speedup": 2.0}, "unconditioned_random": {"speedup": 1.5}}}
    assert skills_chart([refused])["bars"][0]["unconditioned"] is None  # no bar where the budgets differed


def test_the_transfer_card_states_its_numbers_over_the_operators_that_measured_them(client, db, tmp_path):
    """From the committed transfer.json: each number says over how many operators it was measured, each operator
    has a row, the commits that measured them are named, and the chart draws every library ratio."""
    import re

    data = json.loads((Path(settings.BASE_DIR) / "bench" / "results" / "transfer.json").read_text(encoding="utf-8"))
    card = _by_name()["transfer.json"]
    # its rounds ran as planned (before orderings), not as optimize orders them by default: the title says so
    assert card.title == "Transfer to held-out operators (rounds as planned)"
    assert card.headline.startswith(f"strategy {data['provenance']['library_strategy']} (")
    assert "optimize's default" in card.headline
    # the committed document is replayed off the H200's recorded verdicts, and says so; a GPU part would not
    assert data["provenance"]["gate"] == "replay"
    assert "), replayed off recorded verdicts, rounds ordered as planned, budget" in card.headline
    # a run says how its rounds were ordered; one from before orderings ran them as planned
    (tmp_path / "transfer.json").write_text(json.dumps(data | {"provenance": data["provenance"] | {
        "ordering": "measured"}}), encoding="utf-8")
    ordered = _by_name(tmp_path)["transfer.json"]
    assert "verdicts, rounds ordered measured, budget" in ordered.headline
    assert ordered.title == "Transfer to held-out operators"
    assert "verdicts, rounds ordered as planned, budget" in card.headline
    alone = _by_name()["transfer-cards-alone.json"]
    assert alone.title == "Transfer to held-out operators (cards alone, rounds as planned)"
    assert alone.headline.startswith("strategy library (cards alone), ") and "default" not in alone.headline
    measured = data["where_measured"]
    library = measured["library_geomean_vs_naive"]
    assert f"library {library['value']:.2f}x the naive kernel (geometric mean over {len(library['operators'])}" \
        in card.headline
    eager = measured["library_beats_eager_fraction"]
    if eager["value"] is not None and len(eager["operators"]) < eager["of"]:
        n = len(eager["operators"])
        assert f"on {round(eager['value'] * n)} of the {n} operators (of {eager['of']}) timed against it" \
            in card.headline
    assert card.commit == ", ".join(sorted({p["git_commit"][:12] for p in data["provenance"]["parts"]}))
    assert [r[0] for r in card.rows] == sorted(data["runs"])
    versus_naive = {r["workload"]: r["ratio"] for r in data["rows"] if r["kernel"] == "library_best"
                    and r["vs"] == "naive"}
    for row in card.rows:
        assert row[1] == f"{versus_naive[row[0]]:.2f}x"
    drawn = {b["label"]: b for b in card.chart["bars"]}
    assert set(drawn) == {name for name, ratio in versus_naive.items() if ratio}
    assert all(b["expert"] is None or b["expert"] >= 1 for b in drawn.values()), "no eager tick below the 1x scale"
    page = client.get("/").content.decode()
    # every transfer card on the page draws its rows (the transfer library's run has its own)
    transfer_cards = [c for c in _by_name().values() if c.title.startswith("Transfer to held-out operators")]
    assert len(transfer_cards) == 9
    # the default search on the H200 at a later commit, 17 of the 20 operators: its numbers say over how many
    h200 = _by_name()["transfer-h200.json"]
    assert h200.where == "NVIDIA H200" and "rounds ordered measured" in h200.headline
    assert "(geometric mean over 17 operators (of 20))" in h200.headline and "machine code not gated" in h200.headline
    assert "faster than torch eager on 15 of the 17 operators (of 20)" in h200.headline
    # the H100's merged parts: cards of their own, each number over the operators it was measured on; the rounds
    # ordered as optimize does by default over all 18, and the earlier planned order over 15 of them
    h100, planned = _by_name()["transfer-h100.json"], _by_name()["transfer-h100-planned.json"]
    assert h100.where == planned.where == "NVIDIA H100 80GB HBM3"
    assert h100.title == "Transfer to held-out operators" and "rounds ordered measured" in h100.headline
    assert "(geometric mean over 18 operators)" in h100.headline
    assert planned.title == "Transfer to held-out operators (rounds as planned)"
    assert "(geometric mean over 15 operators (of 18))" in planned.headline
    assert "every candidate gated (no code check)" in h100.headline
    # the same searches with the code check, on all 18 operators: a card of its own
    checked = _by_name()["transfer-h100-code-check.json"]
    assert checked.title == "Transfer to held-out operators" and checked.where == h100.where
    assert "machine code not gated" in checked.headline and "(geometric mean over 18 operators)" in checked.headline
    # the latest H100 part of each of the twenty operators with that search, merged: all twenty, so no "of 20"
    everything = _by_name()["transfer-h100-all.json"]
    assert everything.where == h100.where and "machine code not gated" in everything.headline
    assert "(geometric mean over 20 operators)" in everything.headline
    assert "faster than torch eager on 18 of the 20 operators" in everything.headline
    assert page.count('<g class="transfer-row"') == sum(len(c.chart["bars"]) for c in transfer_cards)
    assert re.search(r"<title>torch eager: [\d.]+×</title>", page)


def test_a_transfer_run_on_another_library_names_it_and_draws_its_budget_curve(client, db):
    """The transfer library's run: its title names the library it drew on, its numbers are over all twelve
    operators, and its budget curve draws the library and both searches at every budget, the caption saying where
    the library leads the better search most."""
    data = json.loads((Path(settings.BASE_DIR) / "bench" / "results" / "transfer-library-run.json").read_text())
    card = _by_name()["transfer-library-run.json"]
    assert card.title == ("Transfer to held-out operators (bench/results/transfer-library.json, cards alone, "
                          "rounds as planned)")
    measured = data["where_measured"]["library_geomean_vs_naive"]
    assert len(measured["operators"]) == measured["of"] == 12
    assert f"library {data['library_geomean_vs_naive']:.2f}x the naive kernel (geometric mean over 12 operators)" \
        in card.headline
    assert [r[0] for r in card.rows] == sorted(data["runs"])
    assert "judging gate paired it" in card.chart["caption"] and "its own run measured" in card.chart["caption"]
    points = data["by_budget"]
    assert [s["name"] for s in card.curve["series"]] == ["greedy search", "random search", "library"]
    for series, key in zip(card.curve["series"], ("unconditioned_greedy", "unconditioned_random", "library")):
        assert [m["value"] for m in series["marks"]] == [p[key] for p in points]
        heights = [m["y"] for m in series["marks"]]
        # a speedup that never falls as the budget grows: a line that never drops (SVG y grows downward)
        assert heights == sorted(heights, reverse=True)
    lead = max(points, key=lambda p: p["vs_unconditioned"])
    assert f"{lead['vs_unconditioned']:.2f}× at {lead['budget']} evaluations" in card.curve["caption"]
    page = client.get("/").content.decode()
    # the default strategy's runs have one too: the H200's (its twelve as planned, six more measured, seventeen
    # measured with the code check) and the H100's (as planned; measured, without and with the code check; the
    # latest part of each operator with it)
    curves = [c.curve for c in _by_name().values() if c.curve]
    assert len(curves) == 8 and page.count('<g class="curve-series"') == sum(len(c["series"]) for c in curves)
    assert "library, 8 evaluations: " in page and "library, then catalog, 8 evaluations: " in page


def test_a_budget_curve_leaves_out_a_strategy_it_cannot_draw_whole():
    """A strategy unknown at some budget is not drawn (a gap would read as a fall); nothing drawn at all, no chart."""
    from skills_app.budget_curve import budget_curve

    points = [{"budget": 1, "library": 1.0, "unconditioned_random": 1.0, "unconditioned_greedy": None},
              {"budget": 2, "library": 3.0, "unconditioned_random": 2.0, "unconditioned_greedy": 2.5}]
    curve = budget_curve(points, caption="c")
    assert [s["name"] for s in curve["series"]] == ["random search", "library"]
    assert curve["series"][1]["points"].startswith("34.0,118.0 312.0,")  # 1x at the bottom left
    assert budget_curve([{**p, "library": None, "unconditioned_random": None} for p in points], caption="c") is None
    assert budget_curve(points[:1], caption="c") is None


def test_a_transfer_bar_of_the_search_is_the_paired_ratio_where_the_judging_gate_timed_it(tmp_path):
    """Both bars from one gate where it paired both best kernels with the naive kernel; the search's own speedup
    (a product along its path) only where it did not."""
    rows = [{"workload": op, "kernel": "library_best", "vs": "naive", "ratio": 9.0, "correct": True}
            for op in ("a_op", "b_op")]
    rows.append({"workload": "a_op", "kernel": "unconditioned_best", "vs": "naive", "ratio": 9.5, "correct": True})
    search = {"library": {"speedup": 9.1, "steps": []}, "unconditioned_random": {"speedup": 10.2},
              "unconditioned_greedy": {"speedup": 10.0}}
    where = {"vs_unconditioned_paired_geomean": {"value": 9.0 / 9.5, "operators": ["a_op"], "of": 2}}
    (tmp_path / "transfer.json").write_text(json.dumps({"provenance": {"gpu": "H200", "budget": 8}, "rows": rows,
                                                        "runs": {"a_op": search, "b_op": search},
                                                        "where_measured": where}))
    card = _by_name(tmp_path)["transfer.json"]
    assert [row[3] for row in card.rows] == ["9.50x", "10.20x"]
    assert {b["label"]: b["unconditioned"] for b in card.chart["bars"]} == {"a_op": 9.5, "b_op": 10.2}
    assert "0.95x the better unconditioned search's best kernel, both paired with the naive kernel by the judging " \
           "gate (geometric mean over 1 operators (of 2))" in card.headline


def test_a_transfer_file_without_numbers_says_what_was_not_measured(tmp_path):
    (tmp_path / "transfer.json").write_text(json.dumps({"provenance": {"gpu": "none", "budget": 8}, "rows": [],
                                                        "runs": {}, "where_measured": {}}))
    card = _by_name(tmp_path)["transfer.json"]
    assert "library geomean vs naive: not measured" in card.headline and card.chart is None and card.rows == []


def test_the_row_cache_card_states_its_when_and_every_case_from_the_file():
    """bench/results/row_cache_when.json: the induced sentence, how many cases, whether they settled, and one row a
    case with each operator's ratio (read from the file, not copied)."""
    card = _by_name()["row_cache_when.json"]
    data = json.loads((Path(settings.BASE_DIR) / "bench" / "results" / "row_cache_when.json").read_text())
    operators = [o["operator"] for o in data["operators"]]
    cases = {c["case"]: c for o in data["operators"] for c in o["cases"]}
    assert card.headline.startswith(data["when"]["sentence"])
    assert f"on {sum(len(o['cases']) for o in data['operators'])} cases of {len(operators)} operators" in card.headline
    assert "every timing settled" in card.headline and card.where == data["provenance"]["gpu"]
    assert card.columns[3:] == operators and {row[0] for row in card.rows} == set(cases)
    for row in card.rows:
        for operator, shown in zip(operators, row[3:]):
            ratio = next(c["ratio"] for o in data["operators"] if o["operator"] == operator for c in o["cases"]
                         if c["case"] == row[0])
            assert shown == f"{ratio:.2f}x"
    paths = {row[0]: row[2] for row in card.rows}
    assert paths["headline"] == "16-byte" and paths["ragged"] == paths["narrow"] == paths["cols2052"] == "scalar"


def test_a_row_cache_case_that_did_not_settle_is_named(tmp_path):
    data = json.loads((Path(settings.BASE_DIR) / "bench" / "results" / "row_cache_when.json").read_text())
    data["operators"][0]["cases"][0]["settled"] = False
    (tmp_path / "row_cache_when.json").write_text(json.dumps(data))
    card = _by_name(tmp_path)["row_cache_when.json"]
    first = data["operators"][0]
    assert f"not settled on {first['operator']}:{first['cases'][0]['case']}" in card.headline


def test_the_preconditions_report_links_the_cards_of_the_stored_library_it_was_computed_from():
    from skills_app.card_import import import_library_files

    import_library_files()
    when = _by_name()["preconditions.json"]
    assert when.link == {"url": "/libraries/percase/?status=admitted",
                         "label": "the admitted cards in the percase library"}
    first = when.rows[0][0]
    assert first == {"text": first["text"], "url": f"/libraries/percase/{first['text']}/"}
