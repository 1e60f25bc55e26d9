from django.urls import path

from gate_app import api, views

app_name = "gate"

urlpatterns = [
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/<int:job_id>/", views.job_detail, name="job"),
    path("jobs/<int:job_id>/state", views.job_state, name="job-state"),
    path("jobs/<int:job_id>/cancel", views.cancel, name="job-cancel"),
    path("jobs/<int:job_id>/again", views.run_again, name="job-again"),
    path("optimize/", views.optimize, name="optimize"),
    path("upload/", views.upload, name="upload"),
    # Under /api/ beside the read-only router (klineage_web/urls.py tries that first).
    path("api/jobs/", api.JobSubmitView.as_view(), name="api-jobs"),
    path("api/uploads/", api.UploadView.as_view(), name="api-uploads"),
]
