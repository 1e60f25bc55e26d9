from django.urls import path

from skills_app import lineage_views, views

app_name = "skills"

urlpatterns = [
    path("library/", views.library, name="library"),
    path("kernels/", views.kernels, name="kernels"),
    # Kernel names are corpus paths (row_softmax/naive, adversarial/hang).
    path("kernels/<path:name>/", views.kernel, name="kernel"),
    path("problems/", views.problems, name="problems"),
    path("problems/<str:operator>/", views.problem, name="problem"),
    path("verdicts/", views.verdicts, name="verdicts"),
    path("verdicts/<str:key>/", views.verdict, name="verdict"),
    path("lineages/", lineage_views.lineages, name="lineages"),
    path("lineages/<str:lineage_id>/", lineage_views.lineage, name="lineage"),
    path("review/", lineage_views.review_queue, name="review"),
    path("review/<int:step_id>/", lineage_views.review_step, name="review-step"),
]
