"""unpipeline: a STAGES-deep cp.async ring collapses into a single-stage loop (load, wait all,
barrier, compute, barrier). Goldens for both loop shapes (the wait heading the loop body; the wait
in the last step of an inner k-step loop) compile with nvcc; the corpus experts (gemm/mma_sync and
conv2d/implicit_gemm, with their every-shape variants) are rewritten, compile without spills, lose
the multistage_pipeline feature and half their LDGSTS, and their shared memory shrinks.

The schedule of copies, commit groups, waits, barriers and shared reads is not transcribed by
hand here: a small interpreter walks the real loops of a source (the expert's, the rewritten one)
for a given number of K tiles, and a per-thread model of cp.async groups and barriers checks that
every tile is read only once its copy is complete for every thread, and that no stage is refilled
while a thread may still read it. The model rejects the rewrite with its added barrier removed, and
rejects the shortcut of only setting STAGES to 1 with the wait clamped to 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from tree_sitter import Node

from klineage import corpus, expr
from klineage.corpus import kernel_entry
from klineage.devices import H200
from klineage.features import cuda_parser as cp
from klineage.features.sass import sass_features
from klineage.features.source import source_features
from klineage.gate.compile import compile_kernel
from klineage.kernel import KernelState
from klineage.launch import resolve
from klineage.problem import load_problem
from klineage.transforms import Anchor, NotApplicable, get
from klineage.transforms._async_copy import COMMIT, WAIT, async_roles, c_value, wait_count
from tests.transforms.golden import HERE, check_golden, load

EXPERTS = {
    "gemm/mma_sync": ("gemm_bf16_mma_sync", "gemm_bf16_mma_sync"),
    "gemm/mma_sync_any": ("gemm_tile", "gemm_bf16_mma_sync_any"),
    "conv2d/implicit_gemm": ("conv2d_implicit_gemm", "conv2d_implicit_gemm"),
    "conv2d/implicit_gemm_any": ("conv_tile", "conv2d_implicit_gemm_any"),
}
BARRIER_NOTE = "__syncthreads();  // every warp is done reading the stage before it is refilled"


@pytest.fixture(scope="module")
def unpipeline():
    return get("unpipeline")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "unpipeline" / case, which, "kernel")


def compiled(state: KernelState, cache):
    result = compile_kernel(state, cache)
    assert result.ok, result.log[-3000:]
    for launch in state.plan.launches:
        for arch in result.targets:
            resources = result.resources_for(launch.entry, arch)
            assert not resources.spills and resources.stack_bytes == 0, (launch.entry, arch, resources)
    return result


def names(state: KernelState, locus: str) -> set[str]:
    return {f.name for f in source_features(state.source) if f.locus == locus}


def shared_bytes(state: KernelState) -> int:
    return expr.evaluate_int(state.plan.launches[0].shared, state.constants)


# ------------------------------------------------------------------------------------------------
# A per-thread model of a cp.async ring and an interpreter of the loops that drive it
# ------------------------------------------------------------------------------------------------


class Hazard(AssertionError):
    pass


@dataclass
class Ring:
    """One thread's view: copies join the open group, commit closes it, wait(n) completes all but
    the n most recent groups for this thread, and a barrier makes what every thread completed
    visible to all (every thread runs the same schedule). Stage of tile t: t % stages.
    synchronous: copies complete at once (commit and wait are no-ops), as after sync_copies."""

    stages: int
    tiles: int
    synchronous: bool = False
    holds: dict[int, tuple[int, int]] = field(default_factory=dict)  # stage -> (tile, group)
    open: list[tuple[int, int]] = field(default_factory=list)
    committed: int = 0
    complete_here: int = 0
    complete_everywhere: int = 0
    read_since_barrier: set[int] = field(default_factory=set)
    consumed: list[int] = field(default_factory=list)

    def copy(self, tile: int) -> None:
        stage = tile % self.stages
        if stage in self.read_since_barrier:
            raise Hazard(f"tile {tile} is copied into stage {stage} while it may be read")
        if self.synchronous:
            self.holds[stage] = (tile, self.committed)
            self.committed += 1
            self.complete_here = self.committed
        else:
            self.open.append((stage, tile))

    def commit(self) -> None:
        if self.synchronous:
            return
        for stage, tile in self.open:
            self.holds[stage] = (tile, self.committed)
        self.open = []
        self.committed += 1

    def wait(self, pending: int) -> None:
        if pending < 0:
            raise Hazard(f"wait_group {pending}")
        if not self.synchronous:
            self.complete_here = max(self.complete_here, self.committed - pending)

    def barrier(self) -> None:
        self.complete_everywhere = self.complete_here
        self.read_since_barrier.clear()

    def read(self, tile: int) -> None:
        stage = tile % self.stages
        self.read_since_barrier.add(stage)
        if tile >= self.tiles:  # a prefetch past the last tile: its values are never used
            return
        held = self.holds.get(stage)
        if held is None or held[0] != tile:
            raise Hazard(f"stage {stage} holds {held and held[0]}, not tile {tile}")
        if held[1] >= self.complete_everywhere:
            raise Hazard(f"tile {tile} is read before its copy is complete for every thread")
        self.consumed.append(tile)


@dataclass
class Kernel:
    """How to read one kernel's schedule: the copy calls' tile, the calls that read a stage, and
    which tile a read means (the expert's intent, independent of the ring)."""

    function: str
    copiers: tuple[str, ...]  # the functions that copy one tile's part into a stage
    copy_tile: object  # (parsed, call, env, count) -> tile
    reader: object  # (parsed, statement) -> bool
    read_tile: object  # (parsed, statement, env) -> tile
    bounds: dict[str, str]  # loop-bound name -> "tiles"


def _last_argument(parsed, call, env, constants) -> int:
    args = call.child_by_field_name("arguments").named_children
    return c_value(parsed.text(args[-1]), constants | env)


KERNELS = {
    "gemm": Kernel(
        "", ("load_a_tile_async", "load_b_tile_async"), lambda p, call, env, n, c: _last_argument(p, call, env, c),
        lambda p, s: any(cp.call_name(c) in ("load_a_fragments", "load_b_fragments")
                         for c in cp.nodes_of_type(s, "call_expression")),
        lambda p, s, env, c: env.get("kt", -1) + 1 if c_value(
            p.text(cp.nodes_of_type(s, "call_expression")[0].child_by_field_name("arguments").named_children[-1]),
            c | env) == 0 else env["kt"],
        {"k_tiles": "tiles"}),
    "conv": Kernel(
        "", ("load_stage",), lambda p, call, env, n, c: n,  # the loader's tap advances one K-step per copy
        lambda p, s: any(cp.call_name(c) == "compute_slice" for c in cp.nodes_of_type(s, "call_expression")),
        lambda p, s, env, c: env["kt"],
        {"k_steps": "tiles"}),
    "ring": Kernel(
        "kernel", ("load_tile",), lambda p, call, env, n, c: _last_argument(p, call, env, c) // c["TILE_K"],
        lambda p, s: "smem[" in p.text(s) and s.type != "declaration",
        lambda p, s, env, c: env["kt"],
        {"k_tiles": "tiles"}),
    "pinned": Kernel(
        "kernel", ("load_tile",), lambda p, call, env, n, c: _last_argument(p, call, env, c) // c["TILE_K"],
        lambda p, s: "ring[" in p.text(s) and s.type != "declaration",
        lambda p, s, env, c: env["kt"],
        {"k_tiles": "tiles"}),
    "fmha": Kernel(  # each K and V tile copy names its first key row; a tile is read by both products
        "fmha_flash_mma", ("load_tile_async",),
        lambda p, call, env, n, c: c_value(p.text(call.child_by_field_name("arguments").named_children[2]),
                                           c | env) // c["BLOCK_N"],
        lambda p, s: any(cp.call_name(c) in ("compute_scores", "accumulate_pv")
                         for c in cp.nodes_of_type(s, "call_expression")),
        lambda p, s, env, c: env["t"],
        {"n_tiles": "tiles"}),
    "stepped": Kernel(
        "kernel", ("load_half",), lambda p, call, env, n, c: _last_argument(p, call, env, c),
        lambda p, s: any(cp.call_name(c) == "load_step" for c in cp.nodes_of_type(s, "call_expression")),
        lambda p, s, env, c: env.get("kt", -1) + 1 if c_value(
            p.text(cp.nodes_of_type(s, "call_expression")[0].child_by_field_name("arguments").named_children[-1]),
            c | env) == 0 else env["kt"],
        {"k_tiles": "tiles"}),
}


def schedule(state: KernelState, function: str, kind: Kernel, tiles: int, ring: Ring) -> Ring:
    """Run the pipeline part of `function` for `tiles` K tiles, feeding its events to `ring`: from
    the first loop that copies, through the main loop (the loop over the K tiles), to the drain
    after it (its waits and barriers). Copies are the calls of the kernel's tile loaders, so a
    source whose copies were made synchronous reads the same way."""
    parsed = cp.parse(state.source)
    roles = async_roles(parsed)
    constants = state.constants
    definition = next(f for f in cp.functions(parsed) if f.name == function).node
    body = [n for n in definition.child_by_field_name("body").named_children
            if n.type != "comment" and not cp.pragma_text(n)]
    def copier_calls(node: Node) -> list[Node]:
        return [c for c in cp.nodes_of_type(node, "call_expression") if cp.call_name(c) in kind.copiers]

    def is_main(node: Node) -> bool:
        condition = node.child_by_field_name("condition") if node.type == "for_statement" else None
        return condition is not None and bool({parsed.text(n) for n in cp.nodes_of_type(condition, "identifier")}
                                              & set(kind.bounds))

    first = next(i for i, n in enumerate(body) if n.type == "for_statement" and copier_calls(n))
    env = {name: tiles for name in kind.bounds}
    copies = [0]

    def value(node: Node) -> int | None:
        return c_value(parsed.text(node), constants | env)

    def bind(name: str, node: Node) -> None:
        found = value(node)
        if found is None:
            env.pop(name, None)
        else:
            env[name] = found

    def is_barrier(node: Node) -> bool:
        inner = node.named_children[0] if node.named_children else None
        return inner is not None and inner.type == "call_expression" and cp.call_name(inner) == "__syncthreads"

    def run(node: Node) -> None:
        if node.type == "compound_statement":
            for child in node.named_children:
                run(child)
        elif node.type == "for_statement":
            declarator = node.child_by_field_name("initializer").child_by_field_name("declarator")
            var = parsed.text(declarator.child_by_field_name("declarator"))
            assert parsed.text(node.child_by_field_name("update")).replace(var, "") in ("++", "++ "), "unit steps only"
            bind(var, declarator.child_by_field_name("value"))
            while value(node.child_by_field_name("condition")):
                run(node.child_by_field_name("body"))
                env[var] += 1
            del env[var]
        elif node.type == "if_statement" and not (copier_calls(node) or roles.of(parsed, node) & {COMMIT, WAIT}
                                                  or kind.reader(parsed, node) or "__syncthreads" in parsed.text(node)):
            return  # no event of the schedule inside (attention's masking): its condition does not matter here
        elif node.type == "if_statement":
            condition = value(node.child_by_field_name("condition"))
            assert condition is not None, parsed.text(node.child_by_field_name("condition"))
            if condition:
                run(node.child_by_field_name("consequence"))
            elif node.child_by_field_name("alternative") is not None:
                run(node.child_by_field_name("alternative"))
        elif node.type == "declaration":
            for declarator in node.children_by_field_name("declarator"):
                if declarator.type == "init_declarator":
                    bind(parsed.text(declarator.child_by_field_name("declarator")),
                         declarator.child_by_field_name("value"))
        elif node.type == "expression_statement":
            statement_roles = roles.of(parsed, node)
            for call in copier_calls(node)[:1]:
                ring.copy(kind.copy_tile(parsed, call, env, copies[0], constants))
                copies[0] += 1
            if COMMIT in statement_roles:
                ring.commit()
            if WAIT in statement_roles:
                ring.wait(value(wait_count(parsed, node, roles)))
            if is_barrier(node):
                ring.barrier()
            if kind.reader(parsed, node):
                ring.read(kind.read_tile(parsed, node, env, constants))
            inner = node.named_children[0] if node.named_children else None
            if (inner is not None and inner.type == "assignment_expression"
                    and inner.child_by_field_name("left").type == "identifier"
                    and parsed.text(inner.child_by_field_name("operator")) == "="):
                bind(parsed.text(inner.child_by_field_name("left")), inner.child_by_field_name("right"))

    main_done = False
    for node in body[first:]:
        if main_done and not (node.type == "expression_statement" and (WAIT in roles.of(parsed, node)
                                                                       or is_barrier(node))):
            break
        run(node)
        main_done = main_done or is_main(node)
    assert main_done, "no main loop over the K tiles"
    assert not ring.open, "copies left uncommitted"
    assert ring.complete_here == ring.committed, "the pipeline is not drained"
    return ring


def run_schedule(state: KernelState, function: str, kernel: str, tiles: int, stages: int,
                 synchronous: bool = False) -> Ring:
    ring = schedule(state, function, KERNELS[kernel], tiles, Ring(stages, tiles, synchronous))
    assert ring.consumed and sorted(set(ring.consumed)) == list(range(tiles)), ring.consumed
    return ring


def expert(name: str) -> KernelState:
    return kernel_entry(name).load()


def unpipelined(name: str) -> KernelState:
    state = expert(name)
    transform = get("unpipeline")
    return transform.backward(state, transform.find(state)[0]).state


def family(name: str) -> str:
    return "gemm" if name.startswith("gemm") else "conv"


# ------------------------------------------------------------------------------------------------
# Goldens
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["ring", "stepped", "pinned"])
def test_golden(case):
    check_golden("unpipeline", case)


