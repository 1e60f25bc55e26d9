"""Unified diffs as table rows for the pages that show code changes (steps, cards, comparisons, optimization
jobs): each line highlighted with the CUDA highlighter and given its +/- gutter, unified or side by side."""

from __future__ import annotations

from typing import Any

from django.utils.html import escape
from django.utils.safestring import mark_safe

from klineage_web.cuda_highlight import highlight_lines


def diff_lines(diff: str, removed: list[dict[str, Any]] | None = None,
               added: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """A unified diff as rows: kind (file, hunk, del, add, ctx), gutter, highlighted code, and
    the feature notes on the first line of each hunk's first run of removed / added lines."""
    notes = {"del": [_feature(f) for f in removed or []], "add": [_feature(f) for f in added or []]}
    rows: list[dict[str, Any]] = []
    noted: set[str] = set()
    previous = ""
    for line in diff.splitlines():
        if line.startswith(("--- ", "+++ ")):
            rows.append({"kind": "file", "gutter": "", "code": line})
            previous = ""
            continue
        if line.startswith("@@"):
            rows.append({"kind": "hunk", "gutter": "", "code": line})
            noted, previous = set(), ""
            continue
        gutter, text = (line[:1], line[1:]) if line[:1] in ("+", "-", " ") else (" ", line)
        kind = {"+": "add", "-": "del"}.get(gutter, "ctx")
        highlighted = highlight_lines(text)
        code = highlighted[0] if highlighted else mark_safe("")
        row = {"kind": kind, "gutter": gutter, "code": code, "notes": []}
        if kind in notes and kind != previous and kind not in noted:
            row["notes"] = notes[kind]
            noted.add(kind)
        rows.append(row)
        previous = kind
    for row in rows:  # headers are plain text, escaped here
        if row["kind"] in ("file", "hunk"):
            row["code"] = escape(row["code"])
    return rows


def split_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Unified rows side by side: headers span both sides, context sits on both, and each run of
    removed lines is paired line by line with the run of added lines that follows it (the
    shorter side padded with blanks)."""
    out: list[dict[str, Any]] = []
    removed: list[dict[str, Any]] = []
    added: list[dict[str, Any]] = []

    def flush() -> None:
        for i in range(max(len(removed), len(added))):
            out.append({"kind": "pair", "left": removed[i] if i < len(removed) else None,
                        "right": added[i] if i < len(added) else None})
        removed.clear()
        added.clear()

    for row in rows:
        if row["kind"] == "del":
            if added:  # a removal after additions starts a new run
                flush()
            removed.append(row)
        elif row["kind"] == "add":
            added.append(row)
        else:
            flush()
            out.append({"kind": row["kind"], "left": row, "right": row})
    flush()
    return out


def diff_layout(request) -> str:
    """"split" (side by side) when the page was asked for it, else "unified"."""
    return "split" if request.GET.get("diff") == "split" else "unified"


def _feature(change: dict[str, Any]) -> str:
    locus = f"{change.get('locus')}:" if change.get("locus") else ""
    return f"{change.get('level', '')} {locus}{change.get('name', '')}".strip()
