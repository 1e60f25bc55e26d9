"""`manage.py create_user`: an account with its roles, the password from the environment or a prompt."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from rest_framework.authtoken.models import Token

pytestmark = pytest.mark.django_db
GOOD = "tensor-core-lineage-42"


def _run(*args) -> str:
    out = io.StringIO()
    call_command("create_user", *args, stdout=out)
    return out.getvalue()


def test_an_operator_with_a_password_from_the_environment(monkeypatch):
    monkeypatch.setenv("NEW_PW", GOOD)
    said = _run("olga", "--role", "operator", "--password-from-env", "NEW_PW")
    user = User.objects.get(username="olga")
    assert user.check_password(GOOD)
    assert [g.name for g in user.groups.all()] == ["operator"]
    assert user.has_perm("gate_app.add_job") and not user.has_perm("skills_app.add_review")
    assert "created olga; roles: operator" in said


def test_both_roles_and_a_token(monkeypatch):
    monkeypatch.setenv("NEW_PW", GOOD)
    said = _run("rita", "--role", "reviewer", "--role", "operator", "--password-from-env", "NEW_PW", "--token")
    user = User.objects.get(username="rita")
    assert user.has_perm("skills_app.add_review") and user.has_perm("gate_app.add_job")
    assert f"API token: {Token.objects.get(user=user).key}" in said


def test_update_adds_a_role_and_keeps_the_password(monkeypatch):
    monkeypatch.setenv("NEW_PW", GOOD)
    _run("vic", "--password-from-env", "NEW_PW")
    assert "roles: none (may read only)" in _run("vic", "--update")
    said = _run("vic", "--update", "--role", "reviewer")
    user = User.objects.get(username="vic")
    assert user.check_password(GOOD) and "roles: reviewer" in said


@pytest.mark.parametrize("args, env, message", [
    (("olga", "--password-from-env", "UNSET_PW_VAR"), {}, "UNSET_PW_VAR is not set or empty"),
    (("olga", "--password-from-env", "NEW_PW"), {"NEW_PW": "password"}, "refused: This password is too common"),
    (("olga", "--password-from-env", "NEW_PW"), {"NEW_PW": "olga_x"}, "too similar to the username"),
    (("ghost", "--update", "--role", "operator"), {}, "no user named 'ghost' to update"),
])
def test_refusals_name_the_problem_and_create_nothing(monkeypatch, args, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("UNSET_PW_VAR", raising=False)
    with pytest.raises(CommandError, match=message):
        _run(*args)
    assert not User.objects.exists()


def test_an_existing_user_is_not_overwritten_without_update(monkeypatch):
    monkeypatch.setenv("NEW_PW", GOOD)
    _run("olga", "--password-from-env", "NEW_PW")
    monkeypatch.setenv("NEW_PW", "another-long-password-7")
    with pytest.raises(CommandError, match="exists already: add --update"):
        _run("olga", "--password-from-env", "NEW_PW")
    assert User.objects.get(username="olga").check_password(GOOD)


def test_without_a_terminal_or_variable_it_says_how(monkeypatch):
    monkeypatch.setattr("os.isatty", lambda fd: False)
    with pytest.raises(CommandError, match="use --password-from-env VAR"):
        _run("olga")
