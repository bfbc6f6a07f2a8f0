"""Read the text IR (see :mod:`opfusion.ir.printer`) back into an :class:`IRModule`.

One compiled regex splits the text into tokens; a recursive descent over the token list builds
the nodes. Recursion follows only the nesting written in the text (a call inside a call, a
function inside a function), never the number of lines, so 10^5-line bodies parse without
deep stacks. A temporary used twice (``%3``) yields one shared node, as printed. Every syntax
or name error is a :class:`ParseError` with the line, the column and what was expected."""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any, NoReturn

import numpy as np

from ..errors import OpfusionError, ParseError
from .expr import Call, Constant, Expr, Function, GlobalVar, Tuple, TupleGetItem, Var
from .module import IRModule
from .op import Attrs, Op, get_op
from .printer import BARE_NAME, gc_paused
from .types import DTYPES, FuncType, TensorType, TupleType, Type

_NAME = r"[A-Za-z_][A-Za-z0-9_.]*"
_STRING = r'"(?:[^"\\\n]|\\.)*"'
_SUFFIX = r"(?:f16|f32|f64|f|i8|i16|i32|i64|u16|u32|u64|u8)"
# Ordered by how often each kind occurs; names come before numbers, so inff and nanf16 arrive
# as names and are recognized as numbers by _NUMBER.
_TOKEN = re.compile(
    r"\s*("
    rf"[%@](?:[0-9]+|{_NAME}|{_STRING})"                         # %0 %x %"a b" @main
    r"|[(),;=\[\]{}:.]"                                           # punctuation
    rf"|{_NAME}"                                                 # add nn.conv2d Tensor
    rf"|-?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|inf|nan){_SUFFIX}?(?![A-Za-z0-9_])"
    r"|->"
    rf"|{_STRING}"                                               # "NCHW"
    r"|\S)"                                                      # anything else: an error
)
_NUMBER = re.compile(
    r"(-?(?:[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?|inf|nan))(f16|f32|f64|f|i8|i16|i32|i64|u16|u32|u64|u8)?\Z")
_SUFFIX_DTYPE = {
    None: None, "f": "float32", "f32": "float32", "f16": "float16", "f64": "float64",
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8",
    "u16": "uint16", "u32": "uint32", "u64": "uint64",
}
_INDICES = re.compile(r"[0-9]+(\.[0-9]+)?\Z")
_INDEX = re.compile(r"-?[0-9]+\Z")
_NUMBER_START = frozenset("-0123456789")
_EOF = ""


def parse(text: str) -> IRModule:
    """Parse text IR (one or more ``def @name(...) {...}``, or a single ``fn (...) {...}``
    that becomes ``@main``) into a module. Raises :class:`ParseError` on bad input."""
    with gc_paused():
        parser = _Parser(text)
        try:
            return parser.module()
        except RecursionError:
            pass
    parser.error("the text nests too deeply to parse (calls, tuples or functions written "
                 "inside each other); bind inner values to temporaries instead")


_COMMENT_OR_STRING = re.compile(rf'({_STRING})|//[^\n]*|/\*[\s\S]*?\*/')
_NOT_NEWLINE = re.compile(r"[^\n]")


def _blank_comments(text: str) -> str:
    """``//`` and ``/* */`` comments (TVM's ``/* ty=... */`` too) replaced by spaces, keeping
    every other character where it was so that error positions stay exact."""
    if "//" not in text and "/*" not in text:
        return text
    return _COMMENT_OR_STRING.sub(
        lambda m: m.group(1) or _NOT_NEWLINE.sub(" ", m.group(0)), text)


