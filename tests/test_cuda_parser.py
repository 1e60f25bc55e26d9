"""The tree-sitter-cuda wrapper: parsing, syntax errors, and its views of the source."""

from pathlib import Path

from klineage.features import cuda_parser as cp

FIXTURE = Path(__file__).parent / "fixtures" / "static" / "hgemm_mma.cu"


def test_parse_is_cached_and_reads_text_from_the_original():
    source = "__global__ void k() { __shared__ __align__(16) float s[4]; }\n"
    parsed = cp.parse(source)
    assert cp.parse(source) is parsed
    (declaration,) = cp.nodes_of_type(parsed.root, "declaration")
    # __align__ is blanked for the grammar, but node text comes from the source as written.
    assert parsed.text(declaration) == "__shared__ __align__(16) float s[4];"


def test_attributes_are_blanked_only_in_code_and_never_across_lines():
    """An `__align__(` in a comment once blanked everything up to the next `)`, hiding the code
    between (issue 28): only an attribute in code, closed on its own line, is blanked."""
    hidden = "__device__ float g_cache[64];"
    source = f"// pack as __align__(\n{hidden}\n// )\n__global__ void k(float* y) {{ y[0] = g_cache[0]; }}\n"
    view = cp._parse_view(source.encode()).decode()
    assert hidden in view
    (declaration,) = [d for d in cp.declarations(source) if d.name == "g_cache"]
    assert "__device__" in declaration.specifiers
    in_string = 'const char* s = "__align__(";\n' + hidden + "\n"
    assert hidden in cp._parse_view(in_string.encode()).decode()
    spliced = "// note \\\n__align__(\n" + hidden + "\n)\n"  # a // comment runs on past a line splice
    assert hidden in cp._parse_view(spliced.encode()).decode()
    open_in_code = "struct __align__(\n16) V { float a; };\n" + hidden + "\n"
    assert cp._parse_view(open_in_code.encode()).decode() == open_in_code  # left to the grammar, which fails closed
    assert cp._parse_view(b"struct __align__(16) V {};") == b"struct               V {};"


def test_clean_source_has_no_syntax_errors():
    assert cp.syntax_errors(FIXTURE.read_text()) == []


def test_syntax_errors_give_line_column_and_text():
    source = "__global__ void k(float* x) {\n  x[0] = ;\n}\n__global__ void j( { }\n"
    issues = cp.syntax_errors(source)
    assert issues[0] == cp.SyntaxIssue(2, 8, "=")
    assert issues[0] == (2, 8, "=")  # a plain (line, column, text) tuple too
    assert [issue.line for issue in issues] == [2, 4]


def test_missing_tokens_are_syntax_errors():
    issues = cp.syntax_errors("__global__ void k() { int x = 1 }\n")
    assert issues == [cp.SyntaxIssue(1, 32, "missing ';'")]


def test_columns_count_characters_not_bytes():
    issues = cp.syntax_errors("__global__ void k() { /* é */ int x = ; }\n")
    assert issues == [cp.SyntaxIssue(1, 37, "=")]


def test_cuda_attribute_macros_the_grammar_lacks_parse():
    source = ("struct __align__(16) Pack { float a, b, c, d; };\n"
              "__global__ void __cluster_dims__(2, 1, 1) k() {}\n"
              "__global__ void __maxnreg__(64) j() {}\n")
    assert cp.syntax_errors(source) == []
    assert [f.name for f in cp.functions(source)] == ["k", "j"]


def test_pragma_as_braceless_loop_body_is_not_an_error():
    source = ("__global__ void k(float* x) {\n"
              "  for (int i = 0; i < 4; ++i)\n"
              "#pragma unroll\n"
              "    for (int j = 0; j < 4; ++j) x[i * 4 + j] = 0;\n"
              "}\n")
    assert cp.syntax_errors(source) == []
    assert [loop.pragma for loop in cp.loops(source)] == ["", "unroll"]


def test_functions_name_qualifiers_templates_bounds_and_lines():
    source = (
        "template <int BM, typename T>\n"
        "__global__ void __launch_bounds__(256, 2) gemm(const T* __restrict__ a) {\n"
        "}\n"
        "static __device__ __forceinline__ float* pick(float* p) { return p; }\n"
        "namespace ops { struct Tile { __device__ float get(int i) const { return 0.f; } }; }\n"
        "__device__ float4 Vec::load() { return {}; }\n"
        "extern \"C\" __global__ void plain(float* out) {}\n"
    )
    by_name = {f.name: f for f in cp.functions(source)}
    gemm = by_name["gemm"]
    assert gemm.qualifiers == ("__global__",)
    assert gemm.template_params == ("int BM", "typename T")
    assert gemm.launch_bounds == ("256", "2")
    assert gemm.lines == (2, 3)
    assert gemm.is_kernel
    pick = by_name["pick"]
    assert pick.qualifiers == ("static", "__device__", "__forceinline__")
    assert not pick.is_kernel and pick.template_params == () and pick.launch_bounds == ()
    assert by_name["get"].scope == "ops::Tile"
    assert "Vec::load" in by_name
    assert by_name["plain"].is_kernel and by_name["plain"].scope == ""