@pytest.mark.parametrize("case", ["ring", "stepped", "pinned"])
def test_golden_kernels_compile_and_lose_the_pipeline(case, cache, unpipeline):
    before, after = golden(case, "before"), golden(case, "after")
    compiled(before, cache)
    compiled(after, cache)
    assert "multistage_pipeline" in names(before, "kernel")
    assert "multistage_pipeline" not in names(after, "kernel")
    assert {"cp_async", "cp_async_wait"} <= names(after, "cp_async_16") | names(after, "cp_async_commit") | names(
        after, "cp_async_wait")  # the copies stay asynchronous: that is sync_copies' work
    assert before.constants["STAGES"] == 3 and after.constants["STAGES"] == 1
    assert shared_bytes(after) < shared_bytes(before)


def test_golden_plan_keeps_room_for_the_epilogue(unpipeline):
    before, after = golden("ring", "before"), golden("ring", "after")
    assert before.plan.launches[0].shared == "STAGES * STAGE_BYTES"
    assert after.plan.launches[0].shared == "max(STAGES * STAGE_BYTES, PARTIAL_BYTES)"
    assert shared_bytes(before) == 1536 and shared_bytes(after) == after.constants["PARTIAL_BYTES"] == 544
    assert "static_assert(PARTIAL_BYTES" not in after.source and "static_assert(STAGES" not in after.source


