"""Which library a page, export or optimization reads: named in its address, or the default one.

Cards are stored per library (`SkillLibrary`), so a card is found within a library. The older
addresses without a library (`/skills/library/<short id>/`) still work: they read the default
library, or the one library that holds the card where the default does not.
"""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet
from django.http import Http404
from django.shortcuts import get_object_or_404

from klineage_web.short_ids import SHORT, one_or_404
from skills_app.models import SkillCard, SkillLibrary, When


def library_or_404(name: str | None) -> SkillLibrary | None:
    """The library named, or the default one where none is (None when no library is stored yet)."""
    if name is None:
        return SkillLibrary.objects.default()
    return get_object_or_404(SkillLibrary, name=name)


def cards_of(library: SkillLibrary | None) -> QuerySet:
    return SkillCard.objects.filter(library=library) if library is not None else SkillCard.objects.none()


def card_or_404(ident: str, library: SkillLibrary | None) -> SkillCard:
    """A card of the library by the short id pages show or by its full content id."""
    cards = cards_of(library).select_related("library")
    return one_or_404(cards, "card_id", ident) if len(ident) > SHORT else get_object_or_404(cards, short_id=ident)


def card_anywhere_or_404(ident: str) -> SkillCard:
    """A card named without its library: the default library's, else the only library's holding it."""
    default = SkillLibrary.objects.default()
    if default is not None and cards_of(default).filter(_ident(ident)).exists():
        return card_or_404(ident, default)
    holders = list(SkillLibrary.objects.filter(cards__in=SkillCard.objects.filter(_ident(ident))).distinct()[:3])
    if len(holders) > 1:
        raise Http404(f"libraries {', '.join(h.name for h in holders)} each hold a card {ident}: "
                      "name the library in the address, /skills/libraries/<library>/<card>/")
    return card_or_404(ident, holders[0] if holders else None)


def _ident(ident: str) -> Q:
    ident = ident.lower()
    if len(ident) > SHORT:
        return Q(card_id=ident) | Q(card_id__startswith=ident)
    return Q(short_id=ident)


def libraries_with_counts() -> QuerySet:
    """Every library with its card, admitted and timing-precondition counts (library pages, the API). An
    admitted card sent back to admission (`skills_app.readmission`) counts apart: optimizations take it for a
    candidate."""
    admitted = Q(cards__status=SkillCard.Status.ADMITTED)
    return SkillLibrary.objects.annotate(
        card_total=Count("cards"),
        admitted=Count("cards", filter=admitted & Q(cards__readmission="")),
        back_to_admission=Count("cards", filter=admitted & ~Q(cards__readmission="")),
        conditioned=Count("cards", filter=Q(cards__when_kind=When.PRECONDITION)),
    ).order_by("name")


def addressed_card(ident: str, library: str | None) -> SkillCard:
    """The card an address names: within its library where it names one, else as `card_anywhere_or_404`."""
    return card_or_404(ident, library_or_404(library)) if library else card_anywhere_or_404(ident)
