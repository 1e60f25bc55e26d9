"""Lineage pages and the review queue on real data: the committed dry walk of row_softmax/warp_vec4
(imported with the corpus) and a copy of it with rejected attempts, with the recorded verdicts of
their states (the vendor ratios come from those)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dashboard_data import corpus  # noqa: F401
from klineage import config
from klineage.lineage import Lineage as LineageDocument
from klineage.skills.titles import anchor_where
from klineage.walk.timing_audit import step_pairings
from klineage_web.diff_rows import diff_lines
from lineage_data import vendor_verdict, with_rejections
from skills_app.importer import import_lineage, store_verdict
from skills_app.models import Lineage, LineageStep, Review, Verdict

pytestmark = pytest.mark.django_db


@pytest.fixture
def dry(corpus) -> Lineage:
    return Lineage.objects.get(source_path="corpus/lineages/row_softmax_warp_vec4.dry.json")


@pytest.fixture
def branched(corpus) -> Lineage:
    lineage, _ = import_lineage(with_rejections())
    return lineage


@pytest.fixture
def reviewer(django_user_model):
    user = django_user_model.objects.create_user("grace", password="pw-grace")
    user.groups.add(Group.objects.get(name="reviewer"))
    return user


def test_list_and_detail_render(client, dry, branched):
    page = client.get("/lineages/")
    assert page.status_code == 200
    text = page.content.decode()
    assert f'href="/lineages/{dry.id}/"' in text and f'href="/lineages/{branched.id}/"' in text
    assert "dry walk" in text
    for lineage in (dry, branched):
        response = client.get(f"/lineages/{lineage.id}/")
        assert response.status_code == 200
    assert client.get("/lineages/" + "0" * 64 + "/").status_code == 404


def test_list_filters(client, dry, branched):
    def ids(query: str) -> set[str]:
        return set(re.findall(r'href="/lineages/([0-9a-f]{64})/"', client.get(f"/lineages/?{query}").content.decode()))

    # The corpus brings walks of other experts too: each filter is read on this test's two lineages.
    ours = {dry.id, branched.id}
    assert ids("problem=row_softmax") >= ours
    assert not ids("problem=gemm") & ours
    assert ids("termination=step_limit&rewriter=rules") >= ours
    assert not ids("termination=complete") & ours
    assert ids("assurance=unverified_compile_only") >= ours
    gpu_walks = set(Lineage.objects.filter(gate_mode="gpu").values_list("id", flat=True))
    assert gpu_walks and ids("assurance=gpu_verified") == gpu_walks  # the committed GPU walks
    assert "No lineage matches" in client.get("/lineages/?rewriter=llm").content.decode()


def test_timeline_shows_each_step_with_its_diff(client, dry):
    text = client.get(f"/lineages/{dry.id}/").content.decode()
    assert "Dry walk · unverified." in text
    steps = list(dry.steps.filter(kind="accepted").order_by("index"))
    positions = [text.index(f'id="step-accepted-{s.index}"') for s in steps]
    assert positions == sorted(positions)  # expert first, then each step in order
    first = steps[0]
    assert "forward untimed" in text
    assert anchor_where(first.anchor) in text.replace("&#x27;", "'")
    # Diffs load when opened: the page names where each comes from and carries none.
    url = f"/lineages/{dry.id}/steps/{first.index}/diff"
    assert f'data-src="{url}"' in text and '<tr class="diff-' not in text
    diff = client.get(url, HTTP_X_FRAGMENT="1").content.decode()
    assert "<html" not in diff and "without the step (the walk&#x27;s child)" in diff
    # Forward, as cards show theirs: the bound the walk removed is an added line, noted as such.
    assert '<tr class="diff-add"><td class="diff-gutter" aria-hidden="true">+</td>' in diff
    assert '<span class="tok-cuda">__launch_bounds__</span>' in diff
    assert "adds source row_softmax_warp_vec4:launch_bounds" in diff
    assert "<html" in client.get(url).content.decode()  # opened on its own, a page
    assert client.get(f"/lineages/{dry.id}/steps/999/diff").status_code == 404
    # Per-case verdict of the child.
    assert 'class="case-chip case-not_run" title="headline: not_run"' in text


def test_diff_lines_highlights_and_annotates():
    diff = ("--- parent/kernel.cu\n+++ child/kernel.cu\n@@ -1,3 +1,3 @@\n int x;\n"
            "-__global__ void __launch_bounds__(256) k(float* __restrict__ a)\n-// two\n"
            "+__global__ void k(float* a)\n")
    rows = diff_lines(diff, [{"level": "source", "locus": "k", "name": "launch_bounds"}],
                      [{"level": "source", "locus": "k", "name": "plain"}])
    kinds = [r["kind"] for r in rows]
    assert kinds == ["file", "file", "hunk", "ctx", "del", "del", "add"]
    assert rows[4]["notes"] == ["source k:launch_bounds"] and rows[5]["notes"] == []
    assert rows[6]["notes"] == ["source k:plain"]
    assert '<span class="tok-cuda">__global__</span>' in rows[4]["code"]
    assert rows[0]["code"] == "--- parent/kernel.cu"
    evil = diff_lines("+<script>alert(1)</script>\n")
    assert "<script>" not in evil[0]["code"]


def test_rejected_attempts_branch_off_their_step(client, branched):
    text = client.get(f"/lineages/{branched.id}/").content.decode()
    step1 = text.index('id="step-accepted-1"')
    step2 = text.index('id="step-accepted-2"')
    compile_error = text.index('id="step-rejected-0"')
    assert step1 < compile_error < step2
    assert "<details class=\"rejected-attempt\"" in text
    last = text.index('id="step-rejected-1"')
    assert last > text.index(f'id="step-accepted-{branched.accepted_count - 1}"')
    # Each attempt's evidence loads when it is opened.
    evidence = [client.get(f"/lineages/{branched.id}/rejected/{i}/", HTTP_X_FRAGMENT="1").content.decode()
                for i in (0, 1)]
    assert "identifier &quot;v4&quot; is undefined" in evidence[0] and "identifier" not in text
    assert "still present" in evidence[1]  # the audit detail


def _section(text: str, start: str, end: str) -> str:
    return text[text.index(start):text.index(end)]


def test_timing_bars_render_when_timed(client, corpus):
    document = with_rejections()
    transition = document["transitions"][0]
    transition["forward"] = {"status": "slower", "message": "the parent is not fast enough",
                             "timing": {"overall": 0.97, "per_trial": [0.98, 1.01, 0.95], "required": 0.99}}
    lineage, _ = import_lineage(document)
    text = client.get(f"/lineages/{lineage.id}/").content.decode()
    step = _section(text, 'id="step-accepted-0"', 'id="step-accepted-1"')
    parent = step[step.index('aria-label="child time / parent time"'):]
    assert parent.count('class="ratio-row"') == 4 and "vs parent" in parent
    assert "ratio-fill ratio-slow" in parent and "0.950" in parent
    # The badge says what failed, and the sentence every ratio against the required one.
    assert "below 0.99x on the median" in step
    assert "child/parent time 0.970x (trials 0.980x, 1.010x, 0.950x): the median at 0.970x" in step
    # A walk times steps against their parent only: no vendor number for this step's child.
    assert "vendor not timed in this run" in step and "ratio-bars-vendor" not in step


def test_a_biased_forward_timing_says_so_with_both_medians(client, corpus):
    """conv2d/implicit_gemm_any's step 13 as its walk paired it was biased (state 13 timed 543.6 us
    as a candidate, 375.7 us as a baseline); re-timed with its kernels exchanging places (session
    16) it shows that ratio, and stored as the walk's pairing alone it shows both medians."""
    conv = Lineage.objects.get(source_path="bench/walks/conv2d_implicit_gemm_any.gpu.json.gz")

    def step_13() -> str:
        return _section(client.get(f"/lineages/{conv.id}/").content.decode(), 'id="step-accepted-13"',
                        'id="step-accepted-14"')

    retimed = step_13()
    assert "re-timed 0.992" in retimed and "the walk&#x27;s pairing gave 0.691" in retimed
    assert "timing biased" not in retimed
    walked = step_pairings(LineageDocument.load(config.REPO_ROOT / conv.source_path), retimings=False)[13]
    conv.steps.filter(kind="accepted", index=13).update(pairing=walked.pairing.value, pairing_note=walked.note,
                                                         retimed_ratio=None)
    biased = step_13()
    assert "timing biased" in biased and "state 13 timed 543.6 us as a candidate and 375.7 us as a baseline" in biased
    clean = _section(client.get(f"/lineages/{conv.id}/?part=2").content.decode(), 'id="step-accepted-38"',
                     'id="step-accepted-39"')
    assert "timing biased" not in clean and "forward " in clean
    queue = client.get(f"/review/?lineage={conv.id}&kind=accepted").content.decode()
    assert 'class="badge badge-pairing-biased" title="state 13 timed 543.6 us as a candidate' in queue
    assert 'class="badge badge-pairing-exchanged"' in queue  # step 7 and the others re-timed


