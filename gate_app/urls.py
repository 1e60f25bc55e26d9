from django.urls import path

from gate_app import api, views

app_name = "gate"

urlpatterns = [
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/<int:job_id>/", views.job_detail, name="job"),
    path("jobs/<int:job_id>/state", views.job_state, name="job-state"),
    path("optimize/", views.optimize, name="optimize"),
    # Under /api/ beside the read-only router (klineage_web/urls.py tries that first).
    path("api/jobs/", api.JobSubmitView.as_view(), name="api-jobs"),
]