def test_anchor_names_the_main_loop_and_the_ring(unpipeline):
    for case in ("ring", "stepped"):
        anchors = unpipeline.find(golden(case, "before"))
        assert anchors == [Anchor("kernel", "loop", "kt#0:STAGES")]
        assert anchors[0].snippet == "cp_async_wait<STAGES - 2>();"
        assert unpipeline.find(golden(case, "after")) == []
    rewrite = unpipeline.backward(golden("ring", "before"), Anchor("kernel", "loop", "kt#0:STAGES"))
    assert rewrite.carrier == {"STAGES": 3}
    assert rewrite.removes == ("multistage_pipeline",) and rewrite.adds == ("syncthreads",)


def test_catalog_entry_and_order(unpipeline):
    described = unpipeline.describe()
    assert described["after"] == [] and described["removes"] == ["multistage_pipeline"]
    assert not unpipeline.has_forward
    assert get("sync_copies").after == ("unpipeline",)
    with pytest.raises(NotApplicable, match="LLM must materialize"):
        unpipeline.forward(golden("ring", "after"), Anchor("kernel", "loop", "kt#0:STAGES"))


@pytest.mark.parametrize("case", ["ring", "stepped", "pinned"])
@pytest.mark.parametrize("tiles", [1, 2, 3, 7])
def test_golden_schedules_have_no_hazards(case, tiles):
    run_schedule(golden(case, "before"), "kernel", case, tiles, 3)
    run_schedule(golden(case, "after"), "kernel", case, tiles, 1)


