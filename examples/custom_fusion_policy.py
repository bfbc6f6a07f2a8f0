"""A fusion policy in one file: never fuse across a reshape.

opfusion's FusionMerge keeps policy apart from mechanism: a policy only looks at groups and
marks pairs it wants fused; the engine checks cycles and limits, merges and iterates. To change
how a model is fused, write a policy, register it, and run the pass — the engine is untouched.

Here the default vertical policy is replaced by one that refuses any producer/consumer pair in
which either side holds a reshape (say, because your backend wants reshapes as plain views).

    python examples/custom_fusion_policy.py
"""

import numpy as np

import opfusion as opf
from opfusion import op
from opfusion.transform.fusion import (
    DefaultVerticalFusePass,
    FusionMerge,
    LightwareFusePassCtx,
    OpGroup,
    register_fusion_policy,
    unregister_fusion_policy,
)


def holds_reshape(group: OpGroup) -> bool:
    return any(node.op_name == "reshape" for node in group.op_nodes)


class NoFusionAcrossReshape(DefaultVerticalFusePass):
    """The default vertical rule, except that nothing is fused with a group holding a
    reshape."""

    def __call__(self, ctx: LightwareFusePassCtx) -> None:
        producer = ctx.pick_op_group()
        if holds_reshape(producer) or any(holds_reshape(c) for c in producer.consumers):
            return
        super().__call__(ctx)


def build_model() -> opf.IRModule:
    x = opf.var("x", (4, 6))
    y = op.nn.relu(op.reshape(op.exp(x) * opf.const(0.5), newshape=(2, 12)))
    return opf.IRModule.from_expr(opf.Function([x], op.sum(y, axis=1)))


def partition(mod: opf.IRModule) -> list[list[str]]:
    """The op names of each fused kernel, in order."""
    groups = []
    for node in opf.ir.post_order(mod["main"].body, into_functions=False):
        if isinstance(node, opf.Call) and isinstance(node.op, opf.Function):
            groups.append([n.op.name for n in opf.ir.post_order(node.op.body)
                           if isinstance(n, opf.Call)])
    return groups


def main() -> None:
    mod = build_model()
    default = FusionMerge()(mod)
    print("default policies:     ", partition(default))

    unregister_fusion_policy(DefaultVerticalFusePass)
    register_fusion_policy(NoFusionAcrossReshape())
    try:
        custom = FusionMerge()(mod)
    finally:  # restore the defaults for whatever runs next in this process
        unregister_fusion_policy(NoFusionAcrossReshape)
        register_fusion_policy(DefaultVerticalFusePass())
    print("no fusion at reshapes:", partition(custom))

    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    want = opf.ir.evaluate(mod, [x])
    np.testing.assert_array_equal(opf.ir.evaluate(default, [x]), want)
    np.testing.assert_array_equal(opf.ir.evaluate(custom, [x]), want)
    assert partition(default) != partition(custom)
    assert all("reshape" not in group or group == ["reshape"] for group in partition(custom))
    print("both partitions compute the same numbers")


if __name__ == "__main__":
    main()
