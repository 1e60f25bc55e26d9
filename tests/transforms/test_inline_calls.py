"""A kernel's calls of its own `__device__` helpers written out where they stood (klineage/transforms/_inline_calls.py):
a reduction helper, a void helper with reference out-parameters, value helpers inside an expression (hoisted just
before their statement) and a helper reading its element, each as the text it becomes; every call that could run
otherwise is left as written. The written-out kernels compute the helpers' bits on the CPU, and the row forwards
find on a helper's spelling of a naive kernel the site they find on the kernel written without it."""

from __future__ import annotations

import re

import pytest
import torch

from klineage.kernel import KernelState
from klineage.transforms import get
from klineage.transforms._inline_calls import inlined_calls
from tests.transforms import emulate
from tests.transforms.golden import compiles_without_spills, plan_of

ROWS = plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }',
               grid="cdiv(rows, 128)", block=128)
FLAT = plan_of('"x", "y", { scalar = "n", type = "i32" }')
ROW_HEAD = "__global__ void kernel(const float* x, float* y, int rows, int cols) {\n" \
           "    int r = blockIdx.x * blockDim.x + threadIdx.x;\n"


def _state(source: str, plan=ROWS) -> KernelState:
    return KernelState(source=source, plan=plan)


def _kernel_text(state: KernelState) -> str:
    """The source from the kernel on: the helpers' definitions before it stay as written."""
    return state.source[state.source.index("__global__"):]


DOT = """__device__ float dot(const float* __restrict__ u, const float* __restrict__ w, int k) {
    float s = 0.0f;
    for (int j = 0; j < k; ++j) s += u[j] * w[j];
    return s;
}
""" + ROW_HEAD + "    if (r < rows) y[r] = dot(x + (long long)r * cols, x, cols);\n}\n"
DOT_WRITTEN = ROW_HEAD + """    if (r < rows) {
        const float* dot_u = x + (long long)r * cols;
        float dot_s = 0.0f;
        for (int dot_j = 0; dot_j < cols; ++dot_j) dot_s += dot_u[dot_j] * x[dot_j];
        y[r] = dot_s;
    }
}
"""

MOMENTS = """__device__ void moments(const float* v, int n, float& mean, float& var) {
    float s = 0.0f, q = 0.0f;
    for (int j = 0; j < n; ++j) {
        s += v[j];
        q += v[j] * v[j];
    }
    mean = s / n;
    var = q / n - mean * mean;
}
""" + ROW_HEAD + """    if (r >= rows) return;
    float mean, var;
    moments(x + r * cols, cols, mean, var);
    for (int j = 0; j < cols; ++j) y[r * cols + j] = (x[r * cols + j] - mean) / sqrtf(var + 1e-5f);
}
"""
MOMENTS_WRITTEN = ROW_HEAD + """    if (r >= rows) return;
    float mean, var;
    const float* moments_v = x + r * cols;
    float moments_s = 0.0f, moments_q = 0.0f;
    for (int moments_j = 0; moments_j < cols; ++moments_j) {
        moments_s += moments_v[moments_j];
        moments_q += moments_v[moments_j] * moments_v[moments_j];
    }
    mean = moments_s / cols;
    var = moments_q / cols - mean * mean;
    for (int j = 0; j < cols; ++j) y[r * cols + j] = (x[r * cols + j] - mean) / sqrtf(var + 1e-5f);
}
"""

