"""Users and logged-in clients for the tests of pages that need a role."""

from __future__ import annotations

import functools

from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Group, User
from django.test import Client

from gate_app.apps import OPERATOR_GROUP


@functools.cache
def _hashed(password: str) -> str:
    """`password` as the configured hasher stores it (PBKDF2: 0.4 s a call here, paid by well over a hundred
    users a run), made once a process: test users of one name share the encoding, salt included, and a
    login checks it with the real hasher all the same."""
    return make_password(password)


def make_user(name: str, *, operator: bool = False, **extra) -> User:
    """A user whose password is `pw-<name>-1`, in the operator group when `operator` (who may start jobs
    and upload)."""
    user = User.objects.create_user(name, **extra)  # no password yet: the unusable one, which costs no hashing
    user.password = _hashed(f"pw-{name}-1")
    user.save(update_fields=["password"])
    if operator:
        user.groups.add(Group.objects.get(name=OPERATOR_GROUP))
    return user


def logged_in(user: User, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client
