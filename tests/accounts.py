"""Users and logged-in clients for the tests of pages that need a role."""

from __future__ import annotations

from django.contrib.auth.models import Group, User
from django.test import Client

from gate_app.apps import OPERATOR_GROUP


def make_user(name: str, *, operator: bool = False, **extra) -> User:
    """A user, in the operator group when `operator` (who may start jobs and upload)."""
    user = User.objects.create_user(name, password=f"pw-{name}-1", **extra)
    if operator:
        user.groups.add(Group.objects.get(name=OPERATOR_GROUP))
    return user


def logged_in(user: User, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client
