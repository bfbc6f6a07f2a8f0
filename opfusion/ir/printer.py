"""The text form of the graph IR, in TVM's style, and the printer that writes it.

    def @main(%x: Tensor[(1, 3, 16, 16), float32], %weight: Tensor[(3, 3, 3, 3), float32]) {
      %0 = nn.conv2d(%x, %weight, padding=[0, 0, 0, 0]);
      %1 = add(%0, meta[Constant][0]);
      nn.relu(%1)
    }

Every call, tuple, tuple access and nested function is bound to a numbered temporary in
post-order (numbering restarts in each function body); the body's value is the last line.
Scalars and tensors of up to eight elements are written inline with a dtype suffix (``0.5f``,
``3i64``, ``[1f, 2f]``); larger constants are ``meta[Constant][i]`` and their bytes follow in
a ``#[metadata]`` section, so :func:`opfusion.ir.parser.parse` rebuilds the module exactly.

Variables keep their names, quoted when they are not plain identifiers (``%"input:0"``) and
suffixed when two in scope would read alike (``%x``, ``%x_1``). A nested function that uses a
value computed outside it repeats that computation in its own body: its temporaries are
numbered afresh, so it cannot name the outer ones (structure is kept, that sharing is not)."""

from __future__ import annotations

import base64
import gc
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..errors import OpfusionError
from .expr import Call, Constant, Expr, Function, GlobalVar, Tuple, TupleGetItem, Var
from .module import IRModule
from .op import Attrs, Op
from .visitor import post_order

#: Names that print without quotes after ``%`` or ``@``; anything else is quoted.
BARE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
#: Constants with at most this many elements (and at least one) are written inline.
INLINE_MAX_SIZE = 8
#: ... and at most this many dimensions, so an inline literal never nests deeply.
INLINE_MAX_NDIM = 8

#: Suffix of an inline scalar by dtype; bool is written True/False.
DTYPE_SUFFIX = {
    "float32": "f", "float64": "f64", "float16": "f16", "int32": "", "int64": "i64",
    "int8": "i8", "int16": "i16", "uint8": "u8", "uint16": "u16", "uint32": "u32",
    "uint64": "u64", "bool": "",
}

METADATA_HEADER = "#[metadata]"
METADATA_OMITTED = "// meta data omitted; print with show_meta_data=True to include it"


