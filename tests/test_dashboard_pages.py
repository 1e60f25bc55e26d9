"""The dashboard's pages on the imported corpus: each renders, filters work, access is checked."""

from __future__ import annotations

import re

import pytest

from dashboard_data import clear_dashboard_rows, corpus  # noqa: F401
from klineage_web.cuda_highlight import highlight_lines, tokenize
from skills_app.models import Kernel, Lineage, Problem, Verdict

pytestmark = pytest.mark.django_db

SECTIONS = ["/", "/kernels/", "/problems/", "/verdicts/", "/library/", "/lineages/", "/jobs/", "/api/docs/"]


def _kernel_names(response) -> list[str]:
    return re.findall(r'href="/kernels/([\w/]+)/"', response.content.decode())


def _one_verdict_of_each_shape() -> list[str]:
    """A verdict's page is drawn from its operator, status, reason, mode, baseline and whichever
    sections, profile parts and kinds of finding it holds: one verdict of each such shape (about 1,700 recorded ones
    fall into far fewer shapes; rendering them all took 26 s of the suite)."""
    shapes: dict[tuple, str] = {}
    for key, operator, status, reason, mode, against, document in Verdict.objects.values_list(
            "key", "operator", "status", "reason", "mode", "against", "document"):
        sections = tuple(sorted(name for name, value in document.items() if value))
        profile = tuple(sorted(document.get("profile") or {}))
        findings = tuple(sorted({(f.get("reason", ""), f.get("stage", "")) for f in document.get("findings") or []}))
        shapes.setdefault((operator, status, reason, mode, bool(against), sections, profile, findings), key)
    return list(shapes.values())


def test_every_kind_of_page_renders(client, corpus):
    urls = list(SECTIONS)
    urls += [f"/kernels/{name}/" for name in Kernel.objects.values_list("name", flat=True)]
    urls += [f"/problems/{op}/" for op in Problem.objects.filter(current=True).values_list("operator", flat=True)]
    urls += [f"/verdicts/{key}/" for key in _one_verdict_of_each_shape()]
    urls += [f"/lineages/{key}/" for key in Lineage.objects.values_list("id", flat=True)] + ["/review/"]
    assert len(urls) > 50
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
        assert b"KLineage" in response.content


def test_home_shows_real_numbers(client, corpus):
    page = client.get("/").content.decode()
    assert f'data-stat="problems">{Problem.objects.filter(current=True).count()}<' in page
    assert f'data-stat="kernels">{Kernel.objects.filter(adversarial=False).count()}<' in page
    assert f'data-stat="adversarial">{Kernel.objects.filter(adversarial=True).count()}<' in page
    assert f'data-stat="verdicts">{Verdict.objects.count()}<' in page
    suite = Kernel.objects.filter(adversarial=True).count()
    assert f'data-stat="suite">{suite}/{suite}<' in page  # every adversarial kernel rejected
    assert f"<strong>{suite}</strong> with the expected reason" in page
    rejected = Verdict.objects.filter(status="rejected").count()
    assert f"{rejected} rejected" in page
    # Evidence from bench/results, with its provenance.
    for title in ("Adversarial suite", "Example speedups", "Gate cost"):
        assert title in page
    assert "on NVIDIA H200, commit c2f793c" in page


def test_home_without_data_says_how_to_import(client, corpus):
    clear_dashboard_rows()  # rolled back after the test
    page = client.get("/").content.decode()
    assert "manage.py load_corpus" in page


@pytest.mark.parametrize(("query", "expected"), [
    ("problem=gemm", {"gemm/mma_sync", "gemm/mma_sync_any", "gemm/naive", "gemm/wgmma_tma"}),
    ("problem=topk&status=passed", {"topk/radix_select"}),
    ("problem=topk&status=none", {"topk/naive"}),
    ("suite=adversarial&q=write", {"adversarial/write_nothing", "adversarial/write_out_of_bounds",
                                   "adversarial/write_zeros"}),
    ("arch=sm_90a", {"gemm/wgmma_tma", "conv2d/implicit_wgmma", "fmha/flash_wgmma"}),
    ("arch=sm_90a&problem=topk", set()),
    ("problem=gdn", {"gdn/chunked", "gdn/chunked_mma", "gdn/recurrent"}),
])
def test_kernel_filters(client, corpus, query, expected):
    response = client.get(f"/kernels/?{query}")
    assert response.status_code == 200
    assert set(_kernel_names(response)) == expected
    if not expected:
        assert b"No kernel matches these filters" in response.content