def test_a_step_shows_its_childs_vendor_ratio_from_the_verdict_that_timed_it(client, dry):
    child = dry.steps.get(kind="accepted", index=2).child_state
    url = f"/lineages/{dry.id}/"
    with CaptureQueriesContext(connection) as before:
        client.get(url)
    stored = {}
    for name, overall, trials, created, rejected in [
            ("older", 0.70, [0.69, 0.71, 0.70], "2026-11-30T10:00:00+00:00", False),
            ("newer", 0.82, [0.81, 1.02, 0.82], "2026-11-30T11:00:00+00:00", False),
            ("rejected", 2.5, [2.5, 2.5, 2.5], "2026-11-30T12:00:00+00:00", True)]:
        key, document = vendor_verdict(child.fingerprint, child.name, overall, trials, created=created,
                                       rejected=rejected)
        stored[name], _ = store_verdict(key, document)
    assert {v.state_id for v in stored.values()} == {child.pk}  # linked to the lineage's state by fingerprint
    with CaptureQueriesContext(connection) as after:
        text = client.get(url).content.decode()
    assert len(after) == len(before)  # one query finds the vendor ratios of every step

    step = _section(text, 'id="step-accepted-2"', 'id="step-accepted-3"')
    vendor = step[step.index('class="ratio-bars ratio-bars-vendor"'):]
    assert 'aria-label="vendor time / child time"' in vendor
    assert vendor.count('class="ratio-row"') == 4 and "vs vendor" in vendor
    # The newest passed verdict's ratios, overall and per trial; never the older one's, nor a rejected one's.
    assert "0.820" in vendor and "0.810" in vendor and "1.020" in vendor
    assert "0.700" not in vendor and "2.500" not in vendor
    assert f'href="/verdicts/{stored["newer"].key}/"' in vendor and "on NVIDIA H200" in vendor
    assert vendor.count("ratio-fill ratio-slow") == 3  # slower than the vendor, but in trial 2
    assert 'title="parity 1.0"' in vendor
    assert "vendor not timed" not in step
    # The steps around it keep saying the vendor was not timed.
    for start, end in (('id="step-accepted-1"', 'id="step-accepted-2"'),
                       ('id="step-accepted-3"', 'id="step-accepted-4"')):
        other = _section(text, start, end)
        assert "vendor not timed in this run" in other and "ratio-bars-vendor" not in other


