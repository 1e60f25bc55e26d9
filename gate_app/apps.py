from django.apps import AppConfig
from django.db.models.signals import post_migrate

OPERATOR_GROUP = "operator"
SUBMIT_PERMISSION = "gate_app.add_job"  # what the operator group holds: submit walks and optimizations


def ensure_operator_group(sender, using="default", **kwargs) -> None:
    """Keep the "operator" group with gate_app.add_job after every migrate, and after a flush (which
    removes the group but sends post_migrate again)."""
    from django.contrib.auth.models import Group, Permission

    permission = Permission.objects.using(using).filter(content_type__app_label="gate_app",
                                                        codename="add_job").first()
    if permission is None:
        return
    group, _ = Group.objects.using(using).get_or_create(name=OPERATOR_GROUP)
    group.permissions.add(permission)


class GateAppConfig(AppConfig):
    name = "gate_app"
    verbose_name = "Gate"

    def ready(self) -> None:
        # auth comes before gate_app in INSTALLED_APPS, so its handler has created the permission.
        post_migrate.connect(ensure_operator_group, sender=self, dispatch_uid="gate_app.operator_group")
