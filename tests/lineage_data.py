"""Lineage documents for the dashboard's tests: the committed dry walk of row_softmax/warp_vec4,
and a copy of it with rejected attempts added (the dry walk rejected nothing)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from django.conf import settings

DRY_WALK = Path(settings.BASE_DIR) / "corpus" / "lineages" / "row_softmax_warp_vec4.dry.json"


def dry_walk() -> dict[str, Any]:
    return json.loads(DRY_WALK.read_text(encoding="utf-8"))


def with_rejections(document: dict[str, Any] | None = None) -> dict[str, Any]:
    """The dry walk plus two rejected attempts: a compile error tried at step 1, an audit mismatch
    tried after the last step. Still a valid lineage (the engine checks it on import)."""
    document = copy.deepcopy(document or dry_walk())
    states = [s["fingerprint"] for s in document["states"]]
    last = len(document["transitions"])
    document["rejections"] = [
        {"step": 1, "parent": states[1], "transform": "vectorize", "category": "compile_error",
         "reason": "compile_error", "cases_failed": [],
         "anchor": {"function": "softmax_row", "kind": "loop", "key": "i#0", "snippet": "for (int i = 0; ...)"},
         "evidence": {"message": "nvcc failed: identifier \"v4\" is undefined", "stage": "compile", "case": "",
                      "log": "kernel.cu(41): error: identifier \"v4\" is undefined\n1 error detected",
                      "worst": {}, "audit": {}}},
        {"step": last, "parent": states[last], "transform": "shuffle_to_shared", "category": "audit_mismatch",
         "reason": None, "cases_failed": [], "anchor": None,
         "evidence": {"message": "the audit does not show the declared removal", "stage": "audit", "case": "",
                      "log": "", "worst": {}, "audit": {"declared": "source softmax_row:warp_shuffle",
                                                        "found": "still present"}}},
    ]
    document["stats"]["rejected"] = 2
    return document