def test_loops_with_their_pragmas_and_functions():
    source = (
        "__device__ void f(int n) {\n"
        "#pragma unroll 4\n"
        "  for (int i = 0; i < n; ++i) {}\n"
        "  #pragma nounroll\n"
        "  // a comment between the pragma and its loop\n"
        "  while (n--) {}\n"
        "  do { } while (n);\n"
        "  int a[2];\n"
        "  for (int x : a) {}\n"
        "}\n"
    )
    loops = cp.loops(source)
    assert [(loop.kind, loop.pragma, loop.lines[0]) for loop in loops] == [
        (cp.LoopKind.FOR, "unroll 4", 3),
        (cp.LoopKind.WHILE, "nounroll", 6),
        (cp.LoopKind.DO, "", 7),
        (cp.LoopKind.RANGE_FOR, "", 9),
    ]
    assert {loop.function for loop in loops} == {"f"}
    assert cp.line_range(loops[0].pragma_node) == (2, 2)
    assert loops[2].pragma_node is None


def test_declarations():
    source = (
        "__device__ int counter;\n"
        "__device__ const float* table;\n"
        "__device__ float* const fixed = nullptr;\n"
        "constexpr int BM = 128;\n"
        "__device__ float helper(float);\n"
        "__global__ void k(const float* in) {\n"
        "  extern __shared__ float4 dyn[];\n"
        "  __shared__ __align__(16) half tile[2][BM * 32];\n"
        "  const int tid = threadIdx.x, lanes[2] = {0, 1};\n"
        "  float& ref = *const_cast<float*>(in);\n"
        "  static int calls = 0;\n"
        "}\n"
    )
    found = {d.name: d for d in cp.declarations(source)}
    assert "helper" not in found  # a prototype declares no variable
    assert found["counter"].specifiers == ("__device__",) and found["counter"].function is None
    assert not found["counter"].constant
    assert not found["table"].constant and found["table"].indirection == "*"  # the pointee is const
    assert found["fixed"].constant  # the pointer itself is const
    assert found["BM"].constant
    dyn = found["dyn"]
    assert (dyn.type, dyn.specifiers, dyn.dims, dyn.function, dyn.line) == (
        "float4", ("extern", "__shared__"), ("",), "k", 7)
    assert found["tile"].dims == ("2", "BM * 32") and found["tile"].type == "half"
    assert found["tid"].constant and found["lanes"].dims == ("2",)
    assert found["ref"].indirection == "&"
    assert found["calls"].specifiers == ("static",) and found["calls"].init is not None


def test_asm_blocks_join_string_pieces():
    blocks = cp.asm_blocks(FIXTURE.read_text())
    mma = next(b for b in blocks if "mma.sync" in b.code)
    assert mma.code.startswith("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}")
    assert mma.function == "mma_16816"
    assert mma.lines == (26, 30)


def test_macros():
    source = ("#define TILE 64\n"
              "#define CP(dst, src) \\\n"
              '    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src))\n')
    tile, cp_macro = cp.macros(source)
    assert (tile.name, tile.params, tile.body, tile.line) == ("TILE", None, "64", 1)
    assert cp_macro.params == ("dst", "src")
    assert cp_macro.body.startswith("asm volatile(") and "\\" not in cp_macro.body
    fragment = cp.parse_fragment(cp_macro.body)
    assert cp.syntax_errors(fragment) == []
    assert cp.asm_blocks(fragment)[0].function == cp.FRAGMENT_FUNCTION


def test_enclosing_function_call_name_and_node_helpers():
    source = "__global__ void k(float* x) {\n  auto f = [&] { nvcuda::wmma::mma_sync(a, b, c, d); };\n}\nint g;\n"
    parsed = cp.parse(source)
    (call,) = cp.nodes_of_type(parsed.root, "call_expression")
    assert cp.call_name(call) == "mma_sync"
    assert cp.function_name(cp.enclosing_function(call)) == "k"
    assert cp.function_of(call) == "k"
    assert cp.line_range(call) == (2, 2)
    (global_decl,) = [d for d in cp.nodes_of_type(parsed.root, "declaration") if parsed.text(d) == "int g;"]
    assert cp.enclosing_function(global_decl) is None
    assert cp.function_of(global_decl) is None


def test_captures_runs_a_query():
    found = cp.captures(cp.parse(FIXTURE.read_text()).root, "(launch_bounds) @bounds")
    assert [cp.line_range(n) for n in found["bounds"]] == [(39, 39)]


def test_pragma_text():
    parsed = cp.parse("#pragma unroll 2\n#define X 1\n")
    pragma, define = parsed.root.named_children
    assert cp.is_pragma(pragma) and cp.pragma_text(pragma) == "unroll 2"
    assert not cp.is_pragma(define) and cp.pragma_text(define) == ""
