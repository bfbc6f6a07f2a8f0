"""The CUDA backend's schedule rules.

=============  ==========================================  ===================================
rule           anchors                                     knobs
=============  ==========================================  ===================================
gpu_mma        nn.dense, nn.matmul, nn.batch_matmul        warps_m, warps_n, tiles_m,
               (float32 on tensor cores in TF32, for a      tiles_n, k_step, shared
               target with -tf32=1)
gpu_matmul     nn.dense, nn.matmul, nn.batch_matmul        block_rows, block_cols,
                                                           thread_rows, thread_cols, k_step,
                                                           shared
gpu_conv2d_    nn.conv2d (NCHW, float32 on tensor cores in  warps_m, warps_n, tiles_m,
mma            TF32, for a target with -tf32=1)             tiles_n, k_step, shared
gpu_conv2d     nn.conv2d (NCHW)                            block_channels, thread_channels,
                                                           threads_x, thread_pixels, k_step,
                                                           shared
gpu_rows       nn.softmax, nn.log_softmax, nn.layer_norm,  threads
               nn.attention (a block per query row)
gpu_default    any group no rule takes (the fallback)      threads
=============  ==========================================  ===================================

See :mod:`opfusion.backend.schedule_rule` for the contract."""

from __future__ import annotations

from ...schedule_rule import RuleRegistry
from .conv2d import GPUConv2dRule, arrange_conv2d
from .conv2d_mma import GPUConv2dMmaRule, arrange_conv2d_mma
from .default import GPUDefaultRule, accumulator_and_owner, arrange_elementwise, bind_flat
from .matmul import GPUMatmulRule, arrange_product
from .mma import GPUMmaRule, arrange_mma_product
from .rows import GPURowsRule, arrange_rows

#: The CUDA backend's rules, by anchor operator; groups none takes get the default.
RULES = RuleRegistry("cuda")
RULES.register(GPUMmaRule())  # first: it declines unless the target allows TF32
RULES.register(GPUMatmulRule())
RULES.register(GPUConv2dMmaRule())  # first: it declines unless the target allows TF32
RULES.register(GPUConv2dRule())
RULES.register(GPURowsRule())
RULES.set_fallback(GPUDefaultRule())

__all__ = ["RULES", "GPUConv2dMmaRule", "GPUConv2dRule", "GPUDefaultRule", "GPUMatmulRule",
           "GPUMmaRule", "GPURowsRule", "accumulator_and_owner", "arrange_conv2d",
           "arrange_conv2d_mma", "arrange_elementwise", "arrange_mma_product", "arrange_product",
           "arrange_rows", "bind_flat"]