# ------------------------------------------------------------------------------------------------
# Where the transform declines, and why
# ------------------------------------------------------------------------------------------------


def variant(case: str, old: str, new: str) -> KernelState:
    state = golden(case, "before")
    assert old in state.source, old
    return state.with_source(state.source.replace(old, new, 1))


ANCHOR = Anchor("kernel", "loop", "kt#0:STAGES")


def test_a_group_older_than_the_ring_keeps_its_wait(unpipeline):
    """The weights' group is committed before the prologue and waited for (`STAGES - 1`: only
    groups older than the ring) before the loop; with one stage that wait waits for all, and the
    loop waits at its head as in `ring`."""
    after = golden("pinned", "after").source
    assert "cp_async_wait<STAGES - 1>()" not in after and after.count("cp_async_wait<0>();") == 3
    without = variant("pinned", "    load_weights(weights_smem, w, M, row0);\n    cp_async_commit();\n", "")
    with pytest.raises(NotApplicable, match=r"unexpected wait `cp_async_wait<STAGES - 1>\(\);"):
        unpipeline.backward(without, ANCHOR)
    early = variant(
        "pinned", "cp_async_wait<STAGES - 1>();  // the weights", "cp_async_wait<STAGES - 2>();  // the weights"
    )
    with pytest.raises(NotApplicable, match="a wait for the first tile between the prologue and a main loop"):
        unpipeline.backward(early, ANCHOR)


