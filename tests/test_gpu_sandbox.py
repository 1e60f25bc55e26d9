"""GPU work inside the sandbox (skipped without a GPU): a gate with the sanitizers passes under
bubblewrap and says so in its verdict, and a problem probed on the GPU sees the device nodes but
still none of the instance's secrets."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from klineage import config, corpus
from klineage.errors import DocumentError
from klineage.gate import execute
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Sanitize
from klineage.gate.verdict import Status

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(config.sandbox_disabled(), reason="the sandbox is disabled here")]


def test_gate_with_sanitizers_passes_inside_the_sandbox(tmp_path):
    kernel = corpus.kernel_entry("row_softmax/naive").load()
    verdict = run_gate(corpus.problem_path("row_softmax"), kernel, policy=GatePolicy(sanitize=Sanitize.ON_PASS),
                       cache=GateCache(tmp_path, None))
    assert verdict.status is Status.PASSED, verdict.findings
    assert verdict.environment["sandbox"].startswith("bubblewrap") and "(gpu)" in verdict.environment["sandbox"]
    assert all(report.get("status") == "clean" for report in verdict.sanitizer.values()), verdict.sanitizer


def test_problem_probed_on_the_gpu_sees_the_devices_but_no_secrets(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    secret = f"s3cret-{uuid.uuid4().hex}"
    (data / "secret_key").write_text(secret)
    monkeypatch.setenv("KLINEAGE_DATA_DIR", str(data))
    problem = tmp_path / "hostile.py"
    problem.write_text(
        "import glob, json, os, torch\n"
        f"seen = {{'devices': glob.glob('/dev/nvidia*'), 'uid': os.getuid(), 'cuda': torch.cuda.is_available()}}\n"
        f"try:\n    seen['secret'] = open({str(data / 'secret_key')!r}).read()\n"
        "except OSError as exc:\n    seen['secret'] = type(exc).__name__\n"
        "raise RuntimeError('REPORT' + json.dumps(seen) + 'TROPER')\n", encoding="utf-8")
    with pytest.raises(DocumentError) as raised:
        execute.probe_problem(problem, device="cuda")
    seen = json.loads(re.search(r"REPORT(.*)TROPER", str(raised.value)).group(1))
    assert seen["devices"] and seen["cuda"] and seen["uid"] == 65534
    assert seen["secret"] == "FileNotFoundError"