class _Parser:
    def __init__(self, text: str) -> None:
        self.source = text
        self.text = text = _blank_comments(text)
        toks = _TOKEN.findall(text)
        self.meta: dict[int, Constant] | None = None
        end = _find_metadata(toks)
        if end is not None:
            self.toks = toks
            self.i = end + 4
            self.meta = self.metadata()
            toks = toks[:end]
        toks.append(_EOF)
        self.toks = toks
        self.i = 0
        # Lexical scopes, innermost last. Keys are the canonical tokens: "%x" (also written
        # %"x"), "%0" (a temporary), '%"a b"' and '%"0"' (quoted names).
        self.scopes: list[dict[str, Expr]] = []
        self.globals: dict[str, GlobalVar] = {}
        self.global_uses: dict[str, int] = {}
        self.ops: dict[str, Op] = {}
        self.attrs_cache: dict[Any, Attrs] = {}
        # A literal seen before is copied from its first Constant: same frozen array and type,
        # a distinct node (Constant() would check the dtype again, ~10 us a node).
        self.literal_cache: dict[Any, Constant] = {}
        self.default_attrs: dict[Op, Attrs] = {}

    # -- errors -------------------------------------------------------------------------
    def error(self, message: str, index: int | None = None) -> NoReturn:
        """Raise ParseError at token ``index`` (default: the current token)."""
        index = self.i if index is None else index
        pos = self.position(index)
        line = self.text.count("\n", 0, pos) + 1
        start = self.text.rfind("\n", 0, pos) + 1
        stop = self.source.find("\n", pos)
        source = self.source[start:] if stop < 0 else self.source[start:stop]
        raise ParseError(message, line, pos - start + 1, source)

    def position(self, index: int) -> int:
        """Character offset of token ``index`` (found again by re-scanning, errors only)."""
        count = -1
        last_end = 0
        for match in _TOKEN.finditer(self.text):
            count += 1
            if count == index:
                return match.start(1)
            last_end = match.end(1)
        return last_end

    def found(self, index: int | None = None) -> str:
        tok = self.toks[self.i if index is None else index]
        if tok == _EOF:
            return "end of input"
        if tok in ("/", '"'):
            return f"{tok!r} (an unterminated comment or string?)"
        return repr(tok if len(tok) <= 24 else tok[:21] + "...")

    def expect(self, tok: str, what: str) -> None:
        if self.toks[self.i] != tok:
            self.error(f"expected {tok!r} {what}, found {self.found()}")
        self.i += 1

    # -- module -------------------------------------------------------------------------
    def module(self) -> IRModule:
        toks = self.toks
        defs: list[tuple[GlobalVar, Function]] = []
        defined: dict[str, int] = {}
        while toks[self.i] != _EOF:
            tok = toks[self.i]
            if tok == "def":
                start = self.i + 1
                self.i += 1
                name = toks[self.i]
                if not name.startswith("@"):
                    self.error(f"expected a function name (@name) after 'def', found "
                               f"{self.found()}")
                key = self.global_key(name)
                if key in defined:
                    self.error(f"@{key} is defined twice", start)
                defined[key] = start
                gvar = self.global_var(key)
                self.i += 1
                defs.append((gvar, self.function("after the name of @" + key)))
            elif tok == "fn" and not defs and not defined:
                self.i += 1
                func = self.function("after 'fn'")
                if toks[self.i] != _EOF:
                    self.error(f"expected the end of input after the function, found "
                               f"{self.found()}")
                defs.append((self.global_var("main"), func))
                defined["main"] = 0
            elif tok == "#" and toks[self.i + 1] == "[":
                self.skip_directive()
            else:
                self.error(f"expected 'def @name(...)' or 'fn (...)', found {self.found()}")
        for key, index in self.global_uses.items():
            if key not in defined:
                known = ", ".join("@" + name for name in defined) or "none"
                self.error(f"unknown global function @{key} (defined: {known})", index)
        mod = IRModule()
        for gvar, func in defs:
            mod[gvar] = func
        return mod

    def skip_directive(self) -> None:
        """``#[version = "0.0.5"]`` as TVM prints it: skipped."""
        start = self.i
        while self.toks[self.i] not in ("]", _EOF):
            self.i += 1
        if self.toks[self.i] == _EOF:
            self.error("unterminated '#[' directive", start)
        self.i += 1

    def global_key(self, tok: str) -> str:
        if tok[1:2] != '"':
            if len(tok) < 2:
                self.error("expected a function name after '@'")
            return tok[1:]
        try:
            return json.loads(tok[1:])
        except ValueError:
            self.error(f"bad escape in the quoted name {tok}")

    def global_var(self, key: str) -> GlobalVar:
        gvar = self.globals.get(key)
        if gvar is None:
            gvar = self.globals[key] = GlobalVar(key)
        return gvar

    # -- functions ----------------------------------------------------------------------
    def function(self, where: str) -> Function:
        """``(params, Attr=value) -> ret { body }``; the current token is '('."""
        toks = self.toks
        self.expect("(", f"to open the parameter list {where}")
        scope: dict[str, Expr] = {}
        params: list[Var] = []
        attrs: dict[str, Any] = {}
        while toks[self.i] != ")":
            tok = toks[self.i]
            if tok.startswith("%"):
                start = self.i
                key, name = self.local_key(tok)
                if key in scope:
                    self.error(f"parameter %{name} is declared twice", start)
                self.i += 1
                self.expect(":", f"and a type after parameter %{name}")
                scope[key] = var = self.new_var(name, self.type(), start)
                params.append(var)
            elif _is_name(tok) and toks[self.i + 1] == "=":
                self.i += 2
                attrs[tok] = self.value()
            else:
                self.error(f"expected a parameter (%name: Type) or an attribute (Name=value), "
                           f"found {self.found()}")
            if toks[self.i] == ",":
                self.i += 1
            elif toks[self.i] != ")":
                self.error(f"expected ',' or ')' after a parameter, found {self.found()}")
        self.i += 1
        ret_type = None
        if toks[self.i] == "->":
            self.i += 1
            ret_type = self.type()
        self.expect("{", "to open the function body")
        self.scopes.append(scope)
        try:
            body = self.body()
        finally:
            self.scopes.pop()
        return Function(params, body, ret_type, attrs)

    def new_var(self, name: str, ty: Type, index: int) -> Var:
        try:
            return Var(name, ty)
        except OpfusionError as err:
            self.error(str(err), index)

    def body(self) -> Expr:
        """Bindings ``%N = expr;`` then the value and '}' (the '{' is consumed)."""
        toks = self.toks
        scope = self.scopes[-1]
        expr = self.expr
        while True:
            i = self.i
            tok = toks[i]
            if tok[:1] == "%" and toks[i + 1] == "=":
                key = tok if tok[1:2] != '"' else self.local_key(tok)[0]
                if key in scope:
                    self.error(f"{tok} is already bound in this function", i)
                self.i = i + 2
                value = expr()
                if toks[self.i] == ";":
                    self.i += 1
                elif toks[self.i - 1] != "}":  # TVM sometimes prints "%4 = fn (...) {...}" bare
                    self.error(f"expected ';' after the value bound to {tok}, found "
                               f"{self.found()}")
                scope[key] = value
            else:
                value = expr()
                if toks[self.i] != "}":
                    what = "';' after a binding or '}'" if toks[self.i] != "=" else "'}'"
                    self.error(f"expected {what} after the function's value, found "
                               f"{self.found()}")
                self.i += 1
                return value

    def local_key(self, tok: str) -> tuple[str, str]:
        """Scope key and name of a ``%`` token: ``%x`` and ``%"x"`` are the same variable;
        ``%0`` (a temporary) and ``%"0"`` (a variable named 0) are not."""
        if tok[1:2] != '"':
            if len(tok) < 2:
                self.error("expected a name after '%'")
            return tok, tok[1:]
        try:
            name = json.loads(tok[1:])
        except ValueError:
            self.error(f"bad escape in the quoted name {tok}")
        key = "%" + (name if BARE_NAME.match(name) else json.dumps(name, ensure_ascii=False))
        return key, name

    # -- expressions --------------------------------------------------------------------
    def expr(self) -> Expr:
        toks = self.toks
        i = self.i
        tok = toks[i]
        first = tok[:1]
        if first == "%":
            value = self.scopes[-1].get(tok)
            if value is None:
                value = self.lookup(tok, i)
            self.i = i + 1
        elif first.isalpha() or first == "_":
            if tok == "fn":
                self.i = i + 1
                value = self.function("after 'fn'")
            elif toks[i + 1] == "(":
                value = self.op_call(tok, i)
            elif tok == "meta":
                value = self.meta_ref()
            elif tok in ("True", "False") or _NUMBER.match(tok):  # also inff, nanf16
                value = self.scalar(tok, i)
                self.i = i + 1
            else:
                self.error(f"expected an expression, found {self.found(i)} (an operator call "
                           "needs its arguments in parentheses)", i)
        elif first.isdigit() or first == "-":
            value = self.scalar(tok, i)
            self.i = i + 1
        elif first == "(":
            value = self.tuple()
        elif first == "[":
            value = self.tensor_literal()
        elif first == "@":
            key = self.global_key(tok)
            self.global_uses.setdefault(key, i)
            value = self.global_var(key)
            self.i = i + 1
        else:
            self.error(f"expected an expression, found {self.found(i)}", i)
        # postfix: calls of a function value, tuple access
        while True:
            tok = toks[self.i]
            if tok == "(":
                start = self.i
                self.i += 1
                args, given = self.arguments()
                attrs = {name: item[0] for name, item in given.items()}
                try:
                    value = Call(value, args, attrs or None)
                except OpfusionError as err:
                    self.error(str(err), start)
            elif tok == ".":
                self.i += 1
                value = self.tuple_access(value)
            else:
                return value

    def lookup(self, tok: str, index: int) -> Expr:
        key = tok if tok[1:2] != '"' else self.local_key(tok)[0]
        scopes = self.scopes
        value = scopes[-1].get(key)
        if value is None:
            for scope in reversed(scopes[:-1]):
                value = scope.get(key)
                if value is not None:
                    break
            else:
                kind = "temporary" if tok[1:].isdigit() else "variable"
                self.error(f"unknown {kind} {tok}" + (" (temporaries are bound before use: "
                           f"'{tok} = ...;')" if kind == "temporary" else ""), index)
        return value

    def op_call(self, name: str, index: int) -> Call:
        op = self.ops.get(name)
        if op is None:
            try:
                op = self.ops[name] = get_op(name)
            except OpfusionError as err:
                self.error(str(err), index)
        self.i = index + 2
        args, given = self.arguments()
        attrs = self.op_attrs(op, given, index)
        return Call(op, args, attrs)

    def arguments(self) -> tuple[list[Expr], dict[str, Any]]:
        """``arg, ..., key=value, ...)`` (the '(' is consumed, the ')' too on return).
        Attribute values are returned as ``{key: (value, first token, end token)}``."""
        toks = self.toks
        args: list[Expr] = []
        attrs: dict[str, Any] = {}
        expr = self.expr
        scope = self.scopes[-1] if self.scopes else {}
        while toks[self.i] != ")":
            i = self.i
            tok = toks[i]
            after = toks[i + 1]
            if (after == "," or after == ")") and tok[:1] == "%" and not attrs:
                # the common operand, a lone %3 or %x, without the general expression path
                value = scope.get(tok)
                args.append(value if value is not None else self.lookup(tok, i))
                self.i = i + 1
            elif (after == "," or after == ")") and tok[:1] in _NUMBER_START and not attrs:
                args.append(self.scalar(tok, i))  # a lone 1f or 3i64
                self.i = i + 1
            elif after == "=" and _is_name(tok):
                if tok in attrs:
                    self.error(f"attribute {tok!r} is given twice", i)
                self.i = i + 2
                value = self.value()
                attrs[tok] = (value, i + 2, self.i)
            elif attrs:
                self.error(f"expected an attribute (name=value) after attribute "
                           f"{list(attrs)[-1]!r}; arguments come before attributes", i)
            else:
                args.append(expr())
            tok = toks[self.i]
            if tok == ",":
                self.i += 1
            elif tok != ")":
                self.error(f"expected ')' after call arguments, found {self.found()}")
        self.i += 1
        return args, attrs

    def op_attrs(self, op: Op, given: dict[str, Any], index: int) -> Attrs:
        """Validate through the declaration, once per distinct spelling of the attributes."""
        if not given:
            attrs = self.default_attrs.get(op)
            if attrs is None:
                try:
                    attrs = self.default_attrs[op] = op.make_attrs({})
                except OpfusionError as err:
                    self.error(str(err), index)
            return attrs
        toks = self.toks
        key = (op, tuple((name, tuple(toks[start:stop]))
                         for name, (_, start, stop) in given.items()))
        attrs = self.attrs_cache.get(key)
        if attrs is None:
            values = {name: value for name, (value, _, _) in given.items()}
            try:
                attrs = self.attrs_cache[key] = op.make_attrs(values)
            except OpfusionError as err:
                self.error(str(err), self.bad_attr_index(op, given, index))
        return attrs

    def bad_attr_index(self, op: Op, given: dict[str, Any], index: int) -> int:
        """The token to blame for a rejected set of attributes."""
        for name, (value, start, _) in given.items():
            spec = op.attrs.get(name)
            if spec is None:
                return start - 2
            try:
                spec.normalize(value, name)
            except OpfusionError:
                return start
        return index

    def tuple(self) -> Expr:
        """``()``, ``(a,)``, ``(a, b)`` or a parenthesized ``(a)``."""
        toks = self.toks
        self.i += 1
        fields: list[Expr] = []
        comma = False
        while toks[self.i] != ")":
            fields.append(self.expr())
            if toks[self.i] == ",":
                comma = True
                self.i += 1
            elif toks[self.i] != ")":
                self.error(f"expected ',' or ')' in a tuple, found {self.found()}")
        self.i += 1
        if len(fields) == 1 and not comma:
            return fields[0]
        return Tuple(fields)

    def tuple_access(self, value: Expr) -> Expr:
        """The index after '.': ``%3.0``; ``%3.0.1`` arrives as the number token ``0.1``."""
        tok = self.toks[self.i]
        parts = tok.split(".") if _INDICES.match(tok) else None
        if parts is None:
            if _INDEX.match(tok) is None:
                self.error(f"expected a field index after '.', found {self.found()}")
            parts = [tok]
        self.i += 1
        for part in parts:
            value = TupleGetItem(value, int(part))
        return value

    def meta_ref(self) -> Constant:
        """``meta[Constant][i]`` (TVM's ``meta[relay.Constant][i]`` too)."""
        start = self.i
        self.i += 1
        self.expect("[", "after 'meta'")
        if self.toks[self.i] not in ("Constant", "relay.Constant"):
            self.error(f"expected 'Constant' in meta[Constant][i], found {self.found()}")
        self.i += 1
        self.expect("]", "after meta[Constant")
        self.expect("[", "before the index of a meta constant")
        index = self.int_token("the index of a meta constant")
        self.expect("]", "after the index of a meta constant")
        if self.meta is None:
            self.error(f"meta[Constant][{index}] is used but the text has no #[metadata] "
                       "section; print the module with show_meta_data=True (the default) to "
                       "include its constants", start)
        const = self.meta.get(index)
        if const is None:
            self.error(f"the #[metadata] section has no Constant[{index}]", start)
        return const

    def int_token(self, what: str) -> int:
        tok = self.toks[self.i]
        if not tok.isdigit():
            self.error(f"expected {what} (an integer), found {self.found()}")
        self.i += 1
        return int(tok)

    # -- literals -----------------------------------------------------------------------
    def scalar(self, tok: str, index: int) -> Constant:
        template = self.literal_cache.get(tok)
        if template is None:
            dtype, value = self.number(tok, index)
            template = self.literal_cache[tok] = Constant(self.frozen(value, dtype, index))
            return template
        return Constant(template.data)  # the frozen array is shared, not copied

    def number(self, tok: str, index: int) -> tuple[str, Any]:
        """The dtype and Python value of a literal: ``0.5f``, ``3i64``, ``True``, ``nanf``."""
        if tok in ("True", "False"):
            return "bool", tok == "True"
        match = _NUMBER.match(tok)
        if match is None:
            self.error(f"expected a number, found {self.found(index)}", index)
        body, fraction, exponent, suffix = match.groups()
        is_float = bool(fraction or exponent) or body.lstrip("-") in ("inf", "nan")
        dtype = _SUFFIX_DTYPE[suffix] or ("float32" if is_float else "int32")
        if dtype.startswith("float"):
            return dtype, float(body)
        if is_float:
            self.error(f"{tok} is not an integer but has the integer suffix {suffix!r}", index)
        return dtype, int(body)

    def frozen(self, values: Any, dtype: str, index: int) -> np.ndarray:
        try:
            with np.errstate(over="raise"):
                array = np.array(values, dtype=dtype)
        except (OverflowError, FloatingPointError, ValueError) as err:
            self.error(f"the literal does not fit in {dtype} ({err})", index)
        array.setflags(write=False)
        return array

    def tensor_literal(self) -> Constant:
        """``[[1f, 2f], [3f, 4f]]``: one dtype throughout, shape from the nesting."""
        start = self.i
        key = None
        stop = self.literal_end(start)
        if stop is not None:
            key = tuple(self.toks[start:stop])
            template = self.literal_cache.get(key)
            if template is not None:
                self.i = stop
                return Constant(template.data)  # the frozen array is shared, not copied
        leaves: list[tuple[int, str]] = []
        shape = self.literal_level(leaves)
        dtypes = set()
        values = []
        for index, tok in leaves:
            dtype, value = self.number(tok, index)
            dtypes.add(dtype)
            if len(dtypes) > 1:
                self.error(f"a tensor literal has one dtype; {tok} is {dtype} but an earlier "
                           f"element is {sorted(dtypes - {dtype})[0]}", index)
            values.append(value)
        if not values:
            self.error("an empty tensor literal has no dtype; zero-size constants are written "
                       "as meta[Constant][i]", start)
        array = self.frozen(values, dtypes.pop(), start).reshape(shape)
        array.setflags(write=False)
        const = Constant(array)
        if key is not None:
            self.literal_cache[key] = const
        return const

    def literal_end(self, start: int) -> int | None:
        """The index after the ']' closing a flat literal ``[a, b, ...]``; None if nested."""
        toks = self.toks
        i = start + 1
        while True:
            tok = toks[i]
            if tok in ("[", _EOF):
                return None
            i += 1
            if tok == "]":
                return i

    def literal_level(self, leaves: list[tuple[int, str]]) -> tuple[int, ...]:
        toks = self.toks
        self.expect("[", "to open a tensor literal")
        inner: tuple[int, ...] | None = None  # shape of each element: () for numbers
        count = 0
        while toks[self.i] != "]":
            at = self.i
            tok = toks[at]
            if tok == "[":
                shape = self.literal_level(leaves)
            elif tok in (",", _EOF):
                self.error(f"expected a number in a tensor literal, found {self.found()}")
            else:
                leaves.append((at, tok))
                self.i += 1
                shape = ()
            if inner is not None and shape != inner:
                self.error(f"ragged tensor literal: an element of shape {shape} after elements "
                           f"of shape {inner}", at)
            inner = shape
            count += 1
            if toks[self.i] == ",":
                self.i += 1
            elif toks[self.i] != "]":
                self.error(f"expected ',' or ']' in a tensor literal, found {self.found()}")
        self.i += 1
        return (count, *(inner or ()))

    def value(self) -> Any:
        """An attribute value: number, string, True/False/None, or a list of values."""
        toks = self.toks
        tok = toks[self.i]
        first = tok[:1]
        if first == '"':
            try:
                value: Any = json.loads(tok)
            except ValueError:
                self.error(f"bad escape in the string {tok}")
        elif first.isdigit() or first == "-" or _NUMBER.match(tok):
            dtype, value = self.number(tok, self.i)
        elif tok in ("True", "False", "None"):
            value = {"True": True, "False": False, "None": None}[tok]
        elif tok == "[":
            self.i += 1
            items = []
            while toks[self.i] != "]":
                items.append(self.value())
                if toks[self.i] == ",":
                    self.i += 1
                elif toks[self.i] != "]":
                    self.error(f"expected ',' or ']' in a list, found {self.found()}")
            self.i += 1
            return tuple(items)
        else:
            self.error(f"expected an attribute value (a number, \"string\", True, False, None "
                       f"or [list]), found {self.found()}")
        self.i += 1
        return value

    # -- types --------------------------------------------------------------------------
    def type(self) -> Type:
        """``Tensor[(1, 3), float32]``, ``float32`` (a scalar), ``(T, U)``, ``fn (T) -> U``."""
        toks = self.toks
        start = self.i
        tok = toks[start]
        self.i += 1
        if tok == "Tensor":
            self.expect("[", "after 'Tensor'")
            self.expect("(", "to open the shape in Tensor[(...), dtype]")
            shape = []
            while toks[self.i] != ")":
                shape.append(self.int_token("a dimension"))
                if toks[self.i] == ",":
                    self.i += 1
                elif toks[self.i] != ")":
                    self.error(f"expected ',' or ')' in a shape, found {self.found()}")
            self.i += 1
            self.expect(",", "and a dtype after the shape in Tensor[(...), dtype]")
            dtype = toks[self.i]
            if dtype not in DTYPES:
                self.error(f"expected a dtype ({', '.join(DTYPES)}), found {self.found()}")
            self.i += 1
            self.expect("]", "to close Tensor[...]")
            return TensorType(shape, dtype)
        if tok in DTYPES:
            return TensorType((), tok)
        if tok == "(":
            fields = []
            while toks[self.i] != ")":
                fields.append(self.type())
                if toks[self.i] == ",":
                    self.i += 1
                elif toks[self.i] != ")":
                    self.error(f"expected ',' or ')' in a tuple type, found {self.found()}")
            self.i += 1
            return TupleType(fields)
        if tok == "fn":
            self.expect("(", "after 'fn' in a function type")
            args = []
            while toks[self.i] != ")":
                args.append(self.type())
                if toks[self.i] == ",":
                    self.i += 1
                elif toks[self.i] != ")":
                    self.error(f"expected ',' or ')' in a function type, found {self.found()}")
            self.i += 1
            self.expect("->", "and a return type in a function type")
            return FuncType(args, self.type())
        self.error(f"expected a type (Tensor[(...), dtype], a tuple or fn (...) -> T), found "
                   f"{self.found(start)}", start)

    # -- metadata -----------------------------------------------------------------------
    def metadata(self) -> dict[int, Constant]:
        """``Constant[i] = Tensor[(...), dtype] "<base64 little-endian bytes>"`` lines."""
        toks = self.toks
        toks.append(_EOF)
        constants: dict[int, Constant] = {}
        while toks[self.i] != _EOF:
            if toks[self.i] not in ("Constant", "relay.Constant"):
                self.error(f"expected 'Constant[i] = Type \"data\"' in the metadata section, "
                           f"found {self.found()}")
            self.i += 1
            self.expect("[", "after 'Constant'")
            at = self.i
            index = self.int_token("a constant index")
            if index in constants:
                self.error(f"Constant[{index}] is defined twice", at)
            self.expect("]", "after the constant index")
            self.expect("=", "after Constant[i]")
            at = self.i
            ty = self.type()
            if not isinstance(ty, TensorType):
                self.error(f"a meta constant must be a tensor, got {ty!r}", at)
            tok = toks[self.i]
            if not tok.startswith('"'):
                self.error(f"expected the constant's data as a \"base64\" string, found "
                           f"{self.found()}")
            try:
                raw = base64.b64decode(tok[1:-1], validate=True)
            except (binascii.Error, ValueError):
                self.error(f"Constant[{index}]'s data is not valid base64")
            dtype = np.dtype(ty.dtype).newbyteorder("<")
            if len(raw) != ty.size * dtype.itemsize:
                self.error(f"Constant[{index}] has {len(raw)} bytes of data but {ty!r} needs "
                           f"{ty.size * dtype.itemsize}")
            self.i += 1
            array = np.frombuffer(raw, dtype=dtype).astype(ty.dtype).reshape(ty.shape)
            array.setflags(write=False)
            constants[index] = Constant(array)
        toks.pop()
        return constants


def _find_metadata(toks: list[str]) -> int | None:
    """Index of the ``#`` of ``#[metadata]``, if the text has that section."""
    start = 0
    while True:
        try:
            start = toks.index("#", start)
        except ValueError:
            return None
        if toks[start + 1:start + 4] == ["[", "metadata", "]"]:
            return start
        start += 1


def _is_name(tok: str) -> bool:
    return tok[:1].isalpha() or tok[:1] == "_"