# the maximum declared as the caller's local; the sum of exponentials hoisted out of `logf(...)`
LOGSUMEXP = """__device__ float row_max(const float* v, int n) {
    float m = v[0];
    for (int j = 1; j < n; ++j) m = fmaxf(m, v[j]);
    return m;
}
__device__ float sum_exp(const float* v, int n, float m) {
    float s = 0.0f;
    for (int j = 0; j < n; ++j) s += expf(v[j] - m);
    return s;
}
""" + ROW_HEAD + """    if (r >= rows) return;
    const float* xr = x + r * cols;
    float m = row_max(xr, cols);
    y[r] = m + logf(sum_exp(xr, cols, m));
}
"""
LOGSUMEXP_WRITTEN = ROW_HEAD + """    if (r >= rows) return;
    const float* xr = x + r * cols;
    float m = xr[0];
    for (int row_max_j = 1; row_max_j < cols; ++row_max_j) m = fmaxf(m, xr[row_max_j]);
    float sum_exp_s = 0.0f;
    for (int sum_exp_j = 0; sum_exp_j < cols; ++sum_exp_j) sum_exp_s += expf(xr[sum_exp_j] - m);
    y[r] = m + logf(sum_exp_s);
}
"""

# an elementwise helper reading its own element: no effect, but it reads memory, so the forwards could not see it
GELU = """__device__ float gelu_at(const float* x, int i) {
    const float v = x[i];
    return 0.5f * v * (1.0f + erff(v * 0.70710678f));
}
__global__ void kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = gelu_at(x, i);
}
"""
GELU_WRITTEN = """__global__ void kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float gelu_at_v = x[i];
        y[i] = 0.5f * gelu_at_v * (1.0f + erff(gelu_at_v * 0.70710678f));
    }
}
"""

# a helper calling a helper, called twice (the second time inside an expression, its int value then scaled): the
# outer call is written out first, the inner one it brings into the kernel on the next pass, each numbered apart
NESTED = """__device__ float sumsq(const float* v, int n) {
    float s = 0.0f;
    for (int j = 0; j < n; ++j) s += v[j] * v[j];
    return s;
}
__device__ int bucket(const float* v, int n) {
    float norm = sqrtf(sumsq(v, n));
    return (int)norm;
}
""" + ROW_HEAD + """    if (r < rows) {
        float b = bucket(x + r * cols, cols);
        y[r] = b + bucket(x + r * cols + 1, cols - 1) * 0.5f;
    }
}
"""
NESTED_WRITTEN = ROW_HEAD + """    if (r < rows) {
        const float* bucket_v = x + r * cols;
        float sumsq_s = 0.0f;
        for (int sumsq_j = 0; sumsq_j < cols; ++sumsq_j) sumsq_s += bucket_v[sumsq_j] * bucket_v[sumsq_j];
        float bucket_norm = sqrtf(sumsq_s);
        float b = (int)bucket_norm;
        const float* bucket2_v = x + r * cols + 1;
        float sumsq2_s = 0.0f;
        for (int sumsq2_j = 0; sumsq2_j < (cols - 1); ++sumsq2_j) sumsq2_s += bucket2_v[sumsq2_j] * bucket2_v[sumsq2_j];
        float bucket2_norm = sqrtf(sumsq2_s);
        int bucket2_value = (int)bucket2_norm;
        y[r] = b + bucket2_value * 0.5f;
    }
}
"""

GOLDEN = {"a reduction helper": (DOT, DOT_WRITTEN, ROWS),
          "reference out-parameters": (MOMENTS, MOMENTS_WRITTEN, ROWS),
          "a hoisted value helper": (LOGSUMEXP, LOGSUMEXP_WRITTEN, ROWS),
          "an elementwise helper": (GELU, GELU_WRITTEN, FLAT),
          "nested helpers": (NESTED, NESTED_WRITTEN, ROWS)}


@pytest.mark.parametrize("case", GOLDEN)
def test_calls_are_written_out_where_they_stood(case):
    before, after, plan = GOLDEN[case]
    state = inlined_calls(_state(before, plan))
    assert _kernel_text(state) == after
    assert state.source.startswith(before[:before.index("__global__")])  # the helpers stay defined
    assert inlined_calls(state) is state  # nothing left to write out


def test_the_written_out_kernels_compile(cache):
    for before, _, plan in GOLDEN.values():
        compiles_without_spills(inlined_calls(_state(before, plan)), cache)


