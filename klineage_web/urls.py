"""Top-level URLs; each app mounts its own pages."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from klineage_web import views
from skills_app.api import router as api_router

admin.site.site_header = "KLineage administration"
admin.site.site_title = "KLineage"

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", views.api_docs, name="api-docs"),
    path("api/", include(api_router.urls)),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    # skills_app first: its /kernels/ pages replace the placeholder gate_app still routes.
    path("", include("skills_app.urls")),
    path("", include("gate_app.urls")),
]

handler404 = "klineage_web.error_views.not_found"
handler403 = "klineage_web.error_views.forbidden"
# A locked SQLite database answers 503 with a message; any other error the styled 500 page.
handler500 = "klineage_web.errors.handler500"
