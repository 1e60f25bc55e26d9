"""C's spellings of locals and loops read as the C++ ones the forwards know (klineage/transforms/_c_style.py): a
local declared where it is first set, a counted `while` loop and a loop over an index declared earlier as the `for`
loop that declares its index; every spelling that could run otherwise is left as written. The rewritten row
kernels compute the naive bits on the CPU, and the row forwards find the site they find on the `for` spelling."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.transforms import get
from klineage.transforms._c_style import c_style, joined_guards, subscripted
from tests.transforms import emulate
from tests.transforms.golden import plan_of

PLAN = plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }', grid="cdiv(rows, 128)",
               block=128)
HEAD = "__global__ void kernel(const float* x, float* y, int rows, int cols) {\n" \
       "    int r = blockIdx.x * blockDim.x + threadIdx.x;\n    if (r >= rows) return;\n"


def _kernel(body: str) -> KernelState:
    return KernelState(source=HEAD + body + "}\n", plan=PLAN)


def _body(state: KernelState) -> str:
    return state.source.removeprefix(HEAD).removesuffix("}\n")


# a row's mean subtracted from it: three passes over the row, each in a C spelling, and the `for` spelling
FOR_FORM = ("    float sum = 0.0f;\n    for (int j = 0; j < cols; ++j) { sum += x[r * cols + j]; }\n"
            "    float mean = sum / cols;\n"
            "    for (int j = 0; j < cols; j++) { y[r * cols + j] = x[r * cols + j] - mean; }\n")
SPELLINGS = {
    "while loops": ("    float sum = 0.0f;\n    int j = 0;\n    while (j < cols) { sum += x[r * cols + j]; ++j; }\n"
                    "    float mean = sum / cols;\n    j = 0;\n"
                    "    while (j < cols) { y[r * cols + j] = x[r * cols + j] - mean; j++; }\n"),
    "an index declared first": ("    float sum = 0.0f;\n    int j;\n"
                                "    for (j = 0; j < cols; ++j) { sum += x[r * cols + j]; }\n"
                                "    float mean = sum / cols;\n"
                                "    for (j = 0; j < cols; j++) { y[r * cols + j] = x[r * cols + j] - mean; }\n"),
    "locals declared first": ("    float sum, mean;\n    int j;\n    sum = 0.0f;\n"
                              "    for (j = 0; j < cols; ++j) { sum += x[r * cols + j]; }\n    mean = sum / cols;\n"
                              "    for (j = 0; j < cols; j++) { y[r * cols + j] = x[r * cols + j] - mean; }\n"),
}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_c_spellings_read_as_the_for_spelling(spelling):
    assert _body(c_style(_kernel(SPELLINGS[spelling]))) == FOR_FORM


def test_the_for_spelling_is_the_same_state():
    state = _kernel(FOR_FORM)
    assert c_style(state) is state


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_the_row_forwards_find_the_for_spellings_site(spelling):
    """serialize_reduction shares the row among a warp's lanes on every spelling, writing the `for` spelling's
    kernel."""
    transform = get("serialize_reduction")
    plain, spelled = _kernel(FOR_FORM), _kernel(SPELLINGS[spelling])
    (site,) = transform.forward_sites(plain)
    assert transform.forward_sites(spelled) == [site]
    assert transform.forward(spelled, site).state == transform.forward(plain, site).state


def test_the_rewritten_rows_are_the_naive_bits_on_the_cpu(tmp_path):
    """Each C spelling and its rewrite subtract the same means, bit for bit, over rows shorter and longer than a
    block and a ragged last block; a `for` loop that started its second pass at 1 would be caught."""
    forms = {name: _kernel(body) for name, body in SPELLINGS.items()}
    forms |= {f"{name} rewritten": c_style(state) for name, state in forms.items()}
    forms["from one"] = _kernel(FOR_FORM.replace("for (int j = 0; j < cols; j++)", "for (int j = 1; j < cols; j++)"))

    def inputs(rows, cols):
        x = torch.randn(rows * cols, generator=torch.Generator().manual_seed(cols))
        return {"rows": rows, "cols": cols}, {"x": x}, {"y": (torch.float32, rows * cols)}

    found = emulate.differences(tmp_path, _kernel(FOR_FORM), forms, ((3, 5), (130, 40)), inputs)
    assert found and all(line.startswith("from one") for line in found), found


@pytest.mark.parametrize("body", [
    # a `while` loop that can skip its step, writes its index in its work, or steps with more than its index
    "    int j = 0;\n    while (j < cols) { if (x[j] < 0) { ++j; continue; } y[j] = x[j]; ++j; }\n",
    "    int j = 0;\n    while (j < cols) { y[j] = x[j]; j += (x[j] > 0) ? 1 : 2; j++; }\n",
    "    int j = 0;\n    while (j < cols) { y[j] = x[j]; j += 1; y[0] = 0.0f; }\n",
    # the index read after its loop: the last value would be lost
    "    int j = 0;\n    while (j < cols) { y[j] = x[j]; ++j; }\n    y[0] = (float)j;\n",
    "    int j;\n    for (j = 0; j < cols; ++j) if (x[j] < 0) break;\n    y[0] = (float)j;\n",
    # a start that calls a function, with a statement between it and its loop
    "    int j = (int)lroundf(x[0]);\n    y[1] = 0.0f;\n    while (j < cols) { y[j] = x[j]; ++j; }\n",
    # a loop that does not set its index: it continues from the value before
    "    int j = 0;\n    for (; j < cols; ++j) y[j] = x[j];\n    for (; j < 2 * cols; ++j) y[j] = 0.0f;\n",
    # two locals of the name, a static one, and a local read before it is set
    "    int j = 0;\n    while (j < cols) { y[j] = x[j]; ++j; }\n    { int j = 3; y[j] = 0.0f; }\n",
    "    static float s;\n    s = 1.0f;\n    y[0] = s;\n",
    "    float s;\n    y[0] = s;\n    s = 1.0f;\n    y[1] = s;\n",
])
def test_spellings_that_could_run_otherwise_are_left_as_written(body):
    state = _kernel(body)
    assert c_style(state) is state


ARGMAX = ("    float best = x[r * cols];\n    int at = 0;\n    for (int j = 1; j < cols; ++j)\n"
          "        if (x[r * cols + j] > best) {}\n    y[r] = best + at;\n")


def test_comma_joined_statements_run_one_by_one_and_the_arg_reduction_is_found(tmp_path):
    """`best = v, at = j;` as a branch's whole body is the braced pair of statements (the comma runs them in order);
    serialize_reduction then finds the arg reduction it finds on the braced spelling, and the emulated rows agree."""
    joined = _kernel(ARGMAX.replace("{}", "best = x[r * cols + j], at = j;"))
    braced = _kernel(ARGMAX.replace("{}", "{ best = x[r * cols + j]; at = j; }"))
    assert c_style(joined) == braced
    transform = get("serialize_reduction")
    (site,) = transform.forward_sites(braced)
    assert transform.forward(joined, site).state == transform.forward(braced, site).state

    def inputs(rows, cols):
        x = torch.randn(rows * cols, generator=torch.Generator().manual_seed(cols))
        return {"rows": rows, "cols": cols}, {"x": x}, {"y": (torch.float32, rows * cols)}

    assert emulate.differences(tmp_path, joined, {"braced": braced}, ((3, 5), (130, 40)), inputs) == []


def test_a_comma_inside_an_expression_or_a_loop_header_stays():
    state = _kernel("    int a = 0, b = 1;\n    for (int j = 0, k = 1; j < cols; ++j, ++k) y[j] = (a, b) + k;\n")
    assert c_style(state) is state


GUARDED = ("__global__ void kernel(const float* x, float* y, int rows, int cols) {\n"
           "    int r;\n    float sum, d;\n    r = blockIdx.x * blockDim.x + threadIdx.x;\n    if (r < rows) {\n"
           "        sum = 0.0f;\n        for (int j = 0; j < cols; ++j) {\n            d = x[r * cols + j];\n"
           "            sum += d * d;\n        }\n        y[r] = sum;\n    }\n}\n")
GUARDED_CXX = ("__global__ void kernel(const float* x, float* y, int rows, int cols) {\n"
               "    int r = blockIdx.x * blockDim.x + threadIdx.x;\n    if (r < rows) {\n"
               "        float sum = 0.0f;\n        for (int j = 0; j < cols; ++j) {\n"
               "            float d = x[r * cols + j];\n            sum += d * d;\n        }\n        y[r] = sum;\n"
               "    }\n}\n")


def test_a_local_is_declared_in_the_inner_block_that_sets_it_and_holds_its_uses(tmp_path):
    """C's top-of-kernel declarations: the index set at the top, the sum in the guard's body, the element in the
    loop's body (set first on every iteration): each declared where set, and the row forwards find the site; the
    emulated sums agree."""
    c_kernel = KernelState(source=GUARDED, plan=PLAN)
    assert c_style(c_kernel).source == GUARDED_CXX
    assert [a.key for a in get("serialize_reduction").forward_sites(c_kernel)] == ["r"]

    def inputs(rows, cols):
        x = torch.randn(rows * cols, generator=torch.Generator().manual_seed(cols))
        return {"rows": rows, "cols": cols}, {"x": x}, {"y": (torch.float32, rows)}

    assert emulate.differences(tmp_path, c_kernel, {"c++": c_style(c_kernel)}, ((3, 5), (130, 40)), inputs) == []


@pytest.mark.parametrize("body", [
    # read after the block that sets it: the value must outlive the block
    "    float d;\n    if (rows > 1) {\n        d = x[0];\n        y[1] = d;\n    }\n    y[0] = d;\n",
    # set in a branch, read in the loop that follows it in the outer block
    "    float d;\n    for (int j = 0; j < cols; ++j) {\n        if (j == 0) { d = x[j]; }\n        y[j] = d;\n    }\n",
])
def test_a_local_whose_uses_leave_the_block_that_sets_it_stays_declared_where_it_was(body):
    state = _kernel(body)
    assert c_style(state) is state


NESTED = ("    if (rows > 0) {\n        if (cols > 1) {\n            float s = 0.0f;\n"
          "            for (int j = 0; j < cols; j += 1) s = s + x[r * cols + j];\n            y[r] = s;\n"
          "        }\n    }\n")
JOINED = ("    if (rows > 0 && cols > 1) {\n            float s = 0.0f;\n"
          "            for (int j = 0; j < cols; ++j) s += x[r * cols + j];\n            y[r] = s;\n        }\n")


def test_nested_guards_join_and_updates_take_their_short_forms(tmp_path):
    """A guard whose whole body is a guard is the two conditions joined by `&&` (`joined_guards`, which c_style
    leaves to the forwards that read bounds alone); a loop's `j += 1` is `++j` and
    `s = s + e` is `s += e` (IEEE addition commutes: `s = e + s` too). The emulated sums agree with the nested
    spelling's, and a sum whose addends were regrouped (`s = s + a + b` is not `s += a + b`) stays as written."""
    nested = _kernel(NESTED)
    assert _body(c_style(joined_guards(nested))) == JOINED
    assert _body(c_style(joined_guards(_kernel(NESTED.replace("s + x[r * cols + j]", "x[r * cols + j] + s"))))) == \
        JOINED
    assert "if (rows > 0) {\n        if (cols > 1) {" in c_style(nested).source  # c_style alone keeps inner guards
    regrouped = _kernel("    float s = 0.0f;\n    for (int j = 0; j < cols; ++j) s = s + x[j] + x[j + 1];\n"
                        "    y[r] = s;\n")
    assert c_style(regrouped) is regrouped

    def inputs(rows, cols):
        x = torch.randn(rows * cols, generator=torch.Generator().manual_seed(cols))
        return {"rows": rows, "cols": cols}, {"x": x}, {"y": (torch.float32, rows)}

    joined = c_style(joined_guards(nested))
    assert emulate.differences(tmp_path, nested, {"joined": joined}, ((3, 5), (130, 40)), inputs) == []


