"""`manage.py create_user NAME --role operator`: an account with its roles, in one command.

Roles are the groups the pages check: `reviewer` (confirm or dispute lineage steps) and `operator`
(upload, start gates, walks and optimizations). The password comes from an environment variable
(`--password-from-env VAR`, for scripts: never on the command line, where `ps` shows it) or from a
prompt; it must pass the site's password validators. `--token` prints an API token for the account.
Administrators are made with Django's own `createsuperuser`.
"""

from __future__ import annotations

import getpass
import os

from django.contrib.auth import get_user_model, password_validation
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from gate_app.apps import OPERATOR_GROUP
from skills_app.apps import REVIEWER_GROUP

ROLES = {REVIEWER_GROUP: "confirm or dispute lineage steps", OPERATOR_GROUP: "upload and start jobs"}


class Command(BaseCommand):
    help = "Create a user with roles (reviewer, operator); the password from an environment variable or a prompt."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", action="append", choices=sorted(ROLES), default=[],
                            help="a role to give (repeat for both): " +
                                 "; ".join(f"{name}: {what}" for name, what in ROLES.items()))
        parser.add_argument("--password-from-env", metavar="VAR",
                            help="read the password from this environment variable (default: prompt)")
        parser.add_argument("--email", default="")
        parser.add_argument("--update", action="store_true",
                            help="the user exists: add the roles (and set the password if one is given)")
        parser.add_argument("--token", action="store_true", help="print an API token for the user")

    def handle(self, *args, username: str, role: list[str], password_from_env: str | None, email: str,
               update: bool, token: bool, **options):
        User = get_user_model()
        existing = User.objects.filter(username=username).first()
        if existing is not None and not update:
            raise CommandError(f"a user named {username!r} exists already: add --update to give it the roles")
        if existing is None and update:
            raise CommandError(f"no user named {username!r} to update")
        groups = self._groups(role)
        password = self._password(password_from_env, asked=existing is None, user=existing or User(username=username,
                                                                                                    email=email))
        with transaction.atomic():
            if existing is None:
                user = User.objects.create_user(username, email=email, password=password)
            else:
                user = existing
                if password is not None:
                    user.set_password(password)
                    user.save(update_fields=["password"])
            user.groups.add(*groups)
        roles = ", ".join(sorted(g.name for g in user.groups.all())) or "none (may read only)"
        self.stdout.write(f"{'updated' if existing else 'created'} {username}; roles: {roles}")
        if token:
            from rest_framework.authtoken.models import Token

            key, _ = Token.objects.get_or_create(user=user)
            self.stdout.write(f"API token: {key.key}  (send it as 'Authorization: Token {key.key}')")

    @staticmethod
    def _groups(roles: list[str]) -> list[Group]:
        found = {g.name: g for g in Group.objects.filter(name__in=roles)}
        missing = sorted(set(roles) - set(found))
        if missing:
            raise CommandError(f"the group(s) {', '.join(missing)} do not exist yet: run `manage.py migrate` first")
        return [found[name] for name in roles]

    def _password(self, variable: str | None, *, asked: bool, user) -> str | None:
        """The new password, checked by the validators; None to keep an existing user's."""
        if variable is not None:
            password = os.environ.get(variable)
            if not password:
                raise CommandError(f"the environment variable {variable} is not set or empty")
        elif not asked:
            return None
        else:
            if not os.isatty(0):
                raise CommandError("no terminal to ask for the password: use --password-from-env VAR")
            password = getpass.getpass("Password: ")
            if password != getpass.getpass("Password (again): "):
                raise CommandError("the two passwords differ")
        try:
            password_validation.validate_password(password, user)
        except ValidationError as exc:
            raise CommandError("password refused: " + " ".join(exc.messages)) from None
        return password
