"""Shared helpers of the FuseOps tests: run the pass, check the partition, compare numbers."""

from __future__ import annotations

import numpy as np

from opfusion.ir import Function, IRModule, assert_structural_equal, evaluate, infer_type
from opfusion.ir.types import TensorType
from opfusion.transform import PassContext
from opfusion.transform.fuse.check import check_fused_module, check_fusion_plan
from opfusion.transform.fuse.partition import FuseOptions, plan_fusion
from opfusion.transform.fuse_ops import FuseOps


def as_module(graph: Function | IRModule) -> IRModule:
    return graph if isinstance(graph, IRModule) else IRModule.from_expr(graph)


def fuse(graph: Function | IRModule, opt_level: int = 2, **config) -> IRModule:
    """FuseOps at ``opt_level`` with ``config`` given as keyword arguments without the
    ``FuseOps.`` prefix (``max_depth=10``)."""
    settings = {f"FuseOps.{key}": value for key, value in config.items()}
    with PassContext(opt_level=opt_level, config=settings):
        return FuseOps()(as_module(graph))


def plan(graph: Function | IRModule, opt_level: int = 2, explain: bool = False, **config):
    settings = {f"FuseOps.{key}": value for key, value in config.items()}
    with PassContext(opt_level=opt_level, config=settings):
        return plan_fusion(as_module(graph)["main"], FuseOptions.from_context(), explain=explain)


def group_sizes(graph: Function | IRModule, **config) -> list[int]:
    """Ops per fused group, in group order."""
    return [group.num_ops for group in plan(graph, **config).fused_groups()]


def primitive(params, body, **kwargs) -> Function:
    """An expected fused function: ``Primitive=1`` and the return type filled in."""
    return Function(params, body, ret_type=infer_type(body), attrs={"Primitive": 1}, **kwargs)


def main(params, body) -> IRModule:
    """An expected fused module: ``@main`` with its return type filled in, as FuseOps gives."""
    return IRModule.from_expr(Function(params, body, ret_type=infer_type(body)))


def random_inputs(func: Function, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    values = []
    for param in func.params:
        ty = param.type_annotation
        assert isinstance(ty, TensorType), ty
        if ty.dtype.startswith("float"):
            values.append(rng.standard_normal(ty.shape).astype(ty.dtype))
        elif ty.dtype == "bool":
            values.append(rng.random(ty.shape) < 0.5)
        else:
            values.append(rng.integers(-5, 6, ty.shape).astype(ty.dtype))
    return values


def assert_same_values(got, want) -> None:
    """Bit-exact: the fused module runs the same NumPy references in the same order."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same_values(g, w)
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def check_fusion(graph: Function | IRModule, opt_level: int = 2, **config) -> IRModule:
    """Fuse ``graph`` and check everything the bar asks of the result: a partition without
    cycles, closed primitive functions, the same numbers as the unfused graph."""
    mod = as_module(graph)
    check_fusion_plan(plan(mod, opt_level=opt_level, **config))
    fused = fuse(mod, opt_level=opt_level, **config)
    check_fused_module(fused)
    inputs = random_inputs(mod["main"])
    assert_same_values(evaluate(fused, inputs), evaluate(mod, inputs))
    return fused


def assert_fuses_to(graph: Function | IRModule, expected: IRModule, **config) -> IRModule:
    fused = check_fusion(graph, **config)
    assert_structural_equal(fused, expected)
    return fused

