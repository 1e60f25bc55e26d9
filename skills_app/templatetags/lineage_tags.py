"""Filters for the lineage pages."""

from django import template

from klineage.skills.titles import anchor_where

register = template.Library()


@register.filter
def words(value) -> str:
    """An enum value as words: not_run -> not run, no_mechanical_forward -> no mechanical forward."""
    return str(value or "").replace("_", " ")


@register.filter
def where(anchor) -> str:
    """An anchor as a short site name ("softmax_row: xv"), its JSON key tail left out."""
    return anchor_where(anchor or {})
