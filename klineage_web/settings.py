"""Django settings. What varies between deployments comes from the environment, via env.py only."""

from datetime import timedelta

import klineage
from klineage_web import env, security

# Lower case keeps it out of django.conf.settings, so error pages never show it whole.
web_env = env.load()

BASE_DIR = env.REPO_DIR
DATA_DIR = web_env.data_dir
DEBUG = web_env.debug
SECRET_KEY = web_env.secret_key
ALLOWED_HOSTS = web_env.allowed_hosts
CSRF_TRUSTED_ORIGINS = web_env.csrf_trusted_origins

INSTALLED_APPS = [
    "daphne",  # first: its runserver replaces Django's, so development runs under ASGI too
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "axes",
    "django_filters",
    "drf_spectacular",
    "channels",
    "skills_app",
    "gate_app",
]

MIDDLEWARE = [
    "klineage_web.body_limit.BodyLimitMiddleware",  # first: nothing may read an oversize body (WSGI)
    "klineage_web.head.HeadAsGetMiddleware",  # outside GZip: HEAD's Content-Length is the GET body's
    "django.middleware.security.SecurityMiddleware",
    # Outside WhiteNoise, so static files served from source folders are compressed too (collected ones
    # come pre-compressed, brotli or gzip). Django's gzip pads its header at random against BREACH.
    "django.middleware.gzip.GZipMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "csp.middleware.CSPMiddleware",  # sends a policy only under KLINEAGE_HTTPS (security.py)
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes requires: turns a lockout into its page
]

ROOT_URLCONF = "klineage_web.urls"
WSGI_APPLICATION = "klineage_web.wsgi.application"
ASGI_APPLICATION = "klineage_web.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "klineage_web.context_processors.site",
            ],
            # Project-level tag libraries: `klineage` formats both apps' pages; `walk_jobs` ties a lineage to its job.
            "libraries": {
                "klineage": "klineage_web.template_filters",
                "walk_jobs": "klineage_web.walk_jobs",
            },
        },
    },
]

DATABASES = {"default": web_env.database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CHANNEL_LAYERS = web_env.channel_layers
KLINEAGE_CHANNEL_LAYER = web_env.channel_layer_kind
# Progress pushed over WebSockets reaches other processes (job workers) only through Redis;
# without it pages poll instead.
KLINEAGE_CROSS_PROCESS_PROGRESS = web_env.channel_layer_kind == "redis"
KLINEAGE_READ_OPEN = web_env.read_open
# GPU jobs (walks, optimizations, gates on a GPU) one user may have queued or running at once.
KLINEAGE_GPU_JOB_QUOTA = web_env.gpu_job_quota

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Login throttling (django-axes): every password login (the login page, the admin's) goes through
# authenticate(request=...), which the first backend refuses for a locked-out username and address.
# Lift a lockout early with `manage.py axes_reset_username NAME` (or axes_reset_ip ADDRESS, axes_reset).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = 5
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]  # one client cannot lock a user out everywhere
AXES_COOLOFF_TIME = timedelta(minutes=15)
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# Behind a proxy, daphne --proxy-headers puts the client's address in REMOTE_ADDR (docs/deployment.md).
AXES_IPWARE_META_PRECEDENCE_ORDER = ("REMOTE_ADDR",)

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "home"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# WhiteNoise serves static files from inside Django: collected ones (`collectstatic`, run by `make run`)
# under hashed names with year-long caching, and the source folders' files too, so a checkout that never
# collected still works (klineage_web/staticfiles.py).
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise warns about a missing one; the data dir exists (env.load)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "klineage_web.staticfiles.HashedWhenCollected"},
}
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "klineage_web.staticfiles.CollectedFinder",
]
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Security headers; those that hold only over HTTPS (secure cookies, HSTS, CSP) come from security.py.
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
globals().update(security.https_settings(web_env.https))

_READ_PERMISSION = (
    "rest_framework.permissions.IsAuthenticatedOrReadOnly"
    if web_env.read_open
    else "rest_framework.permissions.IsAuthenticated"
)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [_READ_PERMISSION],
    "DEFAULT_PARSER_CLASSES": [
        "klineage_web.parsers.DepthCheckedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "KLineage API",
    "DESCRIPTION": "Kernels, gate verdicts, lineages and the skill library of a KLineage instance.",
    "VERSION": klineage.__version__,
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": [_READ_PERMISSION],
    "COMPONENT_SPLIT_REQUEST": True,
}
