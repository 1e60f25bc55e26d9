"""A fit job from the optimize page: which cards of a stored library would act on a kernel, worked out
by a real worker in the job's child (the problem probed in the sandboxed runner), listed on the job
page in retrieval's order with each other card's reason, each card linked to its library page."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

from gate_app import queue, submit
from gate_app.models import Job
from services import sqlite_job_database, sqlite_template  # noqa: F401  (fixtures)
from skills_app.card_import import import_library
from skills_app.models import SkillCard
from test_walk_job import _finished, dry_library, worker  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


def test_a_fit_job_lists_the_cards_that_would_act_and_why_the_others_would_not(worker, client):  # noqa: F811
    import_library(dry_library(), name="dry")
    cards = SkillCard.objects.filter(library__name="dry").count()
    owner = User.objects.create_user("ada", password="pw")
    owner.user_permissions.add(Permission.objects.get(codename="add_job"))
    client.force_login(owner)
    page = client.get("/optimize/").content.decode()
    assert 'name="fit-library"' in page and "Which cards would act on a kernel?" in page
    response = client.post("/optimize/", {"action": "fit", "fit-kernel": "row_softmax/naive", "fit-problem": "",
                                          "fit-library": "dry", "fit-statuses": ["candidate"]})
    assert response.status_code == 302, response.content.decode()[:2000]
    job = _finished(Job.objects.get(kind="fit").pk, timeout_s=300)
    assert job.status == Job.Status.SUCCEEDED and job.needs == Job.Needs.CPU, f"{job.error}\n{job.log}"
    result = job.result
    assert result["kernel"] == "row_softmax_naive" and result["operator"] == "row_softmax"
    assert len(result["fits"]) == result["cards"] == cards
    proposed = [f for f in result["fits"] if f["fit"] == "proposed"]
    others = [f for f in result["fits"] if f["fit"] != "proposed"]
    assert proposed and all(f["reasons"] and not f["why"] for f in proposed)
    assert all(f["why"] and not f["reasons"] for f in others)

    shown = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f"{len(proposed)} of {cards} cards would be tried on <code>row_softmax_naive</code>" in shown
    first = proposed[0]
    assert f'<a href="/libraries/dry/{first["card"][:12]}/">{first["transform"]}</a>' in shown
    if others:
        assert others[0]["why"].replace("'", "&#x27;") in shown


def test_fit_parameters_are_checked():
    with pytest.raises(queue.QueueError, match="no skill library is stored"):
        submit.fit_params("row_softmax/naive")
    import_library(dry_library())
    assert submit.fit_params("row_softmax/naive") == {"problem": "row_softmax", "kernel": "row_softmax/naive",
                                                      "library": "corpus", "statuses": ["admitted"]}
    with pytest.raises(queue.QueueError, match="statuses"):
        submit.fit_params("row_softmax/naive", statuses=["famous"])
    with pytest.raises(queue.QueueError, match="no skill library named 'nope'"):
        submit.fit_params("row_softmax/naive", library="nope")

