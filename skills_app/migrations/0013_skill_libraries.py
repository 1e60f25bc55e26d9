import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Max


def adopt_stored_cards(apps, schema_editor):
    """Cards stored before libraries were told apart all came from corpus/library/*.json, imported into
    one table: they become the bundled corpus library's, which the next load_corpus brings up to date."""
    cards = apps.get_model("skills_app", "SkillCard").objects
    if not cards.exists():
        return
    library = apps.get_model("skills_app", "SkillLibrary").objects.create(
        name="corpus", source="corpus/library/*.json",
        note="cards stored before the dashboard kept more than one library",
        created=cards.aggregate(latest=Max("library_created"))["latest"])
    cards.update(library=library)


class Migration(migrations.Migration):

    dependencies = [
        ('skills_app', '0012_card_imported'),
    ]

    operations = [
        migrations.CreateModel(
            name='SkillLibrary',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.SlugField(help_text='from the file: corpus, percase ...', max_length=60, unique=True)),
                ('source', models.CharField(help_text='the file it was imported from, as the import named it', max_length=300)),
                ('note', models.TextField(blank=True, default='', help_text="the provenance's note: how it was built")),
                ('provenance', models.JSONField(default=dict)),
                ('created', models.DateTimeField(blank=True, help_text='when the library document was written', null=True)),
                ('imported_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'verbose_name_plural': 'skill libraries',
                'ordering': ['name'],
            },
        ),
        migrations.AddField(
            model_name='skillcard',
            name='library',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name='cards', to='skills_app.skilllibrary'),
        ),
        migrations.RunPython(adopt_stored_cards, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='skillcard',
            name='library',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='cards', to='skills_app.skilllibrary'),
        ),
        migrations.AlterField(
            model_name='skillcard',
            name='card_id',
            field=models.CharField(help_text="sha256 of the card's identity", max_length=64),
        ),
        migrations.AlterField(
            model_name='skillcard',
            name='short_id',
            field=models.CharField(max_length=12),
        ),
        migrations.AddConstraint(
            model_name='skillcard',
            constraint=models.UniqueConstraint(fields=('library', 'card_id'), name='skills_card_unique_in_library'),
        ),
        migrations.AddConstraint(
            model_name='skillcard',
            constraint=models.UniqueConstraint(fields=('library', 'short_id'), name='skills_card_short_unique_in_library'),
        ),
    ]
