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

Which nests qualify, and how many accumulators the target's registers allow, is decided by
:mod:`.loop_planning` (a :class:`RegisterTilePlan`); this module only writes a plan. The values
are those of the loop nest; a sum (``acc + x``) starts its registers at zero and adds them
to the accumulator after the reduction loops, so a K-blocked nest sums block by block (see
:func:`.loop_planning.partial_sum_update`)."""

from __future__ import annotations

from ...target import Target
from ...tir import expr as E
from ...tir.simplify import simplify
from ..c_family import CFamilyEmitter
from ..c_names import c_type
from .loop_planning import (
    SCALAR,
    RegisterTilePlan,
    VectorAnalysis,
    tile_coefficients,
    tile_points,
    value_nodes,
)
from .matrix_tiles import (
    TILES_HELPER,
    TILES_HELPER_KEY,
    config_helper,
    resident_operands,
    tile_config,
    tile_registers,
)
from .vector import VectorEmitter

_PIN_AVX = (
    "#if defined(__GNUC__) && defined(__AVX__)\n"
    '#define OPF_PIN(v) __asm__("" : "+x"(v))\n'
    "#else\n"
    "#define OPF_PIN(v) ((void)0)\n"
    "#endif"
)

# With AVX-512, "x" would confine a pinned operand to the first 16 of the 32 vector registers;
# "v" allows any of them.
_PIN_AVX512 = (
    "#if defined(__GNUC__) && defined(__AVX512F__)\n"
    '#define OPF_PIN(v) __asm__("" : "+v"(v))\n'
    "#else\n"
    "#define OPF_PIN(v) ((void)0)\n"
    "#endif"
)


def pin_helper(target: Target) -> str:
    """``OPF_PIN(v)``: an empty ``asm`` that keeps vector ``v`` in a register, for the
    target's register file (a no-op on a target without AVX)."""
    if target.has("avx512f"):
        return _PIN_AVX512
    if target.has("avx"):
        return _PIN_AVX
    return "#define OPF_PIN(v) ((void)0)"


