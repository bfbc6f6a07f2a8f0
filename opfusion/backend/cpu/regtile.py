"""Register tiles: an accumulation nest emitted with its accumulators in named vector variables.

The schedules of convolution and the matrix products end in a nest like::

    for rc:                       # reduction loops (serial): the accumulator does not move
      for ry:
        for o in 0..4 (unrolled): # the register tile: constant extents
          for x in 0..16 (vectorized):
            acc[o, x] = acc[o, x] + in[rc, ry, x] * w[o, rc, ry]

Left to GCC, such a nest runs at 40-60% of the FMA peak: it keeps the accumulators in
registers, but it folds the loads of ``in`` into each multiply-add as a memory operand, so the
same vector is loaded once per output channel, and the nest becomes load-bound. Here the nest
is written as the hand-tuned kernels are written: one vector variable per accumulator vector,
loaded before the reduction loops and stored after them; inside, each distinct operand load
once (a vector load used several times is pinned in a register with an empty ``asm``, which
keeps GCC from re-folding it), then one multiply-add statement per accumulator. On a
3x3 convolution that is 1.7x faster.

A nest qualifies when, walking down from a loop: the loops are perfectly nested; the innermost
is a VECTORIZED loop that the vector emitter can plan, whose body is one store
``buf[i] = f(buf[i], ...)`` (its only read of ``buf``, at the same indices); the loops just above
it are UNROLLED with constant bounds (the tile), and above those at least one SERIAL or
UNROLLED loop (the reduction) whose variable ``i`` does not use; ``i`` is linear in the tile's
variables, and distinct tile points store to disjoint vectors. The values and their order of
accumulation are those of the loop nest, so the result is bit-identical."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..tir import expr as E
from ..tir import stmt as S
from ..tir.simplify import linear_form, simplify
from .c_names import c_type
from .c_vector import (
    _SCALAR,
    VectorPlan,
    _Analysis,
    _flatten,
    _value_nodes,
    plan_vector_loop,
)

if TYPE_CHECKING:
    from .c import CEmitter

#: Most accumulator vectors a tile may hold (16 vector registers on AVX2; the rest spill).
MAX_TILE_VECTORS = 24

_PIN_HELPER = (
    "#if defined(__GNUC__) && defined(__AVX__)\n"
    '#define OPF_PIN(v) __asm__("" : "+x"(v))\n'
    "#else\n"
    "#define OPF_PIN(v) ((void)0)\n"
    "#endif"
)


@dataclass(frozen=True)
class RegisterTilePlan:
    """An accumulation nest to emit as a register tile (see the module docstring)."""

    reduce_loops: tuple[S.For, ...]
    tile_loops: tuple[S.For, ...]
    vector_loop: S.For
    vector: VectorPlan
    store: S.BufferStore
    self_load: E.BufferLoad


def _chain(loop: S.For) -> list[S.For]:
    """The perfectly nested loops from ``loop`` down to the first VECTORIZED one."""
    chain: list[S.For] = []
    stmt: S.Stmt = loop
    while isinstance(stmt, S.For):
        chain.append(stmt)
        if stmt.kind is S.ForKind.VECTORIZED:
            return chain
        stmt = stmt.body
    return []


def _is_const_loop(loop: S.For) -> bool:
    return isinstance(loop.min, E.IntImm) and isinstance(loop.extent, E.IntImm)


def _uses(expr: E.PrimExpr, variables: list[E.Var]) -> bool:
    ids = {id(v) for v in variables}
    return any(id(v) in ids for v in E.free_vars(expr))


def _self_load(store: S.BufferStore) -> E.BufferLoad | None:
    """The value's one read of the stored buffer, if it reads it exactly once at the store's
    indices (None otherwise)."""
    found: list[E.BufferLoad] = []
    for node in E.post_order(store.value):
        if isinstance(node, E.BufferLoad) and node.buffer is store.buffer:
            found.append(node)
    if len(found) != 1:
        return None
    load = found[0]
    if len(load.indices) != len(store.indices):
        return None
    for a, b in zip(load.indices, store.indices):
        if a is not b:
            difference = simplify(E.sub(a, b))
            if not (isinstance(difference, E.IntImm) and difference.value == 0):
                return None
    return load


def _tile_coefficients(offset: E.PrimExpr, tile_vars: list[E.Var]) -> dict[int, int] | None:
    """The coefficient of each tile variable (by id) in ``offset``, or None when a tile
    variable appears inside a non-linear term."""
    ids = {id(v) for v in tile_vars}
    coefs: dict[int, int] = {}
    for coef, atom in linear_form(offset).terms.values():
        if isinstance(atom, E.Var) and id(atom) in ids:
            coefs[id(atom)] = coefs.get(id(atom), 0) + coef
        elif _uses(atom, tile_vars):
            return None
    return coefs


def _disjoint_vectors(offset: E.PrimExpr, tile_vars: list[E.Var],
                      points: list[dict[E.Var, int]], lanes: int) -> bool:
    """Whether every tile point stores to its own ``lanes`` elements: ``offset`` linear in the
    tile variables, and the points' offsets at least ``lanes`` apart."""
    coefs = _tile_coefficients(offset, tile_vars)
    if coefs is None:
        return False
    starts = sorted(sum(coefs.get(id(v), 0) * value for v, value in point.items())
                    for point in points)
    return all(b - a >= lanes for a, b in zip(starts, starts[1:]))