def astext(obj: IRModule | Expr, show_meta_data: bool = True) -> str:
    """The text form of a module (``def @name(...) {...}`` per function) or of an expression
    (a function prints as ``fn (...) {...}``; any other expression as its bindings and value,
    its free variables by name).

    With ``show_meta_data`` the large constants' bytes follow in a ``#[metadata]`` section;
    without it a comment says they were left out, and the text no longer parses."""
    printer = _Printer()
    with gc_paused():
        if isinstance(obj, IRModule):
            text = "\n\n".join(printer.function(func, f"def {_global_name(name)}", "")
                               for name, func in obj.functions.items())
        elif isinstance(obj, Function):
            text = printer.function(obj, "fn ", "")
        elif isinstance(obj, Expr):
            lines: list[str] = []
            printer.body(obj, "", lines)
            text = "\n".join(lines)
        else:
            raise OpfusionError(f"astext prints an IRModule or an expression, got "
                                f"{type(obj).__name__}")
        return text + printer.metadata(show_meta_data)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector while a graph is printed or parsed.

    Both make ~10^5 container objects that stay alive (nodes, the traversal's tuples), and
    the collections their allocation triggers rescan them all again and again: about a third
    of the time. The nodes form no reference cycles, so the deferred collection loses nothing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Printer:
    """State shared by the functions of one printout: variable names and meta constants."""

    def __init__(self) -> None:
        self.meta: dict[Constant, int] = {}
        self.var_names: dict[Var, str] = {}
        # Names bound by each enclosing function (outermost first; [0] holds free variables).
        self.scopes: list[set[str]] = [set()]
        self.attr_texts: dict[Any, str] = {}
        self.scalar_texts: dict[tuple[str, bytes], str] = {}
        self.op_defaults: dict[Op, dict[str, Any]] = {}

    # -- functions and bodies -----------------------------------------------------------
    def function(self, func: Function, head: str, indent: str) -> str:
        """``head(params, Attr=v) -> ret {`` body ``}``; the body is indented one step more
        than ``indent`` and the closing brace sits at ``indent``."""
        scope: set[str] = set()
        self.scopes.append(scope)
        try:
            params = [f"{self.bind_var(param, scope)}: {param.type_annotation!r}"
                      for param in func.params]
            params += [f"{key}={format_value(value)}" for key, value in func.attrs.items()]
            ret = "" if func.ret_type is None else f" -> {func.ret_type!r}"
            lines = [f"{head}({', '.join(params)}){ret} {{"]
            self.body(func.body, indent + "  ", lines)
            lines.append(indent + "}")
        finally:
            self.scopes.pop()
        return "\n".join(lines)

    def bind_var(self, var: Var, scope: set[str]) -> str:
        """Name ``var`` in ``scope``, avoiding every name visible there (``%x``, ``%x_1``)."""
        base = name = var.name_hint
        suffix = 0
        while any(name in names for names in self.scopes):
            suffix += 1
            name = f"{base}_{suffix}"
        scope.add(name)
        text = self.var_names[var] = "%" + _quote_name(name)
        return text

    def body(self, expr: Expr, indent: str, lines: list[str]) -> None:
        """Append the bindings of ``expr`` and, last, its value to ``lines``."""
        # Reference text of every node printed so far in this body: "%3", "%x", "1f".
        memo: dict[Expr, str] = {}
        ref = self.ref
        count = 0
        for node in post_order(expr, into_functions=False):
            kind = type(node)
            if kind is Call:
                op = node.op
                if isinstance(op, Op):
                    head = op.name
                    extra = self.op_attr_text(op, node.attrs) if node.attrs else ""
                else:
                    if isinstance(op, Function) and op not in memo:
                        # A called function is bound just before its (first) call.
                        text = self.function(op, "fn ", indent)
                        lines.append(f"{indent}%{count} = {text};")
                        memo[op] = f"%{count}"
                        count += 1
                    head = ref(op, memo)
                    extra = "".join(f", {key}={format_value(value)}"
                                    for key, value in node.attrs.items())
                args = ", ".join([memo[arg] if arg in memo else ref(arg, memo)
                                  for arg in node.args])
                if extra and not args:
                    extra = extra[2:]
                text = f"{head}({args}{extra})"
            elif kind is Tuple:
                fields = [ref(field, memo) for field in node.fields]
                text = f"({fields[0]},)" if len(fields) == 1 else f"({', '.join(fields)})"
            elif kind is TupleGetItem:
                value = node.tuple_value
                target = ref(value, memo)
                if isinstance(value, Var) and not target.startswith('%"'):
                    # %x.0 would read as a variable named "x.0"; quote the name instead.
                    target = "%" + json.dumps(target[1:])
                text = f"{target}.{node.index}"
            elif kind is Function:
                text = self.function(node, "fn ", indent)
            else:
                continue  # variables and constants are written where they are used
            if node is expr:
                lines.append(indent + text)
                return
            lines.append(f"{indent}%{count} = {text};")
            memo[node] = f"%{count}"
            count += 1
        lines.append(indent + ref(expr, memo))

    def ref(self, node: Expr, memo: dict[Expr, str]) -> str:
        """How an operand is written: its temporary, its name or its literal."""
        text = memo.get(node)
        if text is not None:
            return text
        if isinstance(node, Var):
            text = self.var_names.get(node)
            if text is None:  # a free variable: named once, outside every function
                text = self.bind_var(node, self.scopes[0])
        elif isinstance(node, Constant):
            text = self.constant(node)
        elif isinstance(node, GlobalVar):
            text = _global_name(node.name_hint)
        else:  # pragma: no cover - post_order lists every other operand before its user
            raise AssertionError(f"{node!r} was not printed before its use")
        memo[node] = text
        return text

    # -- constants ----------------------------------------------------------------------
    def constant(self, const: Constant) -> str:
        data = const.data
        if data.ndim == 0:
            # Cached by value: graphs repeat a few scalars (1f, 0.5f) many times over.
            key = (data.dtype.str, data.tobytes())
            text = self.scalar_texts.get(key)
            if text is None:
                dtype = const.checked_type.dtype  # type: ignore[attr-defined]
                text = self.scalar_texts[key] = format_scalar(data[()], dtype)
            return text
        if 0 < data.size <= INLINE_MAX_SIZE and data.ndim <= INLINE_MAX_NDIM:
            return _inline_tensor(data)
        index = self.meta.get(const)
        if index is None:
            index = self.meta[const] = len(self.meta)
        return f"meta[Constant][{index}]"

    def metadata(self, show: bool) -> str:
        if not self.meta:
            return ""
        if not show:
            return "\n\n" + METADATA_OMITTED
        lines = ["", "", METADATA_HEADER]
        for const, index in self.meta.items():
            data = const.data
            raw = np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<")).tobytes()
            encoded = base64.b64encode(raw).decode("ascii")
            lines.append(f"Constant[{index}] = {const.checked_type!r} \"{encoded}\"")
        return "\n".join(lines)

    # -- attributes ---------------------------------------------------------------------
    def op_attr_text(self, op: Op, attrs: Attrs) -> str:
        """``, key=value`` for the attributes a reader needs: those that differ from the
        declared default or are declared ``always_print``. Cached per distinct attrs."""
        try:
            key = (op, attrs, tuple(type(value) for value in attrs.values()))
            text = self.attr_texts.get(key)
        except TypeError:  # an unhashable value in hand-made Attrs
            key, text = None, None
        if text is None:
            text = "".join(f", {name}={format_value(value)}"
                           for name, value in self.shown_attrs(op, attrs).items())
            if key is not None:
                self.attr_texts[key] = text
        return text

    def shown_attrs(self, op: Op, attrs: Attrs) -> dict[str, Any]:
        defaults = self.op_defaults.get(op)
        if defaults is None:
            defaults = self.op_defaults[op] = _declared_defaults(op)
        shown = {}
        for name, value in attrs.items():
            spec = op.attrs.get(name)
            if (spec is None or spec.always_print or name not in defaults
                    or type(value) is not type(defaults[name]) or value != defaults[name]):
                shown[name] = value
        # The parser fills defaults back in through the declaration; if that would not give
        # these attrs again (a cross-attribute rule, or attrs that never were valid), print all.
        try:
            rebuilt = op.make_attrs(shown)
        except OpfusionError:
            return dict(attrs)
        return shown if rebuilt == attrs else dict(attrs)


def _declared_defaults(op: Op) -> dict[str, Any]:
    """The normalized value each attribute of ``op`` takes when it is not given."""
    try:
        return dict(op.make_attrs({}))
    except OpfusionError:  # some attribute is required: take the others one by one
        pass
    defaults = {}
    for name, spec in op.attrs.items():
        if spec.required:
            continue
        try:
            defaults[name] = None if spec.default is None else spec.normalize(spec.default, name)
        except OpfusionError:
            continue
    return defaults


# ---------------------------------------------------------------------------------------------
# literals


def format_scalar(value: Any, dtype: str) -> str:
    """One element with its dtype suffix: ``0.5f``, ``1f``, ``nanf``, ``3i64``, ``True``.

    Floats use the shortest digits that read back to the same value of *that* dtype."""
    if dtype == "bool":
        return "True" if value else "False"
    if dtype.startswith("float"):
        text = str(value)  # NumPy's shortest round-trip repr for the scalar's own precision
        if text.endswith(".0"):
            text = text[:-2]
        return text + DTYPE_SUFFIX[dtype]
    return f"{int(value)}{DTYPE_SUFFIX[dtype]}"


def _inline_tensor(data: np.ndarray) -> str:
    """``[[1f, 2f], [3f, 4f]]``: nested lists of scalars; the nesting gives the shape."""
    dtype = str(data.dtype)
    items = [format_scalar(value, dtype) for value in data.flat]
    for dim in reversed(data.shape):
        items = ["[" + ", ".join(items[start:start + dim]) + "]"
                 for start in range(0, len(items), dim)]
    return items[0]


def format_value(value: Any) -> str:
    """An attribute value: ``1``, ``0.5``, ``True``, ``"NCHW"``, ``None``, ``[1, 2]``."""
    if value is None:
        return "None"
    if isinstance(value, (bool, np.bool_)):
        return "True" if value else "False"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(format_value(item) for item in value) + "]"
    return repr(value)  # not a value the text form knows; shown for reading, not parsing


def _quote_name(name: str) -> str:
    return name if BARE_NAME.match(name) else json.dumps(name, ensure_ascii=False)


def _global_name(name: str) -> str:
    return "@" + _quote_name(name)
