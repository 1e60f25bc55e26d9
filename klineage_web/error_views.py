"""Site-wide error pages with the site's navigation: a page that is not there, one the reader's role
does not open (naming the role and who grants it) and a server error."""

from __future__ import annotations

from django.shortcuts import render

# path prefix -> (role, what it lets a person do); the first that matches names the role a 403 needed
ROLES = (
    ("/review", "reviewer", "confirm or dispute lineage steps"),
    ("/api/reviews", "reviewer", "confirm or dispute lineage steps"),
    ("/optimize", "operator", "start optimizations, walks and gate runs"),
    ("/upload", "operator", "upload problems and kernels"),
    ("/jobs", "operator", "start, cancel and run jobs again"),
    ("/api/jobs", "operator", "start jobs"),
    ("/api/uploads", "operator", "upload problems and kernels"),
    ("/admin", "staff", "use the administration site"),
)


def role_needed(path: str) -> tuple[str, str] | None:
    for prefix, role, purpose in ROLES:
        if path.startswith(prefix):
            return role, purpose
    return None


def not_found(request, exception=None):
    return render(request, "404.html", {"path": request.path}, status=404)


def forbidden(request, exception=None):
    needed = role_needed(request.path)
    return render(request, "403.html", {"role": needed[0] if needed else "", "purpose": needed[1] if needed else "",
                                        "path": request.path}, status=403)


def server_error(request):
    # No context processors' data is trusted here: whatever failed may be among them.
    return render(request, "500.html", status=500)
