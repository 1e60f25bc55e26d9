"""Site-wide pages: home, health probe, API reference."""

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from drf_spectacular.generators import SchemaGenerator

import klineage
from gate_app.models import Job
from klineage_web.access import read_access
from skills_app.summary import dashboard

_HTTP_METHODS = ("get", "post", "put", "patch", "delete")


@require_GET
@read_access
def home(request):
    # The home page shows both apps: the corpus and library from skills_app, the latest jobs from gate_app.
    jobs = Job.objects.select_related("owner").order_by("-created_at")[:5]
    return render(request, "home.html", {**dashboard(), "jobs": jobs})


@require_GET
@never_cache
def healthz(request):
    """Open to unauthenticated probes by design; it reveals only the version and layer kind."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        database = True
    except DatabaseError:
        database = False
    return JsonResponse(
        {
            "status": "ok" if database else "error",
            "database": database,
            "version": klineage.__version__,
            "channel_layer": settings.KLINEAGE_CHANNEL_LAYER,
        },
        status=200 if database else 503,
    )


@require_GET
@read_access
def api_docs(request):
    """The OpenAPI schema as a plain page: no Swagger UI, since it would come from a CDN."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    operations = [
        {
            "method": method.upper(),
            "path": path,
            "summary": operation.get("summary") or operation.get("description", ""),
            "tags": operation.get("tags", []),
        }
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if method in _HTTP_METHODS
    ]
    return render(request, "api_docs.html", {"info": schema["info"], "operations": operations})