def test_two_calls_of_one_helper_get_locals_of_their_own():
    twice = DOT.replace("    if (r < rows) y[r] = dot(x + (long long)r * cols, x, cols);\n",
                        "    if (r >= rows) return;\n    float a = dot(x + r * cols, x, cols);\n"
                        "    float b = dot(x, x + r * cols, cols);\n    y[r] = a - b;\n")
    text = _kernel_text(inlined_calls(_state(twice)))
    # each result local declared as the caller's (`float a = dot(...)`: the helper's `s` is `a`)
    assert "    const float* dot_u = x + r * cols;\n    float a = 0.0f;\n" \
           "    for (int dot_j = 0; dot_j < cols; ++dot_j) a += dot_u[dot_j] * x[dot_j];\n" in text
    assert "    const float* dot2_w = x + r * cols;\n    float b = 0.0f;\n" \
           "    for (int dot2_j = 0; dot2_j < cols; ++dot2_j) b += x[dot2_j] * dot2_w[dot2_j];\n" in text


def test_a_helper_the_forwards_read_as_math_stays_called():
    """`_calls.pure_functions` admits `sq`: the forwards move it like `expf` already, and its call stays."""
    state = _state("__device__ float sq(float v) { return v * v; }\n" + ROW_HEAD +
                   "    if (r >= rows) return;\n    float s = 0.0f;\n"
                   "    for (int j = 0; j < cols; ++j) s += sq(x[r * cols + j]);\n    y[r] = s;\n}\n")
    assert inlined_calls(state) is state


def test_argument_kinds():
    """A name or literal of the parameter's type and integer arithmetic on such names stand in for the parameter; a
    float expression, a read of memory and an argument of another type get a local of the parameter's type."""
    helper = "__device__ float f(const float* v, int a, float b, float c, int d, float e) {\n" \
             "    return v[a] * b + c * d + e;\n}\n"
    state = _state(helper + ROW_HEAD + "    if (r < rows) y[r] = f(x, r * cols + 1, 2.0f, x[r] * 0.5f, cols, 1);\n}\n")
    text = _kernel_text(inlined_calls(state))
    assert "        const float f_c = x[r] * 0.5f;\n        const float f_e = 1;\n" in text
    assert "        y[r] = x[(r * cols + 1)] * 2.0f + f_c * cols + f_e;\n" in text


def test_a_value_the_call_discards_is_still_evaluated():
    helper = "__device__ float touch(float* c, int j) { c[j] += 1.0f; return c[j] * 2.0f; }\n"
    state = _state(helper + ROW_HEAD + "    if (r < rows) touch(y, r);\n}\n")
    assert _kernel_text(inlined_calls(state)).endswith(
        "    if (r < rows) {\n        y[r] += 1.0f;\n        (void)(y[r] * 2.0f);\n    }\n}\n")


def test_a_value_of_another_type_converts_as_the_return_did():
    helper = "__device__ int floor_at(const float* v, int j) { return v[j]; }\n"
    state = _state(helper + ROW_HEAD + "    if (r < rows) {\n        float a = floor_at(x, r);\n"
                   "        y[r] = a;\n    }\n}\n")
    text = _kernel_text(inlined_calls(state))
    assert "        float a = (int)(x[r]);\n" in text  # float to int as the return, then to float


