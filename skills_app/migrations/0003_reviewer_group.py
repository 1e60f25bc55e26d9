"""The "reviewer" group: its members may confirm or dispute lineage steps (skills_app.add_review)."""

from django.db import migrations

GROUP = "reviewer"


def create_group(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    # Permissions are normally created after migrations; create this one now so the group can hold it.
    content_type, _ = ContentType.objects.get_or_create(app_label="skills_app", model="review")
    permission, _ = Permission.objects.get_or_create(content_type=content_type, codename="add_review",
                                                     defaults={"name": "Can add review"})
    group, _ = Group.objects.get_or_create(name=GROUP)
    group.permissions.add(permission)


def remove_group(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name=GROUP).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("skills_app", "0002_lineages"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_group, remove_group)]
