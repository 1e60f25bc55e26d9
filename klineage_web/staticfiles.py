"""Static files: hashed, compressed names once `collectstatic` has run, the sources' own names before.

`make run` runs collectstatic, so pages link `klineage.<hash>.css` (cached for a
year, served pre-compressed by WhiteNoise). Without a collected manifest (a fresh checkout, the test
suite), or with one older than a source file (a stale collect would point pages at old CSS), pages
link the plain names, which WhiteNoise serves from the source folders (WHITENOISE_USE_FINDERS).
"""

from __future__ import annotations

from pathlib import Path

from django.contrib.staticfiles import finders
from django.contrib.staticfiles.storage import staticfiles_storage
from whitenoise.storage import CompressedManifestStaticFilesStorage


class HashedWhenCollected(CompressedManifestStaticFilesStorage):
    def load_manifest(self):
        paths, digest = super().load_manifest()
        return (paths, digest) if paths and self.collected_is_current() else ({}, "")

    def collected_is_current(self) -> bool:
        """Whether `collectstatic` ran since the last change to a source file."""
        manifest = Path(self.path(self.manifest_name))
        return manifest.is_file() and _newest_source() <= manifest.stat().st_mtime

    def stored_name(self, name):
        return super().stored_name(name) if self.hashed_files else name


def _newest_source() -> float:
    newest = 0.0
    for finder in finders.get_finders():
        for path, storage in finder.list(ignore_patterns=[]):
            newest = max(newest, Path(storage.path(path)).stat().st_mtime)
    return newest


class CollectedFinder(finders.BaseFinder):
    """Finds the collected copies under their hashed names, for servers that look static files up
    through the finders rather than WhiteNoise (the test suite's live server, DEBUG's runserver), so
    that pages linking hashed names work there too. Lists nothing: collectstatic must not collect them."""

    def find(self, path, find_all=False, **kwargs):
        hashed = getattr(staticfiles_storage, "hashed_files", {})
        found = staticfiles_storage.path(path) if path in hashed.values() else None
        if find_all:
            return [found] if found else []
        return found or []

    def list(self, ignore_patterns):
        return []
