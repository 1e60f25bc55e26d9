"""Who may read pages: anyone when KLINEAGE_READ_OPEN is on, otherwise signed-in users."""

from functools import wraps

from django.conf import settings
from django.contrib.auth.views import redirect_to_login


def read_access(view):
    @wraps(view)
    def checked(request, *args, **kwargs):
        if not settings.KLINEAGE_READ_OPEN and not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        return view(request, *args, **kwargs)

    return checked
