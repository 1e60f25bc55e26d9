from django.db import migrations, models


def read_each_cards_when(apps, schema_editor):
    """Each stored card's when, read from its document as the importer reads it (a document the engine
    cannot read keeps the default: not timed on any case)."""
    from klineage.errors import KLineageError
    from klineage.skills.card import SkillCard as EngineCard
    from klineage.skills.when import card_when, when_label

    cards = apps.get_model("skills_app", "SkillCard").objects
    rows = []
    for row in cards.all().only("id", "document"):
        try:
            when = card_when(EngineCard.from_dict(row.document))
        except (KLineageError, KeyError, TypeError, ValueError, AttributeError):
            continue
        row.when_kind, row.when_label = when.kind.value, when_label(when)[:300]
        rows.append(row)
    cards.bulk_update(rows, ["when_kind", "when_label"], batch_size=200)


class Migration(migrations.Migration):

    dependencies = [
        ('skills_app', '0013_skill_libraries'),
    ]

    operations = [
        migrations.AddField(
            model_name='skillcard',
            name='when_kind',
            field=models.CharField(choices=[('precondition', 'pays where its timing precondition holds'), ('uniform', 'paid on every case measured'), ('mixed', 'paid on some cases, nothing forced says where'), ('never', 'paid on no case measured'), ('unmeasured', 'not timed on any case')], default='unmeasured', help_text='where its per-case effects say it pays (klineage.skills.when.card_when)', max_length=12),
        ),
        migrations.AddField(
            model_name='skillcard',
            name='when_label',
            field=models.CharField(blank=True, default='', help_text='that in a few words: its timing precondition, or how many cases paid', max_length=300),
        ),
        migrations.AddIndex(
            model_name='skillcard',
            index=models.Index(fields=['library', 'when_kind'], name='skills_card_when'),
        ),
        migrations.RunPython(read_each_cards_when, migrations.RunPython.noop),
    ]
