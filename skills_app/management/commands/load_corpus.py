"""`manage.py load_corpus`: bring the bundled corpus, recorded verdicts and skill library into the database."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count

from skills_app.card_import import STALE, import_library_files
from skills_app.importer import CREATED, UNCHANGED, UPDATED, ImportRefused, import_corpus
from skills_app.models import SkillLibrary


class Command(BaseCommand):
    help = ("Import bundled problems (probed in the sandbox), kernels with the adversarial suite, committed "
            "lineages (corpus/lineages/*.json, and the GPU walks of bench/walks/*.gpu.json.gz), recorded verdicts "
            "and skill libraries (corpus/library/*.json). Idempotent and quick when nothing changed; a malformed "
            "document stores nothing and names its file.")

    def add_arguments(self, parser):
        parser.add_argument("--corpus", type=Path, help="corpus folder (default: KLINEAGE_CORPUS_DIR or corpus/)")
        parser.add_argument("--recorded", type=Path,
                            help="recorded verdicts folder (default: KLINEAGE_RECORDED_DIR or recorded/)")
        parser.add_argument("--walks", type=Path,
                            help="GPU walks not yet in the library, *.gpu.json or *.gpu.json.gz (default: "
                                 "KLINEAGE_BENCH_WALKS_DIR or bench/walks/, with the bundled corpus)")

    def handle(self, *args, **options):
        try:
            report = import_corpus(corpus_root=options["corpus"], recorded_root=options["recorded"],
                                   walks_root=options["walks"])
        except ImportRefused as exc:
            raise CommandError(f"nothing imported: {exc}") from None
        for line in report.lines():
            self.stdout.write(line)
        if report.unlinked:
            self.stdout.write(self.style.WARNING(
                "some recorded verdicts name kernel states that are neither in the corpus nor earlier "
                "sources of its kernels; they are kept and attach if those states are imported"))
        try:
            cards = import_library_files(options["corpus"])
        except ImportRefused as exc:
            raise CommandError(f"no skill cards imported (the corpus above was): {exc}") from None
        self.stdout.write(f"skill cards: {sum(cards.values())} ({cards[CREATED]} new, {cards[UPDATED]} updated, "
                          f"{cards[UNCHANGED]} unchanged, {cards[STALE]} older than stored)")
        stored = SkillLibrary.objects.annotate(n=Count("cards")).order_by("name")
        self.stdout.write("skill libraries: " + (", ".join(f"{lib.name} ({lib.n} cards, from {lib.source})"
                                                           for lib in stored) or "none"))
