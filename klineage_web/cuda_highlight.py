"""CUDA C++ syntax highlighting on the server: source in, escaped HTML lines out.

One regular expression splits the source into comments, preprocessor lines, string and
character literals, numbers, names and everything else; names are then classed as keywords,
types, CUDA qualifiers or CUDA built-ins. Inside `asm(...)` the template strings are split
further: PTX mnemonics (`mma.sync.aligned...`, `cp.async.wait_group`), directives (`.reg`) and
operands (`%0`). Every piece of text is escaped; only the span tags are markup.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

KEYWORDS = frozenset("""
    alignas alignof asm auto break case catch class const const_cast constexpr continue decltype default
    delete do dynamic_cast else enum explicit extern false for friend goto if inline mutable namespace new
    noexcept nullptr operator private protected public register reinterpret_cast return sizeof static
    static_assert static_cast struct switch template this throw true try typedef typename union using
    virtual volatile while __asm__ __volatile__ __asm
""".split())

TYPES = frozenset("""
    void bool char short int long float double signed unsigned wchar_t char16_t char32_t size_t ptrdiff_t
    int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t intptr_t uintptr_t
    half half2 __half __half2 __nv_bfloat16 __nv_bfloat162 nv_bfloat16 nv_bfloat162 __nv_fp8_e4m3 __nv_fp8_e5m2
    dim3 cudaStream_t cudaError_t
""".split())
# float4, int2, uchar3, longlong2, double4 ...
_VECTOR_TYPE = re.compile(r"(?:u?char|u?short|u?int|u?long|u?longlong|float|double)[1-4]")

CUDA_QUALIFIERS = frozenset("""
    __global__ __device__ __host__ __shared__ __constant__ __managed__ __restrict__ __forceinline__
    __noinline__ __launch_bounds__ __grid_constant__ __align__ __cluster_dims__ __inline__
""".split())

CUDA_BUILTINS = frozenset("""
    threadIdx blockIdx blockDim gridDim warpSize clusterIdx clusterDim
    __syncthreads __syncthreads_or __syncthreads_and __syncthreads_count __syncwarp __threadfence
    __threadfence_block __threadfence_system __ldg __ldcg __ldca __ldcs __stcg __stcs __shfl_sync
    __shfl_up_sync __shfl_down_sync __shfl_xor_sync __ballot_sync __any_sync __all_sync __activemask
    __popc __clz __ffs __brev __fmul_rn __fadd_rn __fmaf_rn __expf __exp2f __logf __fdividef __saturatef
    __float2half __half2float __float2bfloat16 __bfloat162float __cvta_generic_to_shared atomicAdd
    atomicMax atomicMin atomicCAS atomicExch __nanosleep __trap clock64
