from django.urls import path

from skills_app import views

app_name = "skills"

urlpatterns = [
    path("library/", views.library, name="library"),
]
