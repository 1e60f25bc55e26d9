"""Ids as both apps' pages show them: the first 12 hex digits of a content id, or the whole id, name one row."""

from __future__ import annotations

from django.db.models import Model, QuerySet
from django.http import Http404

SHORT = 12


def one_or_404(queryset: QuerySet, field: str, ident: str) -> Model:
    """The one row whose `field` is `ident` or, given at least SHORT characters, starts with it."""
    found = queryset.filter(**{field: ident}).first()
    if found is not None:
        return found
    ident = ident.lower()
    matches = list(queryset.filter(**{f"{field}__startswith": ident})[:2]) if len(ident) >= SHORT else []
    if len(matches) != 1:
        raise Http404(f"no single {queryset.model._meta.verbose_name} has an id starting {ident}")
    return matches[0]
