"""Skill cards: accepted lineage transitions lifted into conditional, verifiable skills.

- `card`: the `SkillCard` document (self-validating, versioned, content-derived id);
- `predicates`: preconditions from evidence (the simplest separating predicate over case parameters);
- `induction`: `induce(lineages)` groups forward transitions into cards;
- `skillmd`: SKILL.md export for coding agents, and lossless import.
"""

from klineage.skills.card import (CARD_VERSION, CardAnchor, CardStatus, Effect, Precondition, Ref, RefKind, Risk,
                                  Scope, SkillCard, Trial, card_id)
from klineage.skills.induction import induce, lineage_id
from klineage.skills.skillmd import export_skillmd, import_skillmd

__all__ = ["CARD_VERSION", "CardAnchor", "CardStatus", "Effect", "Precondition", "Ref", "RefKind", "Risk", "Scope",
           "SkillCard", "Trial", "card_id", "export_skillmd", "import_skillmd", "induce", "lineage_id"]
