"""The registry of job kinds (gate_app/kinds.py): every entry names functions (and a job page) that exist, the
database's choices are the built-in entries (no migration), a malformed entry or an unknown kind is refused with
its reason, a module named by KLINEAGE_JOB_KINDS_MODULE adds kinds (and may not redefine one), and the job's child
runs only the kinds the registry knows."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.template.loader import get_template

from gate_app import forms, kinds
from gate_app.kinds import MODULE_ENV, Device, JobKind, KindError, Offered
from gate_app.models import Job
from job_kinds import ENV
from services import REPO


@pytest.mark.parametrize("kind", kinds.BUILT_IN, ids=lambda kind: kind.name)
def test_every_built_in_kind_names_functions_that_exist(kind):
    assert callable(kind.handle) and callable(kind.run)
    assert kind.handle.__module__ == "gate_app.work" and kind.run.__module__ == "gate_app.runners"
    if kind.offered is not Offered.NOWHERE:
        assert callable(kind.check_params) and issubclass(kind.form_class, forms._JobForm)
        assert kind.options() and "kernel" not in kind.options()
    if kind.presenter:
        assert callable(kinds._load(kind.presenter))
    if kind.page:  # a page of its own, filling the job page's kind_ blocks
        assert get_template(kind.page).template.source.startswith('{% extends "gate_app/job.html" %}')


@pytest.mark.django_db
def test_the_database_choices_are_the_built_in_entries_and_need_no_migration():
    assert Job.Kind.choices == [(kind.name, kind.label) for kind in kinds.BUILT_IN]
    assert Job._meta.get_field("kind").choices == Job.Kind.choices
    assert Job.Kind.WALK == "walk" and Job.Kind.PROBE.label == "problem probe"
    call_command("makemigrations", "gate_app", "--check", "--dry-run", verbosity=0)  # SystemExit(1) on a change


def test_what_people_submit_where():
    assert set(kinds.offered(Offered.PAGE_AND_API)) == {"walk", "optimize", "fit"}
    assert set(kinds.offered(Offered.PAGE, Offered.PAGE_AND_API)) == {"gate", "walk", "optimize", "fit"}
    assert kinds.get("probe").offered is Offered.NOWHERE


@pytest.mark.parametrize("params, needs", [({"mode": "gpu"}, "gpu"), ({"mode": "compile"}, "cpu"),
                                           ({"mode": "replay"}, "cpu"), ({}, "gpu")])
def test_a_gate_mode_kind_needs_a_gpu_only_for_a_gpu_gate(params, needs):
    assert kinds.get("walk").needs(params) == kinds.get("gate").needs(params) == needs
    assert kinds.get("probe").needs(params) == kinds.get("fit").needs(params) == "cpu"


def test_a_job_parameters_are_checked_against_its_kind():
    walk = kinds.get("walk")
    params = dict.fromkeys(walk.required, 1)
    walk.check_keys(params)
    with pytest.raises(KindError, match=r"walk parameters must be exactly .*, not \['kernel'"):
        walk.check_keys({"kernel": "k"})
    with pytest.raises(KindError, match="budget"):
        walk.check_keys({**params, "budget": 4})


@pytest.mark.parametrize("fields, message", [
    ({"name": "Walk"}, "lower-case identifier"),
    ({"handler": "gate_app.work.run_walk_job"}, "handler must be 'module:name'"),
    ({"runner": "gate_app.runners:"}, "runner must be 'module:name'"),
    ({"required": frozenset({"a"}), "optional": frozenset({"a"})}, "both required and optional"),
    ({"offered": Offered.PAGE}, "a check and a form"),
    ({"check": "gate_app.submit:walk_params", "form": "gate_app.forms:WalkForm"}, "a check and a form"),
    ({"page": "gate_app/kinds/walk"}, "page must name a template"),
])
def test_a_malformed_entry_is_refused(fields, message):
    entry = {"name": "stroll", "label": "stroll", "device": Device.CPU, "handler": "m:h", "runner": "m:r", **fields}
    with pytest.raises(KindError, match=message):
        JobKind(**entry)


def test_a_module_named_in_the_environment_adds_kinds_and_may_not_redefine_one(monkeypatch, tmp_path):
    monkeypatch.delenv(MODULE_ENV, raising=False)
    with pytest.raises(KindError, match=r"unknown job kind 'sleep' \(known: fit, gate, optimize, probe, walk\)"):
        kinds.get("sleep")
    monkeypatch.setenv(MODULE_ENV, ENV[MODULE_ENV])
    assert list(kinds.registry()) == ["gate", "walk", "optimize", "fit", "probe", "sleep"]
    assert kinds.get("sleep").needs({}) == "cpu" and kinds.get("sleep").offered is Offered.NOWHERE

    (tmp_path / "walk_again.py").write_text(
        "from gate_app.kinds import Device, JobKind\n"
        "KINDS = (JobKind('walk', 'another walk', Device.CPU, handler='m:h', runner='m:r'),)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(MODULE_ENV, "walk_again")
    with pytest.raises(KindError, match="walk_again .* defines job kind 'walk' again"):
        kinds.registry()


def _child(payload: dict, env: dict[str, str]) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "gate_app.child"], input=json.dumps(payload), capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=60)
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_child_runs_only_the_kinds_the_registry_knows(monkeypatch):
    monkeypatch.delenv(MODULE_ENV, raising=False)
    plain = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    refused = _child({"kind": "sleep", "seconds": 0}, plain)
    assert refused[-1] == {"error": "unknown job kind 'sleep' (known: fit, gate, optimize, probe, walk)",
                           "type": "KindError"}
    slept = _child({"kind": "sleep", "seconds": 0, "steps": 1, "echo": "hi"}, {**plain, **ENV})
    assert slept[0]["progress"]["stage"] == "sleep" and slept[-1]["result"]["echo"] == "hi"