def plan_register_tile(loop: S.For, vector_bytes: int,
                       stream_buffers: set[int]) -> RegisterTilePlan | None:
    """A register-tile plan for the nest starting at ``loop``, or None if it does not qualify."""
    chain = _chain(loop)
    if len(chain) < 2:
        return None
    # The cheap structural checks first: every loop of a nest down to a vectorized one is
    # offered here, outermost first, and only the first qualifying one is planned.
    vector_loop = chain[-1]
    body = _flatten(vector_loop.body)
    if body is None or len(body) != 1 or not isinstance(body[0], S.BufferStore):
        return None
    store = body[0]
    offset = store.buffer.offset_of(store.indices)
    # The tile: the unrolled constant loops just above the vector loop whose variables the
    # stored index uses; every loop above them is a reduction loop and must not be used.
    split = len(chain) - 1
    while split > 0 and chain[split - 1].kind is S.ForKind.UNROLLED and _is_const_loop(
            chain[split - 1]) and _uses(offset, [chain[split - 1].loop_var]):
        split -= 1
    reduce_loops, tile_loops = chain[:split], chain[split:-1]
    if not reduce_loops or any(r.kind not in (S.ForKind.SERIAL, S.ForKind.UNROLLED)
                               for r in reduce_loops):
        return None
    if _uses(offset, [r.loop_var for r in reduce_loops]):
        return None
    # The lanes' variable may appear only inside load indices (a ramp value would be lost).
    if any(n is vector_loop.loop_var or isinstance(n, E.Let)
           for n in _value_nodes(store.value)):
        return None
    self_load = _self_load(store)
    if self_load is None:
        return None
    vector = plan_vector_loop(vector_loop, vector_bytes, stream_buffers)
    if vector is None or vector.streams:
        return None
    points = _tile_points(tile_loops, vector_loop, vector.lanes)
    if len(points) > MAX_TILE_VECTORS:
        return None
    tile_vars = [t.loop_var for t in tile_loops] + [vector_loop.loop_var]
    if not _disjoint_vectors(offset, tile_vars, points, vector.lanes):
        return None
    return RegisterTilePlan(tuple(reduce_loops), tuple(tile_loops), vector_loop, vector, store,
                            self_load)


def _tile_points(tile_loops: list[S.For] | tuple[S.For, ...], vector_loop: S.For,
                 lanes: int) -> list[dict[E.Var, int]]:
    """Every (tile loop values, first lane of a vector chunk) of the tile, in loop order; the
    vector loop's value is relative to its start."""
    ranges = [range(t.min.value, t.min.value + t.extent.value) for t in tile_loops]
    ranges.append(range(0, vector_loop.extent.value, lanes))
    variables = [t.loop_var for t in tile_loops] + [vector_loop.loop_var]
    return [dict(zip(variables, values)) for values in itertools.product(*ranges)]