@pytest.mark.parametrize("case, old, new, message", [
    ("ring", "cp_async_wait<STAGES - 2>();", "cp_async_wait<STAGES - 1>();", r"does not wait for STAGES - 2 groups"),
    ("ring", "cp_async_wait<STAGES - 2>();\n        __syncthreads();\n", "cp_async_wait<STAGES - 2>();\n",
     r"no __syncthreads\(\) right after"),
    ("ring", "for (int s = 0; s < STAGES - 1; ++s) {", "for (int s = 0; s < 1; ++s) {",
     r"does not run STAGES - 1 times"),
    ("ring", "        cp_async_commit();\n        const int k",
     "        cp_async_commit();\n        cp_async_commit();\n        const int k",
     r"commits 2 cp.async groups per iteration"),
    ("ring", "        const int k = kt * TILE_K + lane;\n",
     "        const int k = kt * TILE_K + lane;\n        cp_async_wait<0>();\n", r"waits 2 times"),
    ("ring", "static_assert(STAGES >= 2,", "static_assert(STAGES * STAGE_BYTES == 1536, \"three stages\");\n"
     "static_assert(STAGES >= 2,", r"`static_assert\(STAGES \* STAGE_BYTES == 1536.*` fails with one stage"),
    ("stepped", "            if (ks == 0) load_half<0>", "            load_half<0>",
     r"`load_half<0>.*` is not an `if \(ks == c\)` block of an earlier k-step"),
    ("stepped", "    cp_async_wait<STAGES - 2>();  // K tile 0 has landed ...\n"
     "    __syncthreads();              // ... for every thread\n",
     "", r"the first tile is read before the main loop, but nothing waits for it"),
    ("stepped", "            const int k = kt * TILE_K", "            const int k = fetch * 0 + kt * TILE_K",
     r"`const int fetch = kt \+ STAGES - 1;` is used outside the refill"),
])
def test_declines_with_the_reason(unpipeline, case, old, new, message):
    with pytest.raises(NotApplicable, match=message):
        unpipeline.backward(variant(case, old, new), ANCHOR)


