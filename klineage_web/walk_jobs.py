"""Template tags that tie a lineage to the walk job that made it (the `walk_jobs` library).

Lineages are skills_app's, jobs gate_app's, and skills_app never imports gate_app; the lineage page's
template, which lives at the project level like this library, asks here instead.
"""

from __future__ import annotations

from typing import Any

from django import template

from gate_app.models import Job

register = template.Library()


@register.simple_tag
def walk_job_of(lineage) -> dict[str, Any] | None:
    """The job that walked `lineage`, when a job did: the job, who started it and when."""
    job = (Job.objects.filter(kind=Job.Kind.WALK, result__lineage=lineage.id).select_related("owner")
           .order_by("-created_at").first())
    return {"job": job, "owner": job.owner.get_username() if job and job.owner else "", "when": job.created_at} \
        if job else None
