"""Skill cards: accepted lineage transitions lifted into conditional, verifiable skills.

- `card`: the `SkillCard` document (self-validating, versioned, content-derived id);
- `predicates`: preconditions from evidence (the simplest separating predicate over case parameters);
- `induction`: `induce(lineages)` groups forward transitions into cards;
- `skillmd`: SKILL.md export for coding agents, and lossless import;
- `library`: the cards of a set of lineages with their provenance, as one JSON document;
- `retrieval`: which cards fit a kernel and its problem, best first;
- `materialize`: a card's forward rewrite on a kernel it did not come from;
- `admission`: held-out roundtrip trials that admit (or retire) a card;
- `admission_rule`: the ratio a trial must reach and the status trials give a card.
"""

from klineage.skills.admission import Target, admit, held_out_targets
from klineage.skills.admission_rule import required_ratio
from klineage.skills.card import (
    CARD_VERSION,
    CardAnchor,
    CardStatus,
    Effect,
    Precondition,
    Ref,
    RefKind,
    Risk,
    Scope,
    SkillCard,
    Trial,
    card_id,
)
from klineage.skills.induction import induce, lineage_id
from klineage.skills.library import LIBRARY_VERSION, Library, build_library, load_library, save_library
from klineage.skills.materialize import Applied, apply_everywhere, forward_sites, materialize
from klineage.skills.retrieval import Match, retrieve, state_features
from klineage.skills.skillmd import export_skillmd, import_skillmd
from klineage.skills.trial_reading import TrialOutcome, trial_outcome

__all__ = ["Applied", "CARD_VERSION", "CardAnchor", "CardStatus", "Effect", "LIBRARY_VERSION", "Library", "Match",
           "Precondition", "Ref", "RefKind", "Risk", "Scope", "SkillCard", "Target", "Trial", "TrialOutcome",
           "admit", "apply_everywhere", "build_library", "card_id", "export_skillmd", "forward_sites",
           "held_out_targets", "import_skillmd", "induce", "lineage_id", "load_library", "materialize",
           "required_ratio", "retrieve", "save_library", "state_features", "trial_outcome"]
