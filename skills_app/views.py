"""Skill library pages."""

from klineage_web.views import pending_section

library = pending_section(
    "Library",
    "Admitted skill cards: what each optimization needs to hold, what it gained, how it failed "
    "without its preconditions, and the lineages it was learned from.",
)
