from django.urls import path

from skills_app import compare_views, export_views, leaderboard_views, library_views, lineage_views, views

app_name = "skills"

urlpatterns = [
    path("library/", library_views.library, name="library"),
    path("library/export.<str:fmt>", export_views.library_export, name="library-export"),
    path("library/<str:short_id>/", library_views.card, name="card"),
    path("library/<str:short_id>/SKILL.md", library_views.card_skillmd, name="card-skillmd"),
    # The same pages within a named library (library/ reads the default one, skills_app.libraries).
    path("libraries/<slug:library>/", library_views.library, name="library-named"),
    path("libraries/<slug:library>/export.<str:fmt>", export_views.library_export, name="library-named-export"),
    path("libraries/<slug:library>/<str:short_id>/", library_views.card, name="library-card"),
    path("libraries/<slug:library>/<str:short_id>/SKILL.md", library_views.card_skillmd, name="library-card-skillmd"),
    path("kernels/", views.kernels, name="kernels"),
    # Kernel names are corpus paths (row_softmax/naive, adversarial/hang).
    path("kernels/<path:name>/", views.kernel, name="kernel"),
    path("problems/", views.problems, name="problems"),
    path("problems/<str:operator>/", views.problem, name="problem"),
    path("problems/<str:operator>/leaderboard/", leaderboard_views.leaderboard, name="leaderboard"),
    path("verdicts/", views.verdicts, name="verdicts"),
    path("verdicts/<str:key>/", views.verdict, name="verdict"),
    path("lineages/", lineage_views.lineages, name="lineages"),
    path("lineages/<str:lineage_id>/", lineage_views.lineage, name="lineage"),
    path("lineages/<str:lineage_id>/steps.<str:fmt>", export_views.lineage_export, name="lineage-export"),
    path("lineages/<str:lineage_id>/steps/<int:index>/diff", lineage_views.step_diff, name="step-diff"),
    path("lineages/<str:lineage_id>/rejected/<int:index>/", lineage_views.rejected_attempt, name="rejected-attempt"),
    path("compare/", compare_views.compare, name="compare"),
    path("review/", lineage_views.review_queue, name="review"),
    path("review/<int:step_id>/", lineage_views.review_step, name="review-step"),
]