REFUSED = {
    "two returns": ("__device__ float f(const float* v, int n) { if (n == 0) return 0.0f; return v[0]; }\n",
                    "    if (r < rows) y[r] = f(x, cols);\n"),
    "recursion": ("__device__ float f(const float* v, int n) { float s = n > 0 ? f(v + 1, n - 1) : 0.0f;\n"
                  "    return s + v[0]; }\n", "    if (r < rows) y[r] = f(x, cols);\n"),
    "a template": ("template <typename T> __device__ T f(const T* v) { T s = v[0]; return s; }\n",
                   "    if (r < rows) y[r] = f(x);\n"),
    "a call under &&": ("__device__ bool f(const float* v, int j) { bool ok = v[j] > 0.0f; return ok; }\n",
                        "    if (r < rows) y[r] = (float)(cols > 0 && f(x, r));\n"),
    "a call under ?:": ("__device__ float f(const float* v, int j) { float t = v[j]; return t; }\n",
                        "    if (r < rows) y[r] = cols > 0 ? f(x, r) : 0.0f;\n"),
    "a call in a loop's condition": ("__device__ int f(const float* v) { int n = (int)v[0]; return n; }\n",
                                     "    for (int j = 0; j < f(x); ++j) y[j] = 0.0f;\n"),
    "a call in sizeof": ("__device__ float f(const float* v) { float t = v[0]; return t; }\n",
                         "    if (r < rows) y[r] = sizeof(f(x));\n"),
    "a reference to an array element": ("__device__ void f(const float* v, float& o) { o = v[0] * 2.0f; }\n",
                                        "    if (r < rows) f(x + r, y[r]);\n"),
    "a reference named by another argument": ("__device__ void f(float a, float& o) { o = a * 2.0f; }\n",
                                              "    float t = x[r];\n    f(t, t);\n    y[r] = t;\n"),
    # a store through a pointer, twice in one expression: which runs first is the compiler's to choose
    "a helper writing memory, twice in one expression": (
        "__device__ float bump(float* c) { float old = c[0]; c[0] = old + 1.0f; return old; }\n",
        "    if (r < rows) y[r] = bump(y) + bump(y);\n"),
    "a helper writing memory inside an expression": (
        "__device__ float bump(float* c) { float old = c[0]; c[0] = old + 1.0f; return old; }\n",
        "    if (r < rows) y[r] = x[r] + bump(y);\n"),
    "an effect (printf)": ("__device__ float f(const float* v) { printf(\"%f\", v[0]); return v[0]; }\n",
                           "    if (r < rows) y[r] = f(x);\n"),
    "a static local": ("__device__ float f(const float* v) { static float seen = 0.0f; seen += v[0]; return seen; }\n",
                       "    if (r < rows) y[r] = f(x);\n"),
    "goto": ("__device__ float f(const float* v) { float t = v[0]; if (t > 0) goto out; t = 0; out: return t; }\n",
             "    if (r < rows) y[r] = f(x);\n"),
    "asm": ("__device__ float f(const float* v) { float t = v[0]; asm volatile(\"\"); return t; }\n",
            "    if (r < rows) y[r] = f(x);\n"),
    "an overload": ("__device__ float f(const float* v) { float t = v[0]; return t; }\n"
                    "__device__ float f(const float* v, int k) { float t = v[k]; return t; }\n",
                    "    if (r < rows) y[r] = f(x);\n"),
    "a default argument": ("__device__ float f(const float* v, int k = 0);\n"
                           "__device__ float f(const float* v, int k) { float t = v[k]; return t; }\n",
                           "    if (r < rows) y[r] = f(x);\n"),
    "an array parameter": ("__device__ float f(const float v[4]) { float t = v[0]; return t; }\n",
                           "    if (r < rows) y[r] = f(x);\n"),
    "a name the kernel hides": ("__constant__ float scale[1];\n"
                                "__device__ float f(const float* v) { float t = v[0] * scale[0]; return t; }\n",
                                "    float scale = 2.0f;\n    if (r < rows) y[r] = f(x) * scale;\n"),
    "a static local at the call": ("__device__ float f(const float* v) { float t = v[0]; return t; }\n",
                                   "    static float once = f(x);\n    if (r < rows) y[r] = once;\n"),
}


