"""A kernel template read as the instance its plan launches (klineage/specialize.py): the written instance is the
plain kernel token for token, the compiler builds the same machine code from either text, the forwards find on
the template every site they find on the plain kernel, and a template whose instance is not certain stays as
written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.features.sass import disassemble
from klineage.gate.compile import compile_kernel
from klineage.kernel import KernelState, load_kernel
from klineage.launch import LaunchPlan
from klineage.optimize import loop, strategies
from klineage.optimize.strategies import RewriterKind, Strategy
from klineage.specialize import specialized
from klineage.transforms import catalog, get

ARGS = '"x", "y", { scalar = "n", type = "i32" }'
PLAIN = """__global__ void softplus(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = v > 20.0f ? v : log1pf(expf(v));
    }
}
"""
GENERIC = "template <typename scalar_t>\n" + PLAIN.replace("float", "scalar_t")
# the compiler builds an instance only where the file asks for it
INSTANCE = "template __global__ void softplus<float>(const float* __restrict__, float* __restrict__, int);\n"
TEMPLATE = GENERIC + "\n" + INSTANCE


def _state(source: str, *entries: str, block: int = 256) -> KernelState:
    launches = "".join(f'[[launch]]\nentry = "{entry}"\ngrid = ["cdiv(n, {block})"]\nblock = [{block}]\n'
                       f"args = [{ARGS}]\n" for entry in entries)
    return KernelState(source=source, plan=LaunchPlan.from_toml(f'name = "t"\nproblem = "t"\n{launches}'))


def test_a_template_is_written_as_its_launched_instance():
    written = specialized(_state(TEMPLATE, "softplus<float>"))
    assert written.state.source == PLAIN + "\n"
    assert [launch.entry for launch in written.state.plan.launches] == ["softplus"]
    assert written.instances == ("softplus<float>",)
    assert written.note == "on the instance softplus<float> written out as a plain kernel"


def test_value_parameters_take_their_arguments_or_defaults_and_an_expression_keeps_its_value():
    source = """template <typename T, int BLOCK, int ITEMS = 4>
__global__ void __launch_bounds__(BLOCK) scale(const T* x, T* y, int n) {
    __shared__ T tile[BLOCK * ITEMS];
    int i = blockIdx.x * (BLOCK / 2) + threadIdx.x;
    if (i < n) y[i] = static_cast<T>(sizeof(T)) * x[i] + T(ITEMS);
}
"""
    written = specialized(_state(source, "scale< float , 2 * 128 >"))
    assert written.state.source == """\
