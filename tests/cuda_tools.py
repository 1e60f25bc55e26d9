"""Host-side CUDA helpers the kernel tests share: build and run a host harness that prints integer
tables, and count the SASS mnemonics of a cubin."""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from klineage.toolchain import find_toolchain, run_tool


def run_host_harness(work: Path, arch: str = "sm_90") -> dict[str, list[list[int]]]:
    """Build `work/harness.cu` for `arch` (the device code of the kernel it includes must compile
    for it: sm_90a for wgmma) and run it on the host; each printed line `KEY v1 v2 ...` becomes a
    row of table KEY."""
    toolchain = find_toolchain()
    # -arch=sm_90a would also build compute_90 PTX, where wgmma does not exist: name the one target.
    target = "-arch=sm_90" if arch == "sm_90" else f"-gencode=arch=compute_{arch.removeprefix('sm_')},code={arch}"
    build = subprocess.run([toolchain.nvcc, "-std=c++17", target, "-o", "harness", "harness.cu"], cwd=work,
                           capture_output=True, text=True, env=toolchain.environment(work), timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(work / "harness")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    tables: dict[str, list[list[int]]] = {}
    for line in run.stdout.splitlines():
        key, *values = line.split()
        tables.setdefault(key, []).append([int(v) for v in values])
    return tables


_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def sass_mnemonics(cubin: bytes) -> Counter:
    """Mnemonic counts (modifiers dropped) from cuobjdump -sass; @!PT dummies excluded."""
    toolchain = find_toolchain()
    toolchain.require_nvdisasm()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        text = run_tool([toolchain.cuobjdump, "-sass", str(path)], env=toolchain.environment(Path(tmp)), cwd=tmp)
    counts: Counter = Counter()
    for line in text.splitlines():
        match = _SASS_LINE.match(line)
        if match and (match.group(1) or "").strip() != "@!PT":
            counts[match.group(2)] += 1
    return counts