class RegisterTileEmitter:
    """Writes one :class:`RegisterTilePlan` into a C emitter, with the vector helpers of
    ``vector`` (whose target decides how operands are pinned in registers)."""

    def __init__(self, emitter: CFamilyEmitter, vector: VectorEmitter,
                 plan: RegisterTilePlan) -> None:
        self.c = emitter
        self.vector = vector
        self.plan = plan
        self.lanes = plan.vector.lanes
        self.dtype = plan.store.buffer.dtype
        #: per accessed (buffer, indices): the offset and its tile coefficients; its base text
        self._linear: dict[tuple[int, ...], tuple[E.PrimExpr, dict[int, int] | None]] = {}
        self._bases: dict[tuple[int, ...], str] = {}

    def _at(self, expr: E.PrimExpr, point: dict[E.Var, int]) -> E.PrimExpr:
        vector_loop = self.plan.vector_loop
        mapping: dict[E.Var, E.PrimExpr] = {}
        for var, value in point.items():
            if var is vector_loop.loop_var:
                mapping[var] = E.add(vector_loop.min, E.IntImm(value, var.dtype))
            else:
                mapping[var] = E.IntImm(value, var.dtype)
        return simplify(E.substitute(expr, mapping))

    def _linear_form(self, buffer: E.Buffer, indices: tuple[E.PrimExpr, ...],
                     point: dict[E.Var, int]
                     ) -> tuple[tuple[int, ...], E.PrimExpr, int | None]:
        """(the access's key, its flat offset, the constant the tile point adds to the
        offset at the tile's first point; None when the offset is not linear in the tile's
        variables)."""
        key = (id(buffer), *(id(i) for i in indices))
        entry = self._linear.get(key)
        if entry is None:
            offset = self.c.offset(buffer, indices)
            entry = self._linear[key] = (offset, tile_coefficients(offset, list(point)))
        offset, coefs = entry
        if coefs is None:
            return key, offset, None
        return key, offset, sum(coefs.get(id(v), 0) * value for v, value in point.items())

    def _offset(self, buffer: E.Buffer, indices: tuple[E.PrimExpr, ...],
                point: dict[E.Var, int]) -> str:
        """C text of the flat offset of ``buffer[indices]`` at a tile point: the offset at the
        tile's first point plus a constant, when it is linear in the tile's variables."""
        key, offset, delta = self._linear_form(buffer, indices, point)
        if delta is None:
            return self.c.expr(self._at(offset, point))
        base = self._bases.get(key)
        if base is None:
            base = self._bases[key] = self.c.expr(self._at(offset, dict.fromkeys(point, 0)))
        return base if delta == 0 else f"({base} + {delta})"

    def _address(self, buffer: E.Buffer, indices: tuple[E.PrimExpr, ...],
                 point: dict[E.Var, int]) -> str:
        return f"&{self.c.buffer_name(buffer)}[{self._offset(buffer, indices, point)}]"

    def emit(self, indent: int) -> None:
        c, plan = self.c, self.plan
        vector = self.vector
        vt = vector.vtype(self.dtype, self.lanes)
        load = vector.helper("load", self.dtype, self.lanes)
        store = vector.helper("store", self.dtype, self.lanes)
        points = tile_points(plan.tile_loops, plan.vector_loop, self.lanes)
        c.line(indent, "{")
        indent += 1
        registers: list[E.Var] = []
        zero = f"{vector.helper('splat', self.dtype, self.lanes)}(0)"
        for point in points:
            register = E.Var("acc", self.dtype)
            registers.append(register)
            address = self._address(plan.store.buffer, plan.store.indices, point)
            start = zero if plan.partial_sum else f"{load}({address})"
            c.line(indent, f"{vt} {c.bind_var(register)} = {start};")
        from_memory = self._weights_from_memory(points)
        for at, loop in enumerate(plan.reduce_loops):
            if from_memory and at < len(plan.reduce_loops) - 1 and c.loop_pragma(loop) is None:
                # (unrolled, GCC keeps the broadcasts one kernel tap shares with the next
                # live across taps, and spills the sums)
                c.line(indent, "#pragma GCC unroll 1")
            c.open_loop(loop, indent)
            indent += 1
            for hint in plan.prefetches[at] if plan.prefetches else ():
                c.emit_prefetch(hint, indent)
        temps = self._emit_products(points, registers, indent, from_memory)
        for loop in reversed(plan.reduce_loops):
            indent -= 1
            c.line(indent, "}")
            c.unbind_var(loop.loop_var)
        for var in temps:
            c.unbind_var(var)
        for point, register in zip(points, registers):
            address = self._address(plan.store.buffer, plan.store.indices, point)
            value = c.var_name(register)
            if plan.partial_sum and not plan.fresh:  # (fresh: the zeros it would add)
                value = f"{load}({address}) + {value}"
            c.line(indent, f"{store}({address}, {value});")
            c.unbind_var(register)
        c.line(indent - 1, "}")

    def _weights_from_memory(self, points: list[dict[E.Var, int]]) -> bool:
        """Whether the tile's products of words read their weight vectors from memory (a
        ``vpdpbusd`` operand), not from registers: with AVX-VNNI alone (16 registers, see
        :func:`opfusion.backend.cpu.vector_math.vector_dot4_memory_helper`), where the sums,
        the broadcasts of one weight vector's row and the weight vectors would not all fit
        with two registers to spare. A 3x3 convolution's tile of 4 channel blocks x 3
        columns keeps its 12 sums and 3 broadcasts in registers so, 1.7 ``vpdpbusd`` a cycle
        where 4 x 2 (8 sums, every operand in a register) does 1.45; 2 x 7 its 14 sums and
        one broadcast."""
        target = self.vector.target
        if not (target.has("avxvnni") and not target.has("avx512vl")
                and _is_dot4_update(self.plan.store.value)):
            return False
        analysis = VectorAnalysis(self.plan.vector_loop)
        analysis.value(self.plan.store.value)
        operands = [n for n in value_nodes(self.plan.store.value)
                    if isinstance(n, E.BufferLoad) and n is not self.plan.self_load]
        weight = self.plan.store.value.b.args[1]
        if any(analysis.kinds[id(n)] != SCALAR and n is not weight for n in operands):
            return False  # (a vector operand other than the product's weight: in registers)
        # (the operands by their offsets' constant parts, as _offset writes them; the loops
        # are not open yet, so not by their text)
        distinct: dict[bool, set[tuple[object, ...]]] = {True: set(), False: set()}
        for at, point in enumerate(points):
            for node in operands:
                key, _, delta = self._linear_form(node.buffer, node.indices, point)
                distinct[analysis.kinds[id(node)] != SCALAR].add(
                    (*key, ("point", at) if delta is None else delta))
        weights, broadcasts = len(distinct[True]), len(distinct[False])
        row = broadcasts if weights >= broadcasts else 1  # (the order of _scalar_major)
        # (where a broadcast of one kernel tap is another tap's too, two registers spare:
        # GCC keeps such broadcasts live across the unrolled taps, and 2 x 6 tiles, 15
        # registers with their operands, spilled; a product's tiles in 16 measured 2% faster
        # with their weights in registers)
        spare = 2 if any(self._taps_overlap(n, points[0]) for n in operands
                         if analysis.kinds[id(n)] == SCALAR) else 0
        return len(points) + row + weights > target.vector_registers - spare

    def _taps_overlap(self, load: E.BufferLoad, point: dict[E.Var, int]) -> bool:
        """Whether ``load``'s offset moves with a reduction loop (a kernel tap) as it moves
        with a tile variable (a column): a convolution's input, whose windows overlap."""
        _, offset, _ = self._linear_form(load.buffer, load.indices, point)
        tile_vars = [loop.loop_var for loop in self.plan.tile_loops]
        reduce_vars = [loop.loop_var for loop in self.plan.reduce_loops]
        tile = tile_coefficients(offset, tile_vars) or {}
        taps = tile_coefficients(offset, reduce_vars) or {}
        steps = {abs(c) for c in tile.values() if c}
        return any(abs(c) in steps for c in taps.values() if c)

    def _emit_products(self, points: list[dict[E.Var, int]], registers: list[E.Var],
                       indent: int, from_memory: bool = False) -> list[E.Var]:
        """The body of the reduction loops: the operand loads (each distinct one once), then one
        update per accumulator. Returns the temporaries it bound. ``from_memory``: the vector
        operands of the products of words are their addresses, read by each product itself
        (see :meth:`_weights_from_memory`)."""
        c, plan = self.c, self.plan
        vector = self.vector
        analysis = VectorAnalysis(plan.vector_loop)
        kind = analysis.value(plan.store.value)
        assert kind is not None and kind[0] == "vector"
        operands = [n for n in value_nodes(plan.store.value)
                    if isinstance(n, E.BufferLoad) and n is not plan.self_load]
        # (text of the load at a point) -> temporary; and each point's replacements
        temp_of: dict[str, E.Var] = {}
        uses: dict[str, int] = {}
        texts: dict[str, tuple[str, bool]] = {}
        per_point: list[list[str]] = []
        for point in points:
            keys = []
            for node in operands:
                is_vector = analysis.kinds[id(node)] != SCALAR
                offset = self._offset(node.buffer, node.indices, point)
                at = f"{c.buffer_name(node.buffer)}[{offset}]"
                key = ("v" if is_vector else "s") + at
                keys.append(key)
                uses[key] = uses.get(key, 0) + 1
                texts.setdefault(key, (at, is_vector))
            per_point.append(keys)
        points, per_point, registers = _scalar_major(points, per_point, registers)
        pinned = not from_memory and any(is_vector and uses[key] > 1
                                         for key, (_, is_vector) in texts.items())
        if pinned:
            c.need_helper("0_opf_pin", pin_helper(vector.target))
        bound: list[E.Var] = []
        # The updates' analysis: registers and vector temporaries are vectors, the rest
        # (scalar temporaries, constants) broadcast.
        tile_analysis = VectorAnalysis(plan.vector_loop)
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
                    if is_vector and from_memory:
                        name = c.bind_var(temp)
                        vector.memory_operands.add(id(temp))
                        c.line(indent, f"const {c_type(node.dtype)}* {name} = &{at};")
                    elif is_vector:
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
        vector.memory_operands.clear()
        return bound



