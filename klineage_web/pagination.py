"""Pagination shared by both apps: the list pages' page size and the query string their page links keep, and
the API's page size limits."""

from __future__ import annotations

from django.core.paginator import Page, Paginator
from django.http import QueryDict
from rest_framework.pagination import PageNumberPagination

PAGE_SIZE = 50


def paginate(request, rows) -> Page:
    return Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page"))


def query_without(params: QueryDict, *names: str) -> str:
    """`params` as a query string without `page` (page links add their own) and `names`."""
    query = params.copy()
    for name in ("page", *names):
        query.pop(name, None)
    return query.urlencode()


class Pagination(PageNumberPagination):
    """The API's lists: a client may ask for up to 500 rows a page with ?page_size=."""

    page_size_query_param = "page_size"
    max_page_size = 500