__global__ void __launch_bounds__((2 * 128)) scale(const float* x, float* y, int n) {
    __shared__ float tile[(2 * 128) * 4];
    int i = blockIdx.x * ((2 * 128) / 2) + threadIdx.x;
    if (i < n) y[i] = static_cast<float>(sizeof(float)) * x[i] + float(4);
}
"""
    assert written.state.plan.launches[0].entry == "scale"


def test_an_instance_of_every_default_is_written_with_them():
    source = ("template <typename T = float, int B = 256>\n__global__ void scale(const T* x, T* y, int n) {\n"
              "    int i = blockIdx.x * B + threadIdx.x;\n    if (i < n) y[i] = x[i] * T(2);\n}\n\n"
              "template __global__ void scale<>(const float*, float*, int);\n")
    written = specialized(_state(source, "scale<>"))
    assert written.state.source == ("__global__ void scale(const float* x, float* y, int n) {\n"
                                    "    int i = blockIdx.x * 256 + threadIdx.x;\n"
                                    "    if (i < n) y[i] = x[i] * float(2);\n}\n\n")
    assert written.instances == ("scale<>",)


@pytest.mark.parametrize("entry", ["softplus<float>", "softplus< float >",
                                   "void softplus<float>(const float*, float*, int)"])
def test_an_instance_is_read_however_the_plan_names_it(entry):
    """A plan names an instance as the gate resolves it (`klineage.entries`): by its arguments or its signature."""
    written = specialized(_state(TEMPLATE, entry))
    assert written.state.source == PLAIN + "\n" and written.instances == (entry,)


UNCERTAIN = {
    "two instances launched": (TEMPLATE, ("softplus<float>", "softplus<double>")),
    "another instance instantiated": (TEMPLATE + INSTANCE.replace("float", "double"), ("softplus<float>",)),
    "an instance the compiler deduces": (GENERIC + INSTANCE.replace("softplus<float>", "softplus"),
                                         ("softplus<float>",)),
    "called from the host": (TEMPLATE + "void run(const float* x, float* y, int n) { softplus<<<1, 1>>>(x, y, n); }\n",
                             ("softplus<float>",)),
    "declared before": ("template <typename scalar_t>\n__global__ void softplus(const scalar_t*, scalar_t*, int);\n"
                        + TEMPLATE, ("softplus<float>",)),
    "a type of two words": (TEMPLATE, ("softplus<unsigned int>",)),
    "no arguments named": (TEMPLATE, ("softplus",)),
    "a mangled symbol": (TEMPLATE, ("_Z8softplusIfEvPKT_PS0_i",)),
    "a parameter with no default named by `<>`": (TEMPLATE, ("softplus<>",)),
    "a parameter without a value": (TEMPLATE.replace("typename scalar_t", "typename scalar_t, int B"),
                                    ("softplus<float>",)),
    "a parameter pack": (TEMPLATE.replace("typename scalar_t", "typename scalar_t, typename... R"),
                         ("softplus<float>",)),
    "a value that would bring a statement": (TEMPLATE.replace("typename scalar_t", "typename scalar_t, int B = 1"),
                                             ("softplus<float, 1); y[0] = 0; (1>",)),
    "a value with unbalanced parentheses": (TEMPLATE.replace("typename scalar_t", "typename scalar_t, int B = 1"),
                                            ("softplus<float, 1) + (2>",)),
    "a parameter used as a scope": (TEMPLATE.replace("int i =", "typename scalar_t::index i ="),
                                    ("softplus<float>",)),
}


@pytest.mark.parametrize("why", sorted(UNCERTAIN))
def test_a_template_whose_instance_is_not_certain_stays_as_written(why):
    source, entries = UNCERTAIN[why]
    state = _state(source, *entries)
    written = specialized(state)
    assert written.state is state and written.instances == ()


def test_the_compiler_builds_the_same_machine_code_from_either_text(tmp_path):
    def code(state: KernelState) -> tuple[list[list[str]], list[dict]]:
        result = compile_kernel(state, tmp_path)
        assert result.ok, result.log[-2000:]
        sass = disassemble(result.cubin_bytes(state.plan.arch))
        return sorted(sass.values()), sorted(r.to_dict() for r in result.resources[state.plan.arch].values())

    template = _state(TEMPLATE, "softplus<float>")
    assert code(specialized(template).state) == code(template)


def test_the_planner_reads_a_template_as_its_instance_and_says_so():
    plan = strategies.planner(Strategy.UNCONDITIONED_GREEDY, RewriterKind.RULES, cards=(), problem=None,
                              statuses=(), transforms=list(catalog().values()), seed=0)
    found = {c.transform: c for c in plan(_state(TEMPLATE, "softplus<float>")) if c.rewrite is not None}
    plain = {c.transform: c for c in plan(_state(PLAIN + "\n", "softplus")) if c.rewrite is not None}
    assert sorted(found) == sorted(plain) and "scalarize_elementwise" in found
    for name, candidate in found.items():
        assert candidate.state == plain[name].state, name
        assert candidate.instance == "on the instance softplus<float> written out as a plain kernel"


def test_a_step_on_the_instance_rules_out_its_rivals_on_the_template():
    plan = strategies.planner(Strategy.UNCONDITIONED_GREEDY, RewriterKind.RULES, cards=(), problem=None,
                              statuses=(), transforms=list(catalog().values()), seed=0)
    template = _state(TEMPLATE, "softplus<float>")
    transform = get("scalarize_elementwise")
    instance = specialized(template).state
    child = transform.forward(instance, transform.forward_sites(instance)[0]).state
    on_template = [c.transform for c in loop.ruled_out(plan(template), template, child, transform.name, set())]
    on_plain = [c.transform for c in loop.ruled_out(plan(instance), instance, child, transform.name, set())]
    assert on_template == on_plain


def test_a_template_operators_recorded_h200_run_replays_with_its_instance_named(tmp_path):
    """hardswish (bench/transfer), a template launched as `hardswish_kernel<float>`, optimized on an H200 in session 59
    with these settings: replayed from its recorded verdicts, the run takes the same step at the same ratio, and the
    attempt says which instance its kernel was written from."""
    from klineage.optimize import optimize

    operator = Path(__file__).resolve().parents[1] / "bench" / "transfer" / "hardswish"
    part = json.loads((operator.parents[1] / "results" / "transfer-parts" / "gpu-s59-h200" / "hardswish.json")
                      .read_text())["runs"]["hardswish"]["library_then_catalog"]
    result = optimize(operator / "problem.py", load_kernel(operator / "naive"), strategy="library_then_catalog",
                      library=Path(__file__).resolve().parents[1] / "corpus" / "library" / "library.json",
                      budget=8, gate_mode="replay", rivals=3, ordering="measured")
    assert [s.transform for s in result.steps] == part["steps"]
    assert result.speedup == pytest.approx(part["speedup"])
    taken = result.attempts[result.steps[0].attempt]
    assert taken.message.endswith("on the instance hardswish_kernel<float> written out as a plain kernel")



def test_a_cards_fit_reads_a_template_as_its_instance():
    """`klineage library fit` and the dashboard's fit (`retrieval.assess`) see the sites the optimizer sees."""
    from klineage.skills.library import load_library, problem_infos
    from klineage.skills.retrieval import assess

    cards = load_library(Path(__file__).resolve().parents[1] / "corpus" / "library" / "library.json").cards
    problem = problem_infos({"row_softmax"})["row_softmax"]

    def fits(state: KernelState) -> list[tuple[str, str, int]]:
        return [(a.card.id, a.fit.value, a.sites) for a in assess(state, problem, cards)]

    on_template = fits(_state(TEMPLATE, "softplus<float>"))
    assert on_template == fits(_state(PLAIN + "\n", "softplus"))
    assert any(sites for _, fit, sites in on_template if fit == "proposed")
