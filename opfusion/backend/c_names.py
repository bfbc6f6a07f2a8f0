"""C names for generated code: types of IR dtypes, and safe, unique identifiers.

A name that reaches generated C comes from a user (``build(..., name=...)``, a placeholder name)
or from a model file. It is reduced to ``[A-Za-z_][A-Za-z0-9_]*``, kept clear of C keywords,
of the names the included headers declare, of identifiers C reserves (``_X``, ``__x``) and of the
``opf_`` prefix that the code generator uses for its own helpers."""

from __future__ import annotations

import hashlib
import re

from ..errors import BuildError

#: C type of each IR dtype.
C_TYPES = {
    "bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
    "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t",
    "uint64": "uint64_t", "float16": "_Float16", "float32": "float", "float64": "double",
}


def c_type(dtype: str) -> str:
    """The C type that holds one value of ``dtype``."""
    try:
        return C_TYPES[dtype]
    except KeyError:
        raise BuildError(f"the C code generator has no type for dtype {dtype!r}") from None

#: Longest identifier made from a user's name. A longer name is cut and ends in a hash of the
#: whole name, so that two names that differ only after the cut still give two identifiers.
MAX_NAME_LENGTH = 48

#: Hex digits of the hash that ends a shortened identifier.
_HASH_DIGITS = 8

_C_KEYWORDS = (
    "auto break case char const continue default do double else enum extern float for goto if "
    "inline int long register restrict return short signed sizeof static struct switch typedef "
    "union unsigned void volatile while asm typeof bool true false NULL main errno "
    # CUDA's built-in variables (the CUDA emitter shares these names)
    "threadIdx blockIdx blockDim gridDim warpSize"
).split()

_MATH_FUNCTIONS = (
    "exp exp2 expm1 log log2 log10 log1p sqrt cbrt tanh erf erfc floor ceil trunc round nearbyint "
    "rint lround fabs fmin fmax fma sin cos tan asin acos atan sinh cosh asinh acosh atanh pow "
    "atan2 fmod remainder hypot ldexp frexp modf copysign nan isnan isinf isfinite signbit lgamma "
    "tgamma"
).split()

_LIBRARY_NAMES = (
    "malloc calloc realloc free aligned_alloc posix_memalign abort exit atexit system getenv "
    "qsort bsearch abs labs llabs div ldiv rand srand atoi atol atof strtol strtod memcpy memset "
    "memmove memcmp strlen strcpy strcmp printf fprintf puts INFINITY NAN int8_t int16_t int32_t "
    "int64_t uint8_t uint16_t uint32_t uint64_t intptr_t uintptr_t size_t ptrdiff_t INT64_C "
    "UINT64_C UINT32_C INT64_MIN INT32_MIN"
).split()

#: Names a sanitized identifier must not take.
RESERVED = frozenset(
    _C_KEYWORDS
    + _MATH_FUNCTIONS
    + [name + "f" for name in _MATH_FUNCTIONS]
    + [name + "l" for name in _MATH_FUNCTIONS]
    + _LIBRARY_NAMES
)

#: Prefix of every identifier the code generator makes up itself (helpers, status, types).
HELPER_PREFIX = "opf_"

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_]")


def sanitize_identifier(name: str) -> str:
    """Return ``name`` as a safe C identifier (not necessarily unique).

    Characters outside ``[A-Za-z0-9_]`` become ``_``; a leading digit or underscore gets a
    ``v`` prefix; C keywords, library names and the ``opf_`` prefix get a ``_`` suffix or a
    ``u`` prefix. ``'a"; system("rm'`` becomes ``a___system__rm``. A name longer than
    :data:`MAX_NAME_LENGTH` keeps its start and ends in ``_`` and a hash of the whole name
    (the end of a long name, such as a kernel's index, is often what tells it apart)."""
    text = _BAD_CHARS.sub("_", str(name))
    if len(text) > MAX_NAME_LENGTH:
        digest = hashlib.sha256(str(name).encode("utf-8", "surrogatepass")).hexdigest()
        text = f"{text[:MAX_NAME_LENGTH - _HASH_DIGITS - 1]}_{digest[:_HASH_DIGITS]}"
    if not text:
        return "v"
    if text[0].isdigit() or text[0] == "_":
        text = "v" + text
    if text.startswith(HELPER_PREFIX):
        text = "u" + text
    if text in RESERVED:
        text += "_"
    return text


class NameTable:
    """Hands out unique, safe C identifiers within one generated function, deterministically."""

    def __init__(self) -> None:
        self._taken: set[str] = set()

    def fresh(self, hint: str) -> str:
        """Return a new identifier based on ``hint`` that no earlier call returned (at most
        :data:`MAX_NAME_LENGTH` characters, so that it is its own sanitized form)."""
        base = sanitize_identifier(hint)
        name, counter = base, 1
        while name in self._taken:
            suffix = f"_{counter}"
            name = base[:MAX_NAME_LENGTH - len(suffix)] + suffix
            counter += 1
        self._taken.add(name)
        return name

    def reserve(self, name: str) -> str:
        """Take ``name`` exactly (one of the generator's own ``opf_`` names) and return it."""
        assert name not in self._taken, f"{name} is reserved twice"
        self._taken.add(name)
        return name
