from django.urls import path

from gate_app import views

app_name = "gate"

urlpatterns = [
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/<int:job_id>/", views.job_detail, name="job"),
    path("jobs/<int:job_id>/state", views.job_state, name="job-state"),
]