@pytest.mark.parametrize("body", [
    # an `else` on either guard, or more than the inner guard in the outer one's body
    "    if (rows > 0) { if (cols > 1) y[r] = 1.0f; } else y[r] = 0.0f;\n",
    "    if (rows > 0) { if (cols > 1) y[r] = 1.0f; else y[r] = 0.0f; }\n",
    "    if (rows > 0) { y[0] = 2.0f; if (cols > 1) y[r] = 1.0f; }\n",
    # a step of two, an element's update (not a name), and an update that is a subexpression
    "    for (int j = 0; j < cols; j += 2) y[j] = x[j];\n",
    # a bound at most n - 1 of an unsigned index, or of a count the kernel changes, or of an unsigned local
    "    for (unsigned j = 0; j <= cols - 1; ++j) y[j] = x[j];\n",
    "    cols *= 2;\n    for (int j = 0; j <= cols - 1; ++j) y[j] = x[j];\n",
    "    unsigned n = cols;\n    for (int j = 0; j <= n - 1; ++j) y[j] = x[j];\n",
    "    int n = cols;\n    n += 1;\n    for (int j = 0; j <= n; ++j) y[j] = x[j];\n",
    "    for (int j = 0; j < cols; ++j) y[r] = y[r] + x[j];\n",
    "    float s = 0.0f;\n    for (int j = 0; j < cols; ++j) y[j] = (s = s + x[j]);\n",
])
def test_guards_and_updates_that_say_more_stay_as_written(body):
    state = _kernel(body)
    assert c_style(joined_guards(state)) is state