def test_kernel_status_filter_matches_latest_verdicts(client, corpus):
    rejected = set(_kernel_names(client.get("/kernels/?status=rejected")))
    assert rejected == set(Kernel.objects.filter(adversarial=True).values_list("name", flat=True))
    passed = set(_kernel_names(client.get("/kernels/?status=passed")))
    assert "row_softmax/warp_vec4" in passed and not passed & rejected


def test_an_unknown_filter_value_is_reported(client, corpus):
    response = client.get("/kernels/?status=sideways")
    assert response.status_code == 200
    assert b"Some filters were not understood" in response.content


def test_verdict_filters(client, corpus):
    page = client.get("/verdicts/?status=rejected&reason=race").content.decode()
    keys = set(re.findall(r'href="/verdicts/([0-9a-f]{64})/"', page))
    assert keys == set(Verdict.objects.filter(reason="race").values_list("key", flat=True)) != set()


def test_kernel_page(client, corpus):
    page = client.get("/kernels/row_softmax/warp_vec4/").content.decode()
    assert '<span class="tok-cuda">__global__</span>' in page
    assert '<span class="tok-kw">constexpr</span>' in page
    assert "row_softmax_warp_vec4" in page and "THREADS" in page  # launch plan
    assert "Resources per entry" in page and "<td class=\"num\">64</td>" in page  # registers from ptxas
    assert "ldg_128" in page and "vector_type_float4" in page  # SASS and source features
    assert page.count('class="bar-svg"') >= 2  # timing bars, inline SVG
    assert "speedup" in page and "of roofline" in page
    assert "recorded on NVIDIA H200, commit c2f793c" in page
    assert "timed against row_softmax/naive" in page


def test_kernel_page_highlights_inline_asm(client, corpus):
    page = client.get("/kernels/gemm/mma_sync/").content.decode()
    assert '<span class="tok-asm">mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32</span>' in page
    assert '<span class="tok-asm-op">%0</span>' in page


def test_kernel_page_shows_tma_tensor_map_arguments_readably(client, corpus):
    page = client.get("/kernels/gemm/wgmma_tma/").content.decode()
    assert ('<code class="arg">tensor_map(x: bf16, dims [K, M], strides [K * 2], box [BLOCK_K, BLOCK_M], '
            'swizzle 128B, L2 promotion 256B)</code>') in page
    assert '<code class="arg">tensor_map(W: bf16, dims [K, N],' in page
    assert '<code class="arg">y</code>' in page and '<code class="arg">M : i32</code>' in page
    assert "{&#x27;tensor_map&#x27;" not in page and "'tensor_map':" not in page  # not the raw dict


def test_plan_arg_filter():
    from klineage.launch import Arg
    from klineage_web.template_filters import plan_arg

    rank1 = Arg.from_dict({"tensor_map": "v", "dtype": "f32", "dims": ["N"], "box": [256]}, "args").to_dict()
    assert plan_arg(rank1) == "tensor_map(v: f32, dims [N], box [256], swizzle none, L2 promotion 256B)"
    assert plan_arg({"buffer": "x"}) == plan_arg("x") == "x"
    assert plan_arg({"scalar": "rows * 2", "type": "i64"}) == "rows * 2 : i64"


def test_adversarial_kernel_page(client, corpus):
    page = client.get("/kernels/adversarial/race_no_barrier/").content.decode()
    assert "The gate must reject this kernel with <strong>race</strong>" in page
    assert "racecheck found" in page  # correctness passed on every case; the sanitizer caught it
    assert page.count('<span class="badge badge-passed">pass</span>') >= 6


def test_kernel_without_verdicts(client, corpus):
    page = client.get("/kernels/gemm/naive/").content.decode()
    assert "No verdict on this state yet" in page
    assert "No compile record yet" in page