def test_the_expert_shows_the_vendor_ratio_of_its_own_gate_verdict(client, dry):
    timed = [v for v in Verdict.objects.filter(state=dry.expert_state, status="passed")
             if "vs_vendor" in (v.document.get("profile") or {}).get("ratios", {})]
    assert timed, "the corpus records the expert's gate verdict with the vendor timed"
    newest = max(timed, key=lambda v: (v.created, v.id))
    ratio = newest.document["profile"]["ratios"]["vs_vendor"]
    text = client.get(f"/lineages/{dry.id}/").content.decode()
    expert = _section(text, 'class="tl-state tl-expert"', 'id="step-accepted-0"')
    assert 'aria-label="vendor time / expert time"' in expert
    assert f'href="/verdicts/{newest.key}/"' in expert and f"{ratio['overall']:.3f}" in expert
    assert expert.count('class="ratio-row"') == 1 + len(ratio["per_trial"])
    # No step of the dry walk was gated with the vendor: each says so, without a number.
    assert text.count("vendor not timed in this run") == dry.accepted_count


def test_review_queue_lists_unreviewed_steps(client, branched, dry):
    text = client.get("/review/").content.decode()
    # GPU walks' steps first; a dry walk's steps were only compiled and wait in a list of their own
    gpu = LineageStep.objects.filter(lineage__assurance=Lineage.Assurance.GPU_VERIFIED).count()
    dry_steps = LineageStep.objects.filter(lineage__assurance=Lineage.Assurance.UNVERIFIED).count()
    assert f"{gpu} steps waiting" in text and f"{dry_steps} steps of dry walks wait apart" in text
    assert f"{dry_steps} steps waiting" in client.get("/review/?walks=dry").content.decode()
    assert f"{gpu + dry_steps} steps waiting" in client.get("/review/?walks=all").content.decode()
    assert "Log in</a> as a reviewer" in text
    assert 'name="verdict"' not in text