def _is_dot4_update(value: E.PrimExpr) -> bool:
    """Whether a tile's update is ``acc + dot4_u8s8(a, b)`` (one ``vpdpbusd``)."""
    return (isinstance(value, E.Add) and isinstance(value.b, E.Call)
            and value.b.name == "dot4_u8s8")


def _scalar_major(points: list[dict[E.Var, int]], per_point: list[list[str]],
                  registers: list[E.Var]
                  ) -> tuple[list[dict[E.Var, int]], list[list[str]], list[E.Var]]:
    """The tile's points reordered, where the tile has fewer distinct vector operands than
    broadcast (scalar) ones, so that the points sharing their broadcasts are consecutive
    (each kept in the order it had): every broadcast is then used by all its updates at once
    and dies, and only the vector operands stay live across the tile. A convolution's tile
    of b channel blocks x u columns keeps b weight vectors and one broadcast live so, where
    block by block it kept u broadcasts and one weight vector: 2 x 14 columns with 28
    accumulators spilled AVX-512's 32 registers, and tiles of 4 x 7 took 7% less time than
    2 x 7 in ResNet-50's 1x1 layers (AVX2's 4 x 3 tiles keep block by block: 3 broadcasts
    against 4 weights)."""
    vectors = {key for keys in per_point for key in keys if key.startswith("v")}
    scalars = {key for keys in per_point for key in keys if key.startswith("s")}
    if len(vectors) >= len(scalars):
        return points, per_point, registers
    first: dict[tuple[str, ...], int] = {}
    order = []
    for index, keys in enumerate(per_point):
        shared = tuple(key for key in keys if key.startswith("s"))
        order.append((first.setdefault(shared, len(first)), index))
    ranked = [index for _, index in sorted(order)]
    return ([points[i] for i in ranked], [per_point[i] for i in ranked],
            [registers[i] for i in ranked])


