"""Pagination shared by the list pages: one page size, and the query string that page links keep."""

from __future__ import annotations

from django.core.paginator import Page, Paginator
from django.http import QueryDict

PAGE_SIZE = 50


def paginate(request, rows) -> Page:
    return Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page"))


def query_without(params: QueryDict, *names: str) -> str:
    """`params` as a query string without `page` (page links add their own) and `names`."""
    query = params.copy()
    for name in ("page", *names):
        query.pop(name, None)
    return query.urlencode()
