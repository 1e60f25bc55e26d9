"""Every card's fit on a target (`retrieval.assess`): the cards retrieval would offer, in its order, and
for each other card why not, in words that name the requirement, the status or the predicate and case;
`klineage library fit` prints it for a real kernel and library, probing the problem in the sandbox."""

from __future__ import annotations

import dataclasses
import json

import pytest

from klineage import config
from klineage.cli import main
from klineage.features.feature import Feature
from klineage.skills.card import CardStatus
from klineage.skills.retrieval import Assessment, Fit, assess, retrieve
from test_precondition_skip import CANDIDATES, cards, info, naive, retrievable, timed  # noqa: F401  (fixtures)


def test_the_proposed_cards_are_what_retrieve_offers_in_its_order(cards, naive, info):  # noqa: F811
    found = assess(naive, info, cards, statuses=CANDIDATES)
    proposed = [a.match for a in found if a.fit is Fit.PROPOSED]
    assert proposed and proposed == retrieve(naive, info, cards, limit=len(cards), statuses=CANDIDATES)
    assert len(found) == len(cards)  # every card is accounted for, proposed or not


def test_each_card_not_offered_says_why(cards, naive, info):  # noqa: F811
    card = retrievable(cards, naive, info)
    missing = dataclasses.replace(card, requires=card.requires | {Feature("kernel", "wgmma")})
    not_paying = timed(card, "cols <= 1024")
    fits = {a.card.id: a for a in assess(naive, info, [dataclasses.replace(card, status=CardStatus.RETIRED)],
                                         statuses=CANDIDATES)}
    [retired] = fits.values()
    assert retired.fit is Fit.STATUS and retired.why == "retired, not among candidate"
    [unfit] = assess(naive, info, [missing], statuses=CANDIDATES)
    assert unfit.fit is Fit.UNFIT and unfit.why == "requires kernel:wgmma, not here"
    [skipped] = assess(naive, info, [not_paying], statuses=CANDIDATES, every_case=True)
    assert skipped.fit is Fit.NOT_PAYING and "pays where cols <= 1024, which fails on case headline" in skipped.why
    assert skipped.failed is not None and skipped.match is None
    # every case of the problem its rule rules out is named, not only the headline retrieval judges on
    wide = {case.name for case in info.cases if case.params["cols"] > 1024}
    assert "headline" in wide and set(skipped.fails_on) == wide and skipped.to_dict()["fails_on"] == list(
        skipped.fails_on)
    [offered] = assess(naive, info, [timed(card, "cols <= 1024", kernel_loo=None)], statuses=CANDIDATES,
                       every_case=True)
    assert offered.fit is Fit.PROPOSED and set(offered.fails_on) == wide  # not shown to carry here: tried, flagged
    assert "not shown to carry to this kernel" in "; ".join(offered.match.reasons)
    # the optimize loop's retrieval judges the headline alone: no case-by-case work on its path
    [headline_only] = assess(naive, info, [not_paying], statuses=CANDIDATES)
    assert headline_only.fit is Fit.NOT_PAYING and headline_only.fails_on == ()
    with pytest.raises(Exception, match="a proposed card has a match"):
        Assessment(card, Fit.PROPOSED)


def test_cli_fit_on_a_real_kernel_and_library(capsys):
    percase = config.REPO_ROOT / "bench" / "results" / "percase" / "library.json"
    assert main(["library", "fit", "row_softmax/naive", "--library", str(percase), "--statuses", "admitted",
                 "--json"]) == 0
    fits = {a["card"][:12]: a for a in json.loads(capsys.readouterr().out)}
    assert len(fits) == 44
    assert fits["d96b27d56dce"]["fit"] == "proposed" and fits["d96b27d56dce"]["sites"] == 2  # fast_math's __expf
    assert fits["b9f2b940a428"]["why"] == "requires device:vector_type_float2, not here"  # rope's 16-byte store
    assert fits["7229554fad89"]["fit"] == "status"  # a candidate, not asked for
    assert main(["library", "fit", "row_softmax/naive", "--library", str(percase), "--all"]) == 0
    listing = capsys.readouterr().out
    assert "cards would be tried on row_softmax_naive" in listing and "the other cards, and why not" in listing


def test_a_card_whose_forward_reads_no_site_says_why(capsys):
    """The naive softmax runs a block per row: the 16-byte vector forwards' analyses refuse it, and the fit says so
    in the kernel's own terms rather than only "finds no site"."""
    percase = config.REPO_ROOT / "bench" / "results" / "percase" / "library.json"
    assert main(["library", "fit", "row_softmax/naive", "--library", str(percase), "--statuses",
                 "admitted,candidate", "--json"]) == 0
    fits = {a["card"][:12]: a for a in json.loads(capsys.readouterr().out)}
    unpad = fits["521ae0f0f630"]  # unpad_shared: its forward pads a naive transpose's tile
    assert unpad["fit"] == "no_site" and unpad["why"].startswith(
        "its transform unpad_shared finds no site here (not read as a site: row_softmax_naive: row_softmax_naive is "
        "not a naive transpose: it declares no column index")
    anchored = fits["9aa07a0984c6"]  # devectorize (add_rms_norm's 16-byte loads): tried at its walks' anchors
    assert anchored["fit"] == "proposed" and anchored["sites"] == 0
    [unread] = [reason for reason in anchored["reasons"] if reason.startswith("no forward site (not read as a site: ")]
    assert "row_softmax_naive: row_softmax_naive has no grid-stride loop over elements at its top level" in unread
    assert unread.endswith("): tried at its walks' anchors")
    # the shuffle cards place their mechanism on the block's shared-memory trees (unshuffle_block_reduction)
    assert fits["db9443ff2ffa"]["fit"] == "proposed" and fits["db9443ff2ffa"]["sites"] == 1
