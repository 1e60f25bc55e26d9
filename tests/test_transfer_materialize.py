"""Retrieval by structure, compile-only: on naive kernels written for this test (tests/fixtures/transfer/, no
corpus kernel), the bundled library's cards propose their mechanisms where the kernel has the structure -
a warp per row for the shuffle cards on row kernels, 16-byte vectors for the vector cards on elementwise
kernels - and every materialized candidate compiles with nvcc."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage import config
from klineage.kernel import load_kernel
from klineage.skills import load_library
from klineage.skills.card import CardStatus
from klineage.skills.materialize import apply_everywhere, card_sites
from tests.transforms.golden import compiles_without_spills

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "transfer"
# kernel folder -> the analysis forward whose sites the library's cards must propose there
EXPECTED = {"row_sum": "serialize_reduction", "layer_norm": "serialize_reduction", "scale": "scalarize_elementwise",
            "gelu_mul": "scalarize_elementwise", "transpose": "untile_transpose"}


@pytest.fixture(scope="module")
def cards():
    library = load_library(config.corpus_dir() / "library" / "library.json")
    return [card for card in library.cards if card.status is CardStatus.ADMITTED]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("transfer-compile")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cards_propose_the_structural_forward_and_each_candidate_compiles(name, cards, cache):
    state = load_kernel(FIXTURES / name)
    proposing = [card for card in cards if any(t.name == EXPECTED[name] for t, _ in card_sites(card, state))]
    assert proposing, f"no admitted card proposes {EXPECTED[name]} on {name}"
    compiled = set()
    for card in proposing:
        applied = apply_everywhere(card, state)
        assert applied is not None and applied.state.fingerprint != state.fingerprint
        if applied.state.fingerprint not in compiled:
            compiles_without_spills(applied.state, cache)
            compiled.add(applied.state.fingerprint)
    # the new forward changes the launch consistently: a warp per row multiplies, four elements divide
    grid = str(apply_everywhere(proposing[0], state).state.plan.launches[0].grid[0])
    assert {"serialize_reduction": grid.endswith(") * 32"), "scalarize_elementwise": grid.endswith(", 4)"),
            "untile_transpose": grid == "cdiv(cols, 32)"}[EXPECTED[name]]


def test_a_card_without_the_mechanism_proposes_no_structural_site(cards):
    state = load_kernel(FIXTURES / "row_sum")
    unrelated = [card for card in cards if card.transform in ("unroll", "launch_bounds", "restrict")]
    assert unrelated
    assert all(t.name == card.transform for card in unrelated for t, _ in card_sites(card, state))