def test_declines_a_prologue_less_loop_and_a_refill_that_cannot_move(unpipeline):
    state = golden("ring", "before")
    start = state.source.index("    // Prologue")
    end = state.source.index("    // Wait for tile kt")
    with pytest.raises(NotApplicable, match="no prologue loop"):
        unpipeline.backward(state.with_source(state.source[:start] + state.source[end:]), ANCHOR)
    moved = variant("ring",
                    "        load_tile(smem_base + refill * STAGE_BYTES, a, M, K, row0, (kt + STAGES - 1) * TILE_K);",
                    "        row0_shift += 0;\n"
                    "        load_tile(smem_base + refill * STAGE_BYTES, a, M, K, row0 + row0_shift, "
                    "(kt + STAGES - 1) * TILE_K);")
    moved = moved.with_source(moved.source.replace("    float sum = 0.0f;\n",
                                                   "    float sum = 0.0f;\n    int row0_shift = 0;\n"))
    with pytest.raises(NotApplicable, match=r"cannot move above `row0_shift \+= 0;`: both touch row0_shift"):
        unpipeline.backward(moved, ANCHOR)
    with pytest.raises(NotApplicable, match="needs a loop anchor"):
        unpipeline.backward(golden("ring", "before"), Anchor("kernel", "function", "kernel"))
    with pytest.raises(NotApplicable, match="no loop over 'kt' number 3"):
        unpipeline.backward(golden("ring", "before"), Anchor("kernel", "loop", "kt#3:STAGES"))


def test_pipeline_feature_is_a_wait_that_leaves_groups_in_flight():
    wait = "template <int N> __device__ void wait() { asm volatile(\"cp.async.wait_group %0;\" :: \"n\"(N)); }\n"
    kernel = "__global__ void k() {{ {} }}\n"
    assert "multistage_pipeline" in names(KernelState(wait + kernel.format("wait<1>();"),
                                                      golden("ring", "before").plan), "k")
    for body in ("wait<0>();", 'asm volatile("cp.async.wait_group 0;");', "__pipeline_wait_prior(0);"):
        state = KernelState("constexpr int STAGES = 1;\n" + wait + kernel.format(body), golden("ring", "before").plan)
        assert "multistage_pipeline" not in names(state, "k"), body
    two = KernelState("constexpr int STAGES = 2;\n" + wait + kernel.format("wait<STAGES - 2>();"),
                      golden("ring", "before").plan)
    assert "multistage_pipeline" in names(two, "k")  # two stages wait for all, yet one is in flight


# ------------------------------------------------------------------------------------------------
# The corpus experts
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(EXPERTS))
def test_expert_is_found_and_rewritten(name, unpipeline):
    function, _ = EXPERTS[name]
    state = expert(name)
    anchors = unpipeline.find(state)
    assert anchors == [Anchor(function, "loop", "kt#0:STAGES")]
    rewrite = unpipeline.backward(state, anchors[0])
    after = rewrite.state
    assert not cp.syntax_errors(after.source)
    assert rewrite.carrier == {"STAGES": 4} and after.constants["STAGES"] == 1
    assert "multistage_pipeline" in names(state, function)
    assert "multistage_pipeline" not in names(after, function)
    assert unpipeline.find(after) == []
    assert "STAGES - 2" not in after.source and "cp_async_wait<0>();" in after.source
    assert "static_assert(STAGES >= 2" not in after.source
    # The ring shrinks to one stage; the epilogue's staging tile, bigger than a stage, sets the size.
    assert shared_bytes(state) == 4 * after.constants["STAGE_BYTES"]
    epilogue = (after.constants["BLOCK_M"] * after.constants["EPI_STRIDE"] * 2 if family(name) == "gemm"
                else after.constants["OUT_BYTES"])
    assert shared_bytes(after) == max(after.constants["STAGE_BYTES"], epilogue) < shared_bytes(state)