@pytest.mark.parametrize("bound", ["cols", "64"])
def test_a_signed_index_at_most_a_signed_count_less_one_is_below_the_count(bound):
    """`j <= n - 1` is `j < n` where both are signed (n - 1 cannot wrap); the row forwards then read the loop."""
    state = _kernel(f"    float s = 0.0f;\n    for (int j = 0; j <= {bound} - 1; ++j) s += x[r * cols + j];\n"
                    "    y[r] = s;\n")
    assert f"for (int j = 0; j < {bound}; ++j)" in c_style(state).source
    (site,) = get("serialize_reduction").forward_sites(state)
    assert site.key == "r"


@pytest.mark.parametrize("bound, below", [("r", "r + 1"), ("99", "100"), ("cols", "cols + 1")])
def test_a_signed_index_at_most_a_signed_name_is_below_it_plus_one(bound, below):
    """`j <= i` is `j < i + 1` where both are signed (i + 1 cannot wrap): a causal row's loop over the columns up to
    its own, which the row forwards then read."""
    state = _kernel(f"    float s = 0.0f;\n    for (int j = 0; j <= {bound}; ++j) s += x[r * cols + j];\n"
                    "    y[r] = s;\n")
    assert f"for (int j = 0; j < {below}; ++j)" in c_style(state).source
    (site,) = get("serialize_reduction").forward_sites(state)
    assert site.key == "r"