def test_review_anonymous_is_sent_to_log_in(client, dry):
    step = dry.steps.first()
    response = client.post(f"/review/{step.id}/", {"verdict": "confirm"})
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert not Review.objects.exists()


def test_review_without_permission_is_forbidden(client, dry, django_user_model):
    client.force_login(django_user_model.objects.create_user("eve"))  # no password: force_login needs none
    step = dry.steps.first()
    assert client.post(f"/review/{step.id}/", {"verdict": "confirm"}).status_code == 403
    assert not Review.objects.exists()
    assert "not in the reviewer group" in client.get("/review/").content.decode()


def test_reviewer_confirms_and_disputes(client, dry, reviewer):
    client.force_login(reviewer)
    steps = list(dry.steps.filter(kind="accepted").order_by("index"))
    mine = f"/review/?lineage={dry.id}"
    queue = client.get(mine).content.decode()
    assert f'action="/review/{steps[0].id}/"' in queue
    response = client.post(f"/review/{steps[0].id}/", {"verdict": "confirm", "comment": "looks right"})
    assert response.status_code == 302 and response["Location"] == "/review/"
    # A dispute needs a comment.
    client.post(f"/review/{steps[1].id}/", {"verdict": "dispute", "comment": ""})
    assert not Review.objects.filter(step=steps[1]).exists()
    response = client.post(f"/review/{steps[1].id}/", {"verdict": "dispute", "comment": "unroll changed rounding",
                                                       "next": "lineage"})
    assert response["Location"] == f"/lineages/{dry.id}/#step-accepted-1"
    assert [r.verdict for r in Review.objects.order_by("id")] == ["confirm", "dispute"]
    assert Review.objects.get(step=steps[1]).reviewer == reviewer
    assert LineageStep.objects.get(pk=steps[1].pk).disputed
    assert not LineageStep.objects.get(pk=steps[0].pk).disputed

    queue = client.get(mine).content.decode()
    assert f'action="/review/{steps[0].id}/"' not in queue and f'action="/review/{steps[1].id}/"' not in queue
    assert "unroll changed rounding" in queue  # recent reviews

    page = client.get(f"/lineages/{dry.id}/").content.decode()
    card = page[page.index('id="step-accepted-1"') - 60:page.index('id="step-accepted-2"')]
    assert "tl-disputed" in card and "badge-disputed" in card and "unroll changed rounding" in card
    confirmed = page[page.index('id="step-accepted-0"'):page.index('id="step-accepted-1"')]
    assert "badge-confirmed" in confirmed and "by grace" in confirmed


