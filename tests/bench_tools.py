"""The scripts of bench/ as modules, for the tests that drive them (bench/ is no package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "bench"


def bench_script(name: str) -> ModuleType:
    """bench/<name>.py, loaded once per process (registered in sys.modules: dataclasses need it)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def session_stage(spec: str, tmp: Path, env: dict[str, str], timeout: int = 300):
    """One stage of bench/gpu_session.sh run here: its functions without the install and GPU checks, and
    python3 a shim that turns `--gate gpu` into the compile gate (no GPU here) and keeps its arguments.
    The finished process, and the arguments of the last python3 call; $OUT is tmp/out."""
    import os
    import subprocess

    text = (BENCH / "gpu_session.sh").read_text()
    functions = text[text.index("walk() {"):text.index('if [ "${1:-}" = --lanes ]')]
    shims = tmp / "bin"
    shims.mkdir(exist_ok=True)
    (shims / "python3").write_text(
        f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "{tmp}/argv"\nargs=(); prev=""\n'
        f'for a in "$@"; do [ "$prev" = --gate ] && a=compile; args+=("$a"); prev=$a; done\n'
        f'exec "{sys.executable}" "${{args[@]}}"\n')
    (shims / "python3").chmod(0o755)
    for folder in ("results", "lineages"):  # as the session makes them before its stages
        (tmp / "out" / folder).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "OUT": str(tmp / "out"), **env}
    done = subprocess.run(["bash", "-c", f"{functions}\nstage {spec}"], cwd=BENCH.parent, env=env,
                          capture_output=True, text=True, timeout=timeout)
    argv = (tmp / "argv").read_text().split("\n") if (tmp / "argv").exists() else []
    return done, argv
