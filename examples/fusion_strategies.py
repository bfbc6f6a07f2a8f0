"""One graph, three fusion strategies: none (one kernel per operator), tvm (FuseOps, TVM's
post-dominator rules) and cinn (FuseOps, then the policies of FusionMerge), with the reasons
FuseOps gives for each edge it left unfused. All three compute the same numbers.

    python examples/fusion_strategies.py

The graph: a dense layer whose output feeds tanh and, scaled and exponentiated, two
reductions. FuseOps stops at the exp, which has two consumers; FusionMerge's recompute
policy copies the cheap multiply -> exp into both reductions, saving a kernel and a tensor.
"""

import numpy as np

import opfusion as opf
from opfusion import op
from opfusion.testing import assert_close
from opfusion.transform import FuseOps, FusionMerge

x = opf.var("x", (32, 64))
w = opf.var("w", (64, 64))
h = op.nn.dense(x, w)
e = op.exp(h * 0.1)
outputs = opf.Tuple([op.sum(e * 2.0, axis=1), op.sum(e + 1.0, axis=1), op.tanh(h)])
mod = opf.IRModule.from_expr(opf.Function([x, w], outputs))


def fused_groups(fused: opf.IRModule) -> list[list[str]]:
    """The operators of each primitive function called by @main, in order."""
    return [[n.op.name for n in opf.ir.post_order(call.op.body) if isinstance(n, opf.Call)]
            for call in opf.ir.post_order(fused["main"].body, into_functions=False)
            if isinstance(call, opf.Call) and isinstance(call.op, opf.Function)]


mod = opf.transform.InferType()(mod)
rng = np.random.default_rng(0)
feeds = {"x": rng.standard_normal((32, 64), dtype=np.float32),
         "w": rng.standard_normal((64, 64), dtype=np.float32) / 8}
want = opf.ir.evaluate(mod, feeds)
# what opf.compile(..., fusion=strategy) runs after its optimization passes:
strategies = {"none": FuseOps(fuse_opt_level=0),                  # every op a group of its own
              "tvm": FuseOps(fuse_opt_level=3),
              "cinn": lambda m: FusionMerge()(FuseOps(fuse_opt_level=3)(m))}
for strategy, fusion_pass in strategies.items():
    groups = fused_groups(fusion_pass(mod))
    print(f"fusion={strategy}: {len(groups)} kernels {groups}")
    got = opf.compile(mod, fusion=strategy)(**feeds)
    assert_close(got, want, rtol=1e-5)

print("\nwhy FuseOps left these edges unfused:")
print(opf.transform.explain_fusion(mod))
dot = opf.transform.fusion_to_dot(mod)
print(f"\nfusion_to_dot: {dot.count('subgraph cluster_')} clusters, one per FuseOps group "
      f"(draw them: opfusion show MODEL.onnx --dot groups.svg)")
print("all three strategies match the reference interpreter")