""".split())

_TOKEN = re.compile(
    r"""
    (?P<comment>//[^\n]*|/\*.*?(?:\*/|\Z))
  | (?P<preproc>^[ \t]*\#(?:[^\n\\]|\\.|\\\n)*)
  | (?P<string>(?:u8|[uUL])?"(?:[^"\\\n]|\\.)*"?)
  | (?P<char>(?:u8|[uUL])?'(?:[^'\\\n]|\\.)*'?)
  | (?P<number>(?<![\w.])(?:0[xX][0-9a-fA-F']+|0[bB][01']+|(?:\d[\d']*\.?[\d']*|\.\d[\d']*)(?:[eE][+-]?\d+)?)[uUlLfF]*)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<space>\s+)
  | (?P<other>.)
    """,
    re.VERBOSE | re.MULTILINE | re.DOTALL,
)

# Inside an asm template string: operands, escapes, and words that may be mnemonics.
_ASM = re.compile(r"(?P<operand>%%?\w+)|(?P<escape>\\.)|(?P<word>\.?[A-Za-z_]\w*(?:\.\w+)*)|(?P<other>.)", re.DOTALL)

CLASSES = {
    "comment": "tok-com",
    "preproc": "tok-pp",
    "string": "tok-str",
    "char": "tok-str",
    "number": "tok-num",
    "keyword": "tok-kw",
    "type": "tok-type",
    "cuda": "tok-cuda",
    "builtin": "tok-builtin",
    "asm": "tok-asm",
    "asm-operand": "tok-asm-op",
}


@dataclass(frozen=True)
class Token:
    kind: str  # a key of CLASSES, or "" for plain text
    text: str


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    asm = _AsmState()
    for match in _TOKEN.finditer(source):
        kind, text = match.lastgroup, match.group()
        if kind == "name":
            tokens.append(Token(_name_kind(text), text))
            asm.name(text)
        elif kind == "string" and asm.in_template:
            tokens.extend(asm.template(text))
        elif kind in ("space", "comment"):
            tokens.append(Token("comment" if kind == "comment" else "", text))
        else:
            tokens.append(Token("" if kind == "other" else kind, text))
            if kind == "other":
                asm.punctuation(text)
            else:
                asm.other()
    return tokens


def highlight_lines(source: str) -> list[SafeString]:
    """The source as escaped HTML, one string per line; a token spanning lines is closed and
    reopened at each line break so every line stands alone."""
    lines: list[list[str]] = [[]]
    for token in tokenize(source.expandtabs(4)):
        pieces = token.text.split("\n")
        for i, piece in enumerate(pieces):
            if i:
                lines.append([])
            if piece:
                css = CLASSES.get(token.kind)
                lines[-1].append(f'<span class="{css}">{escape(piece)}</span>' if css else escape(piece))
    if len(lines) > 1 and not lines[-1]:
        lines.pop()  # the newline that ends the file does not start a line
    return [mark_safe("".join(parts)) for parts in lines]


def highlight(source: str) -> SafeString:
    return mark_safe("\n".join(highlight_lines(source)))


def _name_kind(name: str) -> str:
    if name in CUDA_QUALIFIERS:
        return "cuda"
    if name in KEYWORDS:
        return "keyword"
    if name in TYPES or _VECTOR_TYPE.fullmatch(name):
        return "type"
    if name in CUDA_BUILTINS:
        return "builtin"
    return ""


class _AsmState:
    """Tracks `asm [volatile] ( template : outputs : inputs : clobbers )`."""

    def __init__(self) -> None:
        self.pending = False  # saw `asm`, waiting for its parenthesis
        self.depth = 0  # parenthesis depth inside the asm statement; 0 outside
        self.in_template = False  # before the first ':' at depth 1
        self.at_instruction = True  # the next word starts an instruction
        self.guard = False  # after '@': the next word is a predicate, then the mnemonic

    def name(self, text: str) -> None:
        if text in ("asm", "__asm__", "__asm"):
            self.pending, self.depth = True, 0
        elif self.pending and text in ("volatile", "__volatile__", "goto", "inline"):
            pass
        else:
            self.pending = False

    def punctuation(self, char: str) -> None:
        if self.pending and char == "(":
            self.pending, self.depth, self.in_template, self.at_instruction = False, 1, True, True
            return
        self.pending = False
        if not self.depth:
            return
        if char == "(":
            self.depth += 1
        elif char == ")":
            self.depth -= 1
            if not self.depth:
                self.in_template = False
        elif char == ":" and self.depth == 1:
            self.in_template = False

    def other(self) -> None:
        self.pending = False

    def template(self, literal: str) -> list[Token]:
        """Split one template string literal: quotes and escapes as string, PTX words as mnemonics."""
        prefix_end = literal.index('"') + 1
        body_end = len(literal) - 1 if len(literal) > prefix_end and literal.endswith('"') else len(literal)
        tokens = [Token("string", literal[:prefix_end])]
        for match in _ASM.finditer(literal[prefix_end:body_end]):
            kind, text = match.lastgroup, match.group()
            if kind == "operand":
                tokens.append(Token("asm-operand", text))
                self.at_instruction = False
            elif kind == "escape":
                tokens.append(Token("string", text))
                if text == "\\n":
                    self.at_instruction = True
            elif kind == "word":
                if self.guard:
                    tokens.append(Token("", text))
                    self.guard, self.at_instruction = False, True
                    continue
                tokens.append(Token("asm" if self.at_instruction or text.startswith(".") else "", text))
                self.at_instruction = False
            else:
                tokens.append(Token("", text))
                if text in ";{}":
                    self.at_instruction = True
                elif text == "@":  # a predicate guard; the mnemonic follows the predicate
                    self.guard, self.at_instruction = True, False
        tokens.append(Token("string", literal[body_end:]))
        return [t for t in tokens if t.text]