# the same helpers where the call runs as written: each refusal above is for its own reason
TWINS = {
    "a call under &&": "    if (r < rows) y[r] = (float)(cols > 0 & f(x, r));\n",  # `&` evaluates both sides
    "a call under ?:": "    if (r < rows) y[r] = (cols > 0) * f(x, r);\n",
    "a call in a loop's condition": "    int count = f(x);\n    for (int j = 0; j < count; ++j) y[j] = 0.0f;\n",
    "a reference to an array element": "    float t;\n    f(x + r, t);\n    y[r] = t;\n",
    "a reference named by another argument": "    float t = x[r], u;\n    f(t, u);\n    y[r] = u;\n",
    "a helper writing memory inside an expression": "    if (r < rows) y[r] = bump(y);\n",  # the whole value stored
    "a name the kernel hides": "    float twice = 2.0f;\n    if (r < rows) y[r] = f(x) * twice;\n",
    "a static local at the call": "    float once = f(x);\n    if (r < rows) y[r] = once;\n",
}


@pytest.mark.parametrize("case", REFUSED)
def test_calls_that_could_run_otherwise_are_left_as_written(case):
    helper, body = REFUSED[case]
    state = _state(helper + ROW_HEAD + body + "}\n")
    assert inlined_calls(state) is state
    if case in TWINS:
        twin = _state(helper + ROW_HEAD + TWINS[case] + "}\n")
        assert not re.search(r"\b(?:f|bump)\(", _kernel_text(inlined_calls(twin)))  # written out


def test_a_helper_defined_after_the_kernel_stays_called():
    state = _state("__device__ float f(const float* v);\n" + ROW_HEAD + "    if (r < rows) y[r] = f(x);\n}\n"
                   "__device__ float f(const float* v) { float t = v[0]; return t; }\n")
    assert inlined_calls(state) is state


# --- the kernels' bits on the CPU ------------------------------------------------------------------------------


def _rows(rows, cols):
    x = torch.randn(rows * cols, generator=torch.Generator().manual_seed(rows * 1000 + cols))
    return {"rows": rows, "cols": cols}, {"x": x}, {"y": (torch.float32, rows * cols)}


