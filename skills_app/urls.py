from django.urls import path

from skills_app import views

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
]
