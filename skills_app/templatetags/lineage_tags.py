"""Filters for the lineage pages."""

from django import template

register = template.Library()


@register.filter
def words(value) -> str:
    """An enum value as words: not_run -> not run, no_mechanical_forward -> no mechanical forward."""
    return str(value or "").replace("_", " ")