def test_expert_rewrites_read_as_single_stage_loops(unpipeline):
    conv = unpipelined("conv2d/implicit_gemm").source
    loop = conv[conv.index("for (int kt = 0; kt < k_steps; ++kt) {"):]
    loop = loop[:loop.index("\n    }\n")]
    order = ["const int refill", "load_stage(a_stage(refill)", "cp_async_commit();", "cp_async_wait<0>();",
             "__syncthreads();", "compute_slice(acc, a_stage(s), b_stage(s), 0,", "advance_tap", "slice < K_SLICES",
             BARRIER_NOTE]
    assert [loop.index(piece) for piece in order] == sorted(loop.index(piece) for piece in order)
    assert "// Prologue" not in conv and "for (int s = 0; s < STAGES - 1; ++s)" not in conv
    gemm = unpipelined("gemm/mma_sync").source
    assert "for (int s = 0; s < 1; ++s) {" in gemm
    last_step = gemm[gemm.index("if (ks == K_STEPS - 1) {"):gemm.index("// Fragments of the next k-step")]
    order = [BARRIER_NOTE, "const int fetch = kt + 1;", "load_a_tile_async(ld, write_base, fetch);",
             "load_b_tile_async<1>(ld, write_base + A_STAGE_BYTES, fetch);", "cp_async_commit();",
             "cp_async_wait<0>();", "__syncthreads();\n                read_stage"]
    assert [last_step.index(piece) for piece in order] == sorted(last_step.index(piece) for piece in order)
    assert "if (ks == 0)" not in gemm and "if (ks == 2)" not in gemm


@pytest.mark.parametrize("name", ["gemm/mma_sync", "conv2d/implicit_gemm"])
def test_expert_plan_resolves_for_every_supported_case(name):
    problem = load_problem(corpus.problem_path(family(name).replace("conv", "conv2d")))
    state, after = expert(name), unpipelined(name)
    cases = [c for c in problem.info.cases if state.plan.supports_case(c.params)]
    assert cases
    for case in cases:
        inputs = problem.make_inputs(dict(case.params), 0, "cpu")
        buffers = set(inputs) | {o.name for o in problem.info.outputs}
        (old,) = resolve(state.plan, {**case.params, **state.constants, **H200.facts()}, buffers)
        (new,) = resolve(after.plan, {**case.params, **after.constants, **H200.facts()}, buffers)
        assert new.shared == shared_bytes(after) < old.shared
        assert (new.grid, new.block, new.args) == (old.grid, old.block, old.args)


@pytest.mark.parametrize("name", list(EXPERTS))
def test_expert_rewrite_compiles_without_spills(name, cache):
    function, entry = EXPERTS[name]
    before, after = compiled(expert(name), cache), compiled(unpipelined(name), cache)
    sass_before, sass_after = sass_features(before.cubin_bytes()), sass_features(after.cubin_bytes())
    # Every copy is still a cp.async (LDGSTS), but the unrolled prologue of STAGES - 1 tiles is gone:
    # the GEMM keeps the copies of one tile before the loop and one in it, the convolution only the
    # one at the head of its loop.
    c = expert(name).constants
    per_tile = c["A_LOADS"] + c["B_LOADS"] if family(name) == "gemm" else c["A_PASSES"] + c["B_PASSES"]
    assert sass_before.count("ldgsts", entry) == (c["STAGES"] - 1 + 1) * per_tile
    assert sass_after.count("ldgsts", entry) == (2 if family(name) == "gemm" else 1) * per_tile
    assert sass_after.count("bar_sync", entry) > sass_before.count("bar_sync", entry)  # the added barrier
    assert sass_after.count("ldl", entry) == sass_after.count("stl", entry) == 0
    assert sass_after.count("hmma", entry) == sass_before.count("hmma", entry)