class MatrixTileEmitter(RegisterTileEmitter):
    """Writes a register tile whose products run on matrix tiles (a :class:`RegisterTilePlan`
    with ``matrix``; see :mod:`.matrix_tiles`): each tile of sums loaded from the
    accumulator (or set to zero where the accumulator was only zeros: a fresh tile), the
    remaining reduction loops, in each step the data's and the weight's tiles and one
    ``tdpbusd`` per tile of sums, then the sums stored."""

    def emit(self, indent: int) -> None:
        c, plan = self.c, self.plan
        matrix = plan.matrix
        assert matrix is not None
        target = self.vector.target
        c.includes.update(("immintrin.h", "unistd.h", "sys/syscall.h", "stdint.h"))
        c.need_helper(TILES_HELPER_KEY, TILES_HELPER)
        key, config, text = config_helper(tile_config(matrix, target))
        c.need_helper(key, text)
        sums, data_regs, weight_regs = tile_registers(matrix, target)
        resident = resident_operands(matrix, target)
        points = tile_points(plan.tile_loops, plan.vector_loop, self.lanes)
        starts = {loop.loop_var: loop.min.value for loop in matrix.k_loops}
        # (every address at a point of the tile, the contraction's loops at their start)
        at = [{**point, **starts} for point in points]
        c.line(indent, "{")
        indent += 1
        c.line(indent, f"opf_tiles_configure(&{config});")
        for register, rows in zip(sums, matrix.sums):
            if plan.fresh:  # (the accumulator was only set to zero: that fill is skipped)
                c.line(indent, f"_tile_zero({register});")
                continue
            address = self._address(plan.store.buffer, plan.store.indices, at[rows[0]])
            c.line(indent, f"_tile_loadd({register}, {address}, {matrix.sum_stride});")
        for depth, loop in enumerate(matrix.loops):
            c.open_loop(loop, indent)
            indent += 1
            for hint in plan.prefetches[depth] if plan.prefetches else ():
                c.emit_prefetch(hint, indent)
        first_of_run = {run: rows[0] for rows, run in zip(matrix.sums, matrix.runs)}
        first_of_block = {block: rows[0] for rows, block in zip(matrix.sums, matrix.blocks)}
        loaded_weights: set[int] = set()
        turn = 0
        for run in range(matrix.run_count):
            data_reg = data_regs[run] if resident else data_regs[0]
            address = self._address(matrix.data.buffer, matrix.data.indices,
                                    at[first_of_run[run]])
            c.line(indent, f"_tile_loadd({data_reg}, {address}, {matrix.data_stride});")
            for register, r, block in zip(sums, matrix.runs, matrix.blocks):
                if r != run:
                    continue
                if resident:
                    weight_reg = weight_regs[block]
                else:
                    weight_reg = weight_regs[turn % len(weight_regs)]
                    turn += 1
                if not (resident and block in loaded_weights):
                    address = self._address(matrix.weight.buffer, matrix.weight.indices,
                                            at[first_of_block[block]])
                    c.line(indent, f"_tile_loadd({weight_reg}, {address}, "
                                   f"{matrix.weight_stride});")
                    loaded_weights.add(block)
                c.line(indent, f"_tile_dpbusd({register}, {data_reg}, {weight_reg});")
        for loop in reversed(matrix.loops):
            indent -= 1
            c.line(indent, "}")
            c.unbind_var(loop.loop_var)
        for register, rows in zip(sums, matrix.sums):
            address = self._address(plan.store.buffer, plan.store.indices, at[rows[0]])
            c.line(indent, f"_tile_stored({register}, {address}, {matrix.sum_stride});")
        c.line(indent - 1, "}")
