"""Kernel folders out of stored states: `klineage kernel export STATE DIR` (a bundled kernel or kernel
folder, or a lineage state by fingerprint or unique prefix) and `klineage optimize ... --save DIR`.

A kernel folder is `kernel.cu` plus `launch.toml`, exactly what `klineage gate` accepts; the folder is
read back after writing and must be the same kernel (the same fingerprint), and a folder that already
holds a different kernel is left as it is (nothing stored is overwritten).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from klineage import config, corpus
from klineage.documents import read_document_text
from klineage.errors import DocumentError, KLineageError
from klineage.kernel import PLAN_FILE, KernelState, load_kernel

LINEAGE_GLOBS = ("corpus/lineages/*.json", "corpus/lineages/*.json.gz", "bench/walks/*.json.gz")
MIN_PREFIX = 8


def plan_toml(state: KernelState) -> str:
    """The launch plan as launch.toml text (buffer arguments as plain names, as people write them)."""
    import tomli_w  # here, not at import: the CLI loads this module for every command

    plan = state.plan.to_dict()
    for launch in plan["launch"]:
        launch["args"] = [a["buffer"] if set(a) == {"buffer"} else a for a in launch["args"]]
    return tomli_w.dumps({k: v for k, v in plan.items() if v not in ("", [])} | {"launch": plan["launch"]})


def write_kernel_folder(state: KernelState, folder: str | Path) -> Path:
    folder = Path(folder)
    if (folder / PLAN_FILE).is_file():
        existing = load_kernel(folder)
        if existing.fingerprint == state.fingerprint:
            return folder
        raise KLineageError(f"{folder} already holds kernel {existing.name} ({existing.fingerprint[:12]}); "
                            "choose an empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / state.plan.source).write_text(state.source, encoding="utf-8")
    (folder / PLAN_FILE).write_text(plan_toml(state), encoding="utf-8")
    written = load_kernel(folder)
    if written.fingerprint != state.fingerprint:  # a plan field the TOML could not carry: say so, never pass it off
        raise KLineageError(f"the folder written to {folder} reads back as another kernel "
                            f"({written.fingerprint[:12]}, not {state.fingerprint[:12]})")
    return folder


def _lineage_states(prefix: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for pattern in LINEAGE_GLOBS:
        for path in sorted(config.REPO_ROOT.glob(pattern)):
            for state in json.loads(read_document_text(path, "lineage")).get("states", []):
                if str(state.get("fingerprint", "")).startswith(prefix):
                    found[state["fingerprint"]] = state
    return found


def find_state(ref: str) -> KernelState:
    """A bundled kernel or kernel folder by name or path, else a lineage state by fingerprint (or prefix)."""
    try:
        return corpus.kernel_entry(ref).load()
    except DocumentError:
        pass
    prefix = ref.strip().lower()
    if len(prefix) < MIN_PREFIX or any(c not in "0123456789abcdef" for c in prefix):
        raise KLineageError(f"'{ref}' is no kernel folder, bundled kernel or state fingerprint (give at least "
                            f"{MIN_PREFIX} hex digits)")
    from klineage.lineage import State

    found = _lineage_states(prefix)
    if len(found) != 1:
        raise KLineageError(f"no lineage state {ref} in {', '.join(LINEAGE_GLOBS)}" if not found else
                            f"'{ref}' names {len(found)} states ({', '.join(f[:12] for f in sorted(found))})")
    (state,) = found.values()
    return State.from_dict(state, f"state {prefix}").kernel


def add_parser(commands: Any) -> None:
    kernel = commands.add_parser("kernel", help="kernels as folders: export a stored state")
    actions = kernel.add_subparsers(dest="kernel_command", required=True)
    export = actions.add_parser("export", help="write a stored state as a kernel folder (kernel.cu + launch.toml)")
    export.add_argument("state", help="a bundled kernel name or folder, or a lineage state fingerprint (prefix)")
    export.add_argument("folder")


def run(args: argparse.Namespace) -> int:
    state = find_state(args.state)
    folder = write_kernel_folder(state, args.folder)
    print(f"{state.name} ({state.fingerprint[:12]}) written to {folder}")
    return 0