class RegisterTileEmitter:
    """Writes one :class:`RegisterTilePlan` into a :class:`CEmitter`."""

    def __init__(self, emitter: CEmitter, plan: RegisterTilePlan) -> None:
        self.c = emitter
        self.plan = plan
        self.lanes = plan.vector.lanes
        self.dtype = plan.store.buffer.dtype
        #: per accessed (buffer, indices): the offset, its tile coefficients, its base text
        self._linear: dict[tuple[int, ...], tuple[E.PrimExpr, dict[int, int] | None, str]] = {}

    def _at(self, expr: E.PrimExpr, point: dict[E.Var, int]) -> E.PrimExpr:
        vector_loop = self.plan.vector_loop
        mapping: dict[E.Var, E.PrimExpr] = {}
        for var, value in point.items():
            if var is vector_loop.loop_var:
                mapping[var] = E.add(vector_loop.min, E.IntImm(value, var.dtype))
            else:
                mapping[var] = E.IntImm(value, var.dtype)
        return simplify(E.substitute(expr, mapping))

    def _offset(self, buffer: E.Buffer, indices: tuple[E.PrimExpr, ...],
                point: dict[E.Var, int]) -> str:
        """C text of the flat offset of ``buffer[indices]`` at a tile point: the offset at the
        tile's first point plus a constant, when it is linear in the tile's variables."""
        key = (id(buffer), *(id(i) for i in indices))
        entry = self._linear.get(key)
        if entry is None:
            offset = self.c.offset(buffer, indices)
            coefs = _tile_coefficients(offset, list(point))
            base = self.c.expr(self._at(offset, dict.fromkeys(point, 0)))
            entry = self._linear[key] = (offset, coefs, base)
        offset, coefs, base = entry
        if coefs is None:
            return self.c.expr(self._at(offset, point))
        delta = sum(coefs.get(id(v), 0) * value for v, value in point.items())
        return base if delta == 0 else f"({base} + {delta})"

    def _address(self, buffer: E.Buffer, indices: tuple[E.PrimExpr, ...],
                 point: dict[E.Var, int]) -> str:
        return f"&{self.c.buffer_name(buffer)}[{self._offset(buffer, indices, point)}]"

    def emit(self, indent: int) -> None:
        c, plan = self.c, self.plan
        vector = c._vector
        vt = vector.vtype(self.dtype, self.lanes)
        load = vector.helper("load", self.dtype, self.lanes)
        store = vector.helper("store", self.dtype, self.lanes)
        points = _tile_points(plan.tile_loops, plan.vector_loop, self.lanes)
        c.line(indent, "{")
        indent += 1
        registers: list[E.Var] = []
        for point in points:
            register = E.Var("acc", self.dtype)
            registers.append(register)
            address = self._address(plan.store.buffer, plan.store.indices, point)
            c.line(indent, f"{vt} {c.bind_var(register)} = {load}({address});")
        for loop in plan.reduce_loops:
            c.open_loop(loop, indent)
            indent += 1
        temps = self._emit_products(points, registers, indent)
        for loop in reversed(plan.reduce_loops):
            indent -= 1
            c.line(indent, "}")
            c.unbind_var(loop.loop_var)
        for var in temps:
            c.unbind_var(var)
        for point, register in zip(points, registers):
            address = self._address(plan.store.buffer, plan.store.indices, point)
            c.line(indent, f"{store}({address}, {c.var_name(register)});")
            c.unbind_var(register)
        c.line(indent - 1, "}")

    def _emit_products(self, points: list[dict[E.Var, int]], registers: list[E.Var],
                       indent: int) -> list[E.Var]:
        """The body of the reduction loops: the operand loads (each distinct one once), then one
        update per accumulator. Returns the temporaries it bound."""
        c, plan = self.c, self.plan
        vector = c._vector
        analysis = _Analysis(plan.vector_loop)
        kind = analysis.value(plan.store.value)
        assert kind is not None and kind[0] == "vector"
        operands = [n for n in _value_nodes(plan.store.value)
                    if isinstance(n, E.BufferLoad) and n is not plan.self_load]
        # (text of the load at a point) -> temporary; and each point's replacements
        temp_of: dict[str, E.Var] = {}
        uses: dict[str, int] = {}
        texts: dict[str, tuple[str, bool]] = {}
        per_point: list[list[str]] = []
        for point in points:
            keys = []
            for node in operands:
                is_vector = analysis.kinds[id(node)] != _SCALAR
                offset = self._offset(node.buffer, node.indices, point)
                at = f"{c.buffer_name(node.buffer)}[{offset}]"
                key = ("v" if is_vector else "s") + at
                keys.append(key)
                uses[key] = uses.get(key, 0) + 1
                texts.setdefault(key, (at, is_vector))
            per_point.append(keys)
        pinned = any(is_vector and uses[key] > 1 for key, (_, is_vector) in texts.items())
        if pinned:
            c.need_helper("0_opf_pin", _PIN_HELPER)
        bound: list[E.Var] = []
        # The updates' analysis: registers and vector temporaries are vectors, the rest
        # (scalar temporaries, constants) broadcast.
        tile_analysis = _Analysis(plan.vector_loop)
        tile_analysis.vector_lets = {id(r) for r in registers}
        tile_analysis.dependent |= tile_analysis.vector_lets
        for point, keys, register in zip(points, per_point, registers):
            mapping: dict[int, E.PrimExpr] = {id(plan.self_load): register}
            for node, key in zip(operands, keys):
                if key not in temp_of:
                    at, is_vector = texts[key]
                    temp = E.Var("vec" if is_vector else "scalar", node.dtype)
                    temp_of[key] = temp
                    bound.append(temp)
                    if is_vector:
                        value = f"{vector.helper('load', node.dtype, self.lanes)}(&{at})"
                        name = c.bind_var(temp)
                        tile_analysis.vector_lets.add(id(temp))
                        tile_analysis.dependent.add(id(temp))
                        qualifier = "" if uses[key] > 1 else "const "
                        c.line(indent, f"{qualifier}{vector.vtype(node.dtype, self.lanes)} "
                                       f"{name} = {value};")
                        if uses[key] > 1:
                            c.line(indent, f"OPF_PIN({name});")
                    else:
                        value = at
                        name = c.bind_var(temp)
                        c.line(indent, f"const {c_type(node.dtype)} {name} = {value};")
                mapping[id(node)] = temp_of[key]
            update = E.rewrite(plan.store.value, lambda n, m=mapping: m.get(id(n)))
            # The tile's variables left in the value (outside loads) are constants here.
            update = E.substitute(update, {
                var: E.IntImm(value, var.dtype) for var, value in point.items()
                if var is not plan.vector_loop.loop_var})
            text = vector.value(update, tile_analysis, self.lanes)
            c.line(indent, f"{c.var_name(register)} = {text};")
        return bound