def _flat(n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 4
    return {"n": n}, {"x": x}, {"y": (torch.float32, n)}


@pytest.mark.parametrize("case", GOLDEN)
def test_the_written_out_kernels_are_the_helpers_bits_on_the_cpu(tmp_path, case):
    """Each kernel and its written-out form store the same bits, rows shorter and longer than a block and a ragged
    last block; for the reduction, a form whose loop skips the row's first element is caught."""
    before, _, plan = GOLDEN[case]
    naive = _state(before, plan)
    forms = {"written out": inlined_calls(naive)}
    if case == "a reduction helper":
        forms["from one"] = _state(forms["written out"].source.replace("int dot_j = 0;", "int dot_j = 1;"), plan)
    shapes, inputs = (((1000,), (77,)), _flat) if plan is FLAT else (((3, 5), (130, 40)), _rows)
    found = emulate.differences(tmp_path, naive, forms, shapes, inputs)
    assert all(line.startswith("from one") for line in found), found
    assert len(found) == (4 if "from one" in forms else 0), found


# --- the forwards on helper spellings of naive kernels ---------------------------------------------------------

# (the helper's spelling, the kernel written without it, the plan), as probed: the helpers made the row forwards
# refuse ("calls dot, which may have effects")
MATVEC_PLAN = plan_of('"a", "x", "y", { scalar = "batch * m", type = "i32" }, { scalar = "m", type = "i32" }, '
                      '{ scalar = "k", type = "i32" }', grid="cdiv(batch * m, 128)", block=128)
SPELLINGS = {
    "batched_matvec": ("""__device__ __forceinline__ float dot(const float* __restrict__ u, const float* __restrict__ w,
                                           int k) {
    float s = 0.0f;
    for (int j = 0; j < k; ++j) s += u[j] * w[j];
    return s;
}
__global__ void kernel(const float* __restrict__ a, const float* __restrict__ x, float* __restrict__ y,
                       int outputs, int m, int k) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < outputs) y[row] = dot(a + (long long)row * k, x + (long long)(row / m) * k, k);
}
""", """__global__ void kernel(const float* __restrict__ a, const float* __restrict__ x, float* __restrict__ y,
                       int outputs, int m, int k) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= outputs) return;
    const float* xb = x + (long long)(row / m) * k;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc += a[(long long)row * k + j] * xb[j];
    y[row] = acc;
}
""", MATVEC_PLAN),
    "row_logsumexp": ("""__device__ __forceinline__ float row_max(const float* __restrict__ xr, int cols) {
    float m = -INFINITY;
    for (int j = 0; j < cols; ++j) m = fmaxf(m, xr[j]);
    return m;
}
__device__ __forceinline__ float row_sumexp(const float* __restrict__ xr, int cols, float m) {
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s += expf(xr[j] - m);
    return s;
}
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < rows) {
        const float* xr = x + (long long)row * cols;
        float m = row_max(xr, cols);
        y[row] = m + logf(row_sumexp(xr, cols, m));
    }
}
""", """__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, const int rows, const int cols) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* xr = x + static_cast<int64_t>(row) * cols;
    float m = -INFINITY;
    for (int j = 0; j < cols; ++j) m = fmaxf(m, xr[j]);
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s += expf(xr[j] - m);
    y[row] = m + logf(s);
}
""", ROWS),
    "col_mean": ("""__device__ __forceinline__ float col_sum(const float* x, int rows, int cols, int c) {
    float s = 0.0f;
    for (int r = 0; r < rows; ++r) s += x[r * cols + c];
    return s;
}
__global__ void kernel(const float* x, float* y, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols) y[c] = col_sum(x, rows, cols, c) / rows;
}
""", """__global__ void kernel(const float* x, float* y, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols) {
        float s = 0;
        for (int r = 0; r < rows; r++) s += x[r * cols + c];
        y[c] = s / rows;
    }
}
""", plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }', grid="cdiv(cols, 256)")),
    "argmin_rows": ("""__device__ __forceinline__ int row_argmin(const float* row, int cols) {
    float best = row[0];
    int bi = 0;
    for (int j = 1; j < cols; j++) {
        if (row[j] < best) { best = row[j]; bi = j; }
    }
    return bi;
}
__global__ void kernel(const float* x, int* idx, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) idx[r] = row_argmin(x + (size_t)r * cols, cols);
}
""", """__global__ void kernel(const float* x, int* idx, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) {
        const float* row = x + (size_t)r * cols;
        float best = row[0];
        int bi = 0;
        for (int j = 1; j < cols; j++) {
            if (row[j] < best) { best = row[j]; bi = j; }
        }
        idx[r] = bi;
    }
}
""", plan_of('"x", "idx", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }',
             grid="cdiv(rows, 128)", block=128)),
    "l2_normalize": ("""__device__ __forceinline__ float row_sumsq(const float* __restrict__ in, int cols) {
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s += in[j] * in[j];
    return s;
}
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < rows) {
        const float* in = x + (long long)row * cols;
        float scale = 1.0f / fmaxf(sqrtf(row_sumsq(in, cols)), 1e-12f);
        for (int j = 0; j < cols; ++j) y[(long long)row * cols + j] = in[j] * scale;
    }
}
""", """__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + (long long)row * cols;
    float squares = 0.0f;
    for (int j = 0; j < cols; ++j) squares += in[j] * in[j];
    float scale = 1.0f / fmaxf(sqrtf(squares), 1e-12f);
    for (int j = 0; j < cols; ++j) y[(long long)row * cols + j] = in[j] * scale;
}
""", ROWS),
}
ADAM_PLAN = plan_of('"p", "g", "m", "v", "p_out", "m_out", "v_out", { scalar = "n", type = "i32" }')
ADAM_HELPER = """#define BLOCK 256
__device__ __forceinline__ void adam_step(float p, float grad, float m, float v, float& p_new, float& m1, float& v1) {
    m1 = 0.9f * m + 0.1f * grad;
    v1 = 0.999f * v + 0.001f * grad * grad;
    float m_hat = m1 / (1.0f - 0.3486784401f);
    float v_hat = v1 / (1.0f - 0.9900448802f);
    p_new = p - 1e-3f * m_hat / (sqrtf(v_hat) + 1e-8f);
}
__global__ void kernel(const float* p, const float* g, const float* m, const float* v,
                       float* p_out, float* m_out, float* v_out, int n) {
    size_t i = (size_t)blockIdx.x * BLOCK + threadIdx.x;
    if (i < (size_t)n) {
        float pn, m1, v1;
        adam_step(p[i], g[i], m[i], v[i], pn, m1, v1);
        p_out[i] = pn;
        m_out[i] = m1;
        v_out[i] = v1;
    }
}
"""
ADAM_BASE = """__global__ void kernel(const float* __restrict__ p, const float* __restrict__ g,
                       const float* __restrict__ m, const float* __restrict__ v, float* __restrict__ p_out,
                       float* __restrict__ m_out, float* __restrict__ v_out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float grad = g[i];
        float m1 = 0.9f * m[i] + 0.1f * grad;
        float v1 = 0.999f * v[i] + 0.001f * grad * grad;
        float m_hat = m1 / (1.0f - 0.3486784401f);
        float v_hat = v1 / (1.0f - 0.9900448802f);
        p_out[i] = p[i] - 1e-3f * m_hat / (sqrtf(v_hat) + 1e-8f);
        m_out[i] = m1;
        v_out[i] = v1;
    }
}
"""
ROW_FORWARDS = ("serialize_reduction", "serialize_block_reduction", "unsplit_reduction", "serialize_column_reduction")


@pytest.mark.parametrize("name", SPELLINGS)
def test_the_row_forwards_find_the_sites_of_the_kernel_without_its_helper(name):
    helper, base, plan = SPELLINGS[name]
    spelled, plain = _state(helper, plan), _state(base, plan)
    assert get("serialize_reduction").forward_sites(spelled)  # the site the helper hid
    for transform in map(get, ROW_FORWARDS):
        assert transform.forward_sites(spelled) == transform.forward_sites(plain), transform.name


def test_the_elementwise_forward_finds_the_adam_step_written_out():
    transform = get("scalarize_elementwise")
    (site,) = transform.forward_sites(_state(ADAM_BASE, ADAM_PLAN))
    assert transform.forward_sites(_state(ADAM_HELPER, ADAM_PLAN)) == [site]


@pytest.mark.parametrize("name", ["batched_matvec", "row_logsumexp"])
def test_the_warp_forms_of_a_helper_and_of_its_kernel_agree_bit_for_bit(tmp_path, name):
    """serialize_reduction's warp form of the helper's spelling sums each row as the warp form of the kernel
    without it does (the same loop, lanes and shuffles), so the two store the same bits."""
    helper, base, plan = SPELLINGS[name]
    transform = get("serialize_reduction")
    (site,) = transform.forward_sites(_state(base, plan))
    warp_base, warp_helper = (transform.forward(_state(s, plan), site).state for s in (base, helper))

    def inputs(outputs, cols):
        g = torch.Generator().manual_seed(outputs * 100 + cols)
        if name == "batched_matvec":  # batch 2 of (outputs / 2, k) matrices
            return ({"batch": 2, "m": outputs // 2, "k": cols},
                    {"a": torch.randn(outputs * cols, generator=g), "x": torch.randn(2 * cols, generator=g)},
                    {"y": (torch.float32, outputs)})
        return ({"rows": outputs, "cols": cols}, {"x": torch.randn(outputs * cols, generator=g)},
                {"y": (torch.float32, outputs)})

    assert emulate.differences(tmp_path, warp_base, {"helper": warp_helper}, ((6, 5), (70, 100)), inputs) == []