def test_review_queue_filters(client, dry, branched, reviewer):
    client.force_login(reviewer)

    def steps(query: str) -> set[int]:
        return {
            int(n) for n in re.findall(r'action="/review/(\d+)/"', client.get(f"/review/?{query}").content.decode())
        }

    branched_rejected = set(branched.steps.filter(kind="rejected").values_list("id", flat=True))
    assert steps(f"lineage={branched.id}&kind=rejected") == branched_rejected != set()
    assert steps(f"lineage={dry.id}&kind=rejected") == set()
    assert steps("operator=no_such_operator") == set()
    text = client.get(f"/review/?lineage={dry.id}").content.decode()
    assert f"{dry.steps.count()} steps waiting" in text


def test_review_requires_post_and_csrf(dry, reviewer):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(reviewer)
    step = dry.steps.first()
    assert client.get(f"/review/{step.id}/").status_code == 405
    assert client.post(f"/review/{step.id}/", {"verdict": "confirm"}).status_code == 403
    assert not Review.objects.exists()


def test_pages_follow_read_access(client, dry, settings):
    settings.KLINEAGE_READ_OPEN = False
    for url in ("/lineages/", f"/lineages/{dry.id}/", "/review/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), url


def test_diffs_side_by_side_pair_removed_with_added_lines(client, dry):
    from klineage_web.diff_rows import diff_lines, split_rows

    rows = diff_lines("--- a\n+++ b\n@@ -1,4 +1,4 @@\n ctx\n-old1\n-old2\n+new1\n tail\n-gone\n")
    split = split_rows(rows)
    kinds = [(r["kind"], r["left"] and r["left"]["kind"], r["right"] and r["right"]["kind"]) for r in split]
    assert kinds == [("file", "file", "file"), ("file", "file", "file"), ("hunk", "hunk", "hunk"),
                     ("ctx", "ctx", "ctx"), ("pair", "del", "add"), ("pair", "del", None), ("ctx", "ctx", "ctx"),
                     ("pair", "del", None)]
    assert "old1" in str(split[4]["left"]["code"]) and "new1" in str(split[4]["right"]["code"])
    page = client.get(f"/lineages/{dry.id}/?diff=split").content.decode()
    assert '<a href="?diff=split" aria-current="true">side by side</a>' in page
    assert f'data-src="/lineages/{dry.id}/steps/0/diff?diff=split"' in page
    unified = client.get(f"/lineages/{dry.id}/steps/0/diff", HTTP_X_FRAGMENT="1").content.decode()
    side = client.get(f"/lineages/{dry.id}/steps/0/diff?diff=split", HTTP_X_FRAGMENT="1").content.decode()
    assert 'class="diff diff-split"' in side and 'class="diff diff-split"' not in unified
    assert '<tr class="diff-pair">' in side and '<tr class="diff-add">' in unified
    assert side.count('class="diff-note diff-note-add"') == unified.count('class="diff-note diff-note-add"') > 0


def test_overview_table_and_speedup_chart_of_a_gpu_walk(client, corpus):
    """row_softmax/warp_vec4's GPU walk: one table row per step with its ratio, trials and verdict in
    words, a cumulative speedup chart naive -> expert, and both orders."""
    gpu = Lineage.objects.get(source_path="corpus/lineages/row_softmax_warp_vec4.gpu.json")
    text = client.get(f"/lineages/{gpu.id}/").content.decode()
    table = _section(text, 'id="step-table"', "</table>")
    steps = list(gpu.steps.filter(kind="accepted").order_by("index"))
    assert table.count('<tr data-kind="accepted"') == len(steps) == 23
    first = steps[0].forward_timing
    assert f'{first["overall"]:.3f}x' in table and "trials " + ", ".join(f"{v:.3f}x" for v in first["per_trial"]) \
        in table
    # "verified" is never the word: a step is faster by some percent or not slower than its mark
    assert "verified" not in table and "not slower than 0.99x" in table and "faster by " in table
    chart = _section(text, '<figure class="speedup-chart">', "</figure>")
    assert chart.count('<circle class="chart-point') == len(steps) + 1
    product = 1.0
    for step in steps:
        product *= step.forward_timing["overall"]
    assert f"expert ({product:.3f}x)" in chart and "estimates the end-to-end speedup" in chart
    assert "bundled with the corpus" in text
    backward = [int(i) for i in re.findall(r'id="step-accepted-(\d+)"', text)]
    forward = [int(i) for i in re.findall(r'id="step-accepted-(\d+)"',
                                          client.get(f"/lineages/{gpu.id}/?order=forward").content.decode())]
    assert backward == sorted(backward) and forward == backward[::-1]


def test_a_dry_walk_has_no_chart_and_says_why(client, dry):
    text = client.get(f"/lineages/{dry.id}/").content.decode()
    assert "speedup-chart" not in text and "a dry walk only compiles" in text


def test_short_ids_shown_on_pages_work_in_urls(client, dry):
    short = dry.id[:12]
    response = client.get(f"/lineages/{short}/?order=forward")
    assert response.status_code == 302 and response["Location"] == f"/lineages/{dry.id}/?order=forward"
    assert client.get(f"/lineages/{short}/steps/0/diff").status_code == 200
    assert client.get(f"/lineages/{short[:8]}/").status_code == 404  # too short to name one lineage
    assert client.get("/lineages/ffffffffffff/").status_code == 404


def test_a_lineage_made_by_a_job_says_who_started_it_and_when(client, dry, django_user_model):
    from gate_app.models import Job

    owner = django_user_model.objects.create_user("ada", password="pw-for-tests")
    job = Job.objects.create(kind=Job.Kind.WALK, owner=owner, params={}, result={"lineage": dry.id})
    text = client.get(f"/lineages/{dry.id}/").content.decode()
    assert f'<a href="/jobs/{job.id}/">job #{job.id}</a>, started by ada' in text


def test_a_long_lineage_draws_its_timeline_in_parts_and_the_table_links_across(client, corpus):
    gdn = Lineage.objects.get(source_path="bench/walks/gdn_chunked_mma.gpu.json.gz")
    assert gdn.accepted_count == 64
    first = client.get(f"/lineages/{gdn.id}/").content.decode()
    drawn = [int(i) for i in re.findall(r'id="step-accepted-(\d+)"', first)]
    assert drawn == list(range(24)) and "part 1 of 3" in first and "tl-expert" in first and "tl-naive" not in first
    table = _section(first, 'id="step-table"', "</table>")
    assert table.count('<tr data-kind="accepted"') == 64 and table.count('<tr data-kind="rejected"') == 117
    assert 'href="#step-accepted-23"' in table and 'href="?order=backward&amp;part=3#step-accepted-63"' in table
    last = client.get(f"/lineages/{gdn.id}/?part=3").content.decode()
    assert [int(i) for i in re.findall(r'id="step-accepted-(\d+)"', last)] == list(range(48, 64))
    assert "tl-naive" in last and "tl-expert" not in last
    forward = client.get(f"/lineages/{gdn.id}/?order=forward").content.decode()
    assert [int(i) for i in re.findall(r'id="step-accepted-(\d+)"', forward)] == list(range(63, 39, -1))
    assert "tl-naive" in forward and forward.index("tl-naive") < forward.index('id="step-accepted-63"')
    assert client.get(f"/lineages/{gdn.id}/?part=x").status_code == 200  # an odd part is the first


def test_a_queued_step_shows_its_ratio_with_trials_and_its_diff(client, corpus):
    gpu = Lineage.objects.get(source_path="corpus/lineages/row_softmax_warp_vec4.gpu.json")
    step = gpu.steps.get(kind="accepted", index=0)
    text = client.get(f"/review/?lineage={gpu.id}&kind=accepted").content.decode()
    item = _section(text, f'id="review-{step.id}"', "</li>")
    timing = step.forward_timing
    assert f'{timing["overall"]:.3f}x</span> child/parent time' in item
    assert ", ".join(f"{v:.3f}x" for v in timing["per_trial"]) in item
    assert f'data-src="/lineages/{gpu.id}/steps/0/diff"' in item and "Vectorize global accesses" in item