def test_the_causal_rows_sums_are_the_naive_bits_on_the_cpu(tmp_path):
    """Each row sums its columns up to its own index (integers: exact in any order), a warp a row."""
    state = _kernel("    float s = 0.0f;\n    for (int j = 0; j <= r; ++j) s += x[r * cols + j];\n    y[r] = s;\n")
    transform = get("serialize_reduction")
    shared = transform.forward(state, transform.forward_sites(state)[0]).state

    def inputs(rows, cols):
        x = torch.randint(-9, 10, (rows * cols,), generator=torch.Generator().manual_seed(cols)).float()
        return {"rows": rows, "cols": cols}, {"x": x}, {"y": (torch.float32, rows)}

    assert emulate.differences(tmp_path, state, {"shared": shared}, ((40, 40), (70, 70)), inputs) == []


def test_an_elements_address_and_a_dereferenced_offset_read_as_subscripts():
    state = _kernel("    float* out = &y[r * cols];\n    const float* in = &x[(r * cols)];\n"
                    "    for (int j = 0; j < cols; ++j) *(out + j) = *(j + in) * 2.0f;\n")
    assert _body(subscripted(state)) == ("    float* out = y + r * cols;\n    const float* in = x + (r * cols);\n"
                                         "    for (int j = 0; j < cols; ++j) out[j] = in[j] * 2.0f;\n")


@pytest.mark.parametrize("body", [
    "    atomicAdd(&y[r], x[r]);\n",  # an address passed, not a pointer declared
    "    float* out = y;\n    *out = x[r];\n",  # a dereference without an offset
    "    int k = 2;\n    y[r] = x[k + r];\n",  # already subscripted
    "    float v = 2.0f;\n    y[r] = (v + 1.0f) * x[r];\n",  # no pointer
])
def test_other_addresses_and_dereferences_stay_as_written(body):
    state = _kernel(body)
    assert subscripted(state) is state


def test_the_pointer_spellings_forwards_give_the_naive_bits_on_the_cpu(tmp_path):
    """A row kernel through `&y[r * cols]` and `*(x + ...)`, a warp a row by serialize_reduction: the same rows."""
    state = _kernel("    const float* in = &x[r * cols];\n    float s = 0.0f;\n"
                    "    for (int j = 0; j < cols; ++j) s += *(in + j);\n    float* out = &y[r * cols];\n"
                    "    for (int j = 0; j < cols; ++j) *(out + j) = *(in + j) - s;\n")
    transform = get("serialize_reduction")
    (site,) = transform.forward_sites(state)
    shared = transform.forward(state, site).state

    def inputs(rows, cols):
        x = torch.randint(-9, 10, (rows * cols,), generator=torch.Generator().manual_seed(cols)).float()
        return {"rows": rows, "cols": cols}, {"x": x}, {"y": (torch.float32, rows * cols)}

    assert emulate.differences(tmp_path, state, {"shared": shared}, ((3, 5), (130, 40)), inputs) == []


@pytest.mark.parametrize("spelled", ["((y) + (r) * cols)", "(y + r * cols)", "(y) + r * cols"])
def test_a_row_pointer_in_a_macros_parentheses_is_the_pointer_plus_its_offset(spelled):
    """`((y) + (r) * cols)` (a row-pointer macro's expansion, which the grammar may read as a cast of `+(r)`) is
    the pointer y plus the offset; the row forwards then read the row through it."""
    state = _kernel(f"    float* out = {spelled};\n    float s = 0.0f;\n"
                    "    for (int j = 0; j < cols; ++j) s += x[r * cols + j];\n"
                    "    for (int j = 0; j < cols; ++j) out[j] = x[r * cols + j] - s;\n")
    read = _body(subscripted(state))
    assert read.startswith("    float* out = y + ") and "(y)" not in read.split("\n")[0], read
    assert [site.key for site in get("serialize_reduction").forward_sites(state)] == ["r"]