@pytest.mark.parametrize("name", ["gemm/mma_sync", "conv2d/implicit_gemm"])
@pytest.mark.parametrize("tiles", [1, 2, 3, 5, 9])
def test_expert_schedules_before_and_after(name, tiles):
    function, _ = EXPERTS[name]
    run_schedule(expert(name), function, family(name), tiles, 4)
    run_schedule(unpipelined(name), function, family(name), tiles, 1)


@pytest.mark.parametrize("name", ["gemm/mma_sync", "conv2d/implicit_gemm"])
def test_model_rejects_the_shortcuts(name):
    """The model is not blind: the rewrite without its added barrier, and the expert with only
    STAGES = 1 and the wait clamped to 0, both read or overwrite a stage at the wrong time."""
    function, _ = EXPERTS[name]
    after = unpipelined(name)
    assert after.source.count(BARRIER_NOTE) == 1
    no_barrier = after.with_source(after.source.replace(BARRIER_NOTE, ";"))
    with pytest.raises(Hazard):
        run_schedule(no_barrier, function, family(name), 3, 1)
    original = expert(name)
    shortcut = original.with_source(original.source.replace("constexpr int STAGES = 4;", "constexpr int STAGES = 1;")
                                    .replace("cp_async_wait<STAGES - 2>()", "cp_async_wait<0>()"))
    with pytest.raises(Hazard):
        run_schedule(shortcut, function, family(name), 3, 1)
    with pytest.raises(Hazard, match="before its copy is complete"):  # waiting for one group too few
        run_schedule(original.with_source(original.source.replace("cp_async_wait<STAGES - 2>()",
                                                                  "cp_async_wait<STAGES - 1>()")),
                     function, family(name), 5, 4)


# ------------------------------------------------------------------------------------------------
# Attention: the query tile's group comes before the ring's
# ------------------------------------------------------------------------------------------------

FMHA = "fmha/flash_mma"


def test_attention_loses_its_ring_and_keeps_the_query_wait(unpipeline, cache):
    state = expert(FMHA)
    [anchor] = unpipeline.find(state)
    assert anchor == Anchor("fmha_flash_mma", "loop", "t#0:STAGES")
    after = unpipeline.backward(state, anchor).state
    assert after.constants["STAGES"] == 1 and "cp_async_wait<STAGES" not in after.source
    head = after.source[after.source.index("load_tile_async<Q_LOADS>"):after.source.index("uint32_t qf[")]
    assert head.index("cp_async_commit();") < head.index("cp_async_wait<0>();") < head.index("__syncthreads();")
    assert "for (int st = 0; st < STAGES - 1; ++st)" not in after.source
    assert "multistage_pipeline" in names(state, "fmha_flash_mma")
    assert "multistage_pipeline" not in names(after, "fmha_flash_mma")
    assert shared_bytes(state) - shared_bytes(after) == state.constants["STAGE_BYTES"]
    entry = "fmha_flash_mma"
    sass_before = sass_features(compiled(state, cache).cubin_bytes())
    sass_after = sass_features(compiled(after, cache).cubin_bytes())
    per_tile = 2 * state.constants["KV_LOADS"]  # K and V
    assert sass_after.count("ldgsts", entry) == sass_before.count("ldgsts", entry) - per_tile
    assert sass_after.count("hmma", entry) == sass_before.count("hmma", entry)


@pytest.mark.parametrize("tiles", [1, 2, 3, 6])
def test_attention_schedules_before_and_after(tiles, unpipeline):
    state = expert(FMHA)
    run_schedule(state, "fmha_flash_mma", "fmha", tiles, 2)
    after = unpipeline.backward(state, unpipeline.find(state)[0]).state
    run_schedule(after, "fmha_flash_mma", "fmha", tiles, 1)
    with pytest.raises(Hazard):  # the barrier the rewrite adds is what keeps the refill from a stage in use
        run_schedule(after.with_source(after.source.replace(BARRIER_NOTE, ";")), "fmha_flash_mma", "fmha", tiles + 1, 1)
