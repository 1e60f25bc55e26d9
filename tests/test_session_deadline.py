"""bench/gpu_session.sh's deadline: no stage's time limit runs past the device time the call has, less a margin
for the archives written after the stages (run here through bench_tools.session_stage, no GPU)."""

from __future__ import annotations

import re
import time

from bench_tools import session_stage


def _limit(stdout: str) -> int:
    return int(re.search(r"=== nosuch \([0-9:]+\), limit (-?\d+) s", stdout).group(1))


def test_a_stage_limit_is_cut_to_what_the_deadline_leaves(tmp_path):
    env = {"DEADLINE": str(int(time.time()) + 100), "DEADLINE_MARGIN": "30"}
    done, _ = session_stage("nosuch@500", tmp_path, env)
    assert 60 <= _limit(done.stdout) <= 70, done.stdout
    done, _ = session_stage("nosuch", tmp_path, env)  # a stage without a limit of its own gets one
    assert 60 <= _limit(done.stdout) <= 70, done.stdout
    done, _ = session_stage("nosuch@40", tmp_path, env)  # a shorter limit stays
    assert _limit(done.stdout) == 40


def test_a_stage_is_skipped_when_the_deadline_leaves_no_time_for_it(tmp_path):
    done, _ = session_stage("nosuch@500", tmp_path, {"DEADLINE": str(int(time.time()) + 35), "DEADLINE_MARGIN": "30"})
    assert "=== nosuch skipped:" in done.stdout and "unknown stage" not in done.stdout


def test_without_a_deadline_the_limit_is_the_stages_own(tmp_path):
    done, _ = session_stage("nosuch@500", tmp_path, {})
    assert _limit(done.stdout) == 500 and "unknown stage nosuch" in done.stdout
