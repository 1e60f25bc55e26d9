from django.apps import AppConfig
from django.db.models.signals import post_migrate, post_save

REVIEWER_GROUP = "reviewer"


def ensure_reviewer_group(sender, using="default", **kwargs) -> None:
    """Keep the "reviewer" group (made by migration 0003) with skills_app.add_review, also after a
    database flush, which removes the migration's rows but sends post_migrate again."""
    from django.contrib.auth.models import Group, Permission

    permission = Permission.objects.using(using).filter(content_type__app_label="skills_app",
                                                        codename="add_review").first()
    if permission is None:
        return
    group, _ = Group.objects.using(using).get_or_create(name=REVIEWER_GROUP)
    group.permissions.add(permission)


class SkillsAppConfig(AppConfig):
    name = "skills_app"
    verbose_name = "Skill library"

    def ready(self) -> None:
        # After auth's own handler (which creates the permissions): connect with the app as sender,
        # and Django sends post_migrate to apps in INSTALLED_APPS order, auth before skills_app.
        post_migrate.connect(ensure_reviewer_group, sender=self, dispatch_uid="skills_app.reviewer_group")
        # Every review, from the page or the API, re-marks the cards that stand on its step.
        from skills_app.readmission import on_review_saved

        post_save.connect(on_review_saved, sender="skills_app.Review", dispatch_uid="skills_app.readmission")
