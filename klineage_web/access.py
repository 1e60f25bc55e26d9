"""Who may read, for pages and the API alike: anyone when KLINEAGE_READ_OPEN is on, otherwise signed-in users.

Both apps' pages and viewsets read through these two, so opening or closing an instance is one setting.
"""

from functools import wraps

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from rest_framework.permissions import SAFE_METHODS, BasePermission


def read_access(view):
    @wraps(view)
    def checked(request, *args, **kwargs):
        if not settings.KLINEAGE_READ_OPEN and not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        return view(request, *args, **kwargs)

    return checked


class ReadAccess(BasePermission):
    """Reading follows KLINEAGE_READ_OPEN, looked up per request like the pages' read_access."""

    message = "Sign in to read: this instance is not open for reading."

    def has_permission(self, request, view) -> bool:
        if request.method not in SAFE_METHODS:
            return False
        return bool(settings.KLINEAGE_READ_OPEN or (request.user and request.user.is_authenticated))