def test_problem_page(client, corpus):
    page = client.get("/problems/row_softmax/").content.decode()
    for case in ("headline", "ragged", "long_rows", "small"):
        assert f"<code>{case}</code>" in page
    assert "Tolerances" in page and "Outputs" in page
    assert "memory" in page  # softmax is memory-bound on the roofline
    for name in Kernel.objects.filter(operator="row_softmax").values_list("name", flat=True):
        assert f'href="/kernels/{name}/"' in page


def test_legacy_problem_page(client, corpus):
    page = client.get("/problems/legacy_vector_add/").content.decode()
    assert "reference KLineage format" in page


def test_verdict_page(client, corpus):
    verdict = Verdict.objects.get(reason="memcheck")
    page = client.get(f"/verdicts/{verdict.key}/").content.decode()
    assert "memcheck found" in page
    assert "Invalid __global__ read" in page  # the sanitizer excerpt, escaped
    assert "recorded on NVIDIA H200, commit c2f793c, 2026-11-29" in page
    for stage in ("static", "compile", "run", "memcheck"):
        assert f"<td>{stage}</td>" in page
    assert f'href="/api/verdicts/{verdict.key}/"' in page


def test_verdict_page_without_gpu_environment(client, corpus):
    verdict = Verdict.objects.get(kernel_name="adv_cache_by_pointer")
    page = client.get(f"/verdicts/{verdict.key}/").content.decode()
    assert "device_state" in page
    assert "recorded on NVIDIA H200" in page  # the GPU named by the key when the run never reached it
    assert "not timed" in page and "not reached" in page


@pytest.mark.parametrize("url", ["/kernels/no/such/", "/problems/nothing/", "/verdicts/" + "0" * 64 + "/"])
def test_unknown_records_are_404(client, corpus, url):
    assert client.get(url).status_code == 404


def test_pages_load_nothing_from_other_sites(client, corpus):
    for url in ("/", "/kernels/row_softmax/warp_vec4/"):
        page = client.get(url).content.decode()
        assert not re.search(r'<(?:script|link|img)[^>]+(?:src|href)="(?:https?:)?//', page), url


def test_read_closed_sends_visitors_to_login(client, corpus, settings, django_user_model):
    settings.KLINEAGE_READ_OPEN = False
    key = Verdict.objects.values_list("key", flat=True).first()
    urls = ["/", "/kernels/", "/kernels/row_softmax/naive/", "/problems/", "/problems/gemm/", "/verdicts/",
            f"/verdicts/{key}/"]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/accounts/login/?next=")
    client.force_login(django_user_model.objects.create_user("ada"))  # no password: force_login needs none
    for url in urls:
        assert client.get(url).status_code == 200, url


def test_highlighter_escapes_and_classes():
    lines = highlight_lines('#include <cuda.h>\n__global__ void k(float4* __restrict__ p) { if (p) p[0].x = 1.5f; }\n'
                            '/* two\nlines */ const char* s = "a<b";\n')
    assert len(lines) == 4
    assert lines[0] == '<span class="tok-pp">#include &lt;cuda.h&gt;</span>'
    assert '<span class="tok-cuda">__global__</span> <span class="tok-type">void</span>' in lines[1]
    assert '<span class="tok-type">float4</span>' in lines[1] and '<span class="tok-num">1.5f</span>' in lines[1]
    assert lines[2] == '<span class="tok-com">/* two</span>'  # a comment spanning lines is closed per line
    assert lines[3].startswith('<span class="tok-com">lines */</span>')
    assert '<span class="tok-str">&quot;a&lt;b&quot;</span>' in lines[3]


def test_highlighter_reads_inline_ptx():
    kinds = {(t.kind, t.text) for t in tokenize(
        'asm volatile("{ .reg .pred p; setp.ne.b32 p, %0, 0; @p bra DONE; }" :: "r"(x) : "memory");')}
    assert ("asm", "setp.ne.b32") in kinds and ("asm", "bra") in kinds and ("asm", ".reg") in kinds
    assert ("asm-operand", "%0") in kinds
    assert ("asm", "p") not in kinds and ("asm", "DONE") not in kinds
    assert ("string", '"memory"') in kinds  # clobbers are plain strings
    # Outside asm, a string that looks like PTX stays a string.
    assert [t.kind for t in tokenize('printf("mov.u32 %d");') if t.kind] == ["string"]
