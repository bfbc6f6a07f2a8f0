"""The CUDA backend's schedule rules.

=============  ==========================================  ===================================
rule           anchors                                     knobs
=============  ==========================================  ===================================
gpu_matmul     nn.dense, nn.matmul, nn.batch_matmul        block_rows, block_cols,
                                                           thread_rows, thread_cols, k_step,
                                                           shared
gpu_rows       nn.softmax, nn.log_softmax, nn.layer_norm   threads
gpu_default    any group no rule takes (the fallback)      threads
=============  ==========================================  ===================================

See :mod:`opfusion.backend.schedule_rule` for the contract."""

from __future__ import annotations

from ...schedule_rule import RuleRegistry
from .default import GPUDefaultRule, arrange_elementwise, bind_flat
from .matmul import GPUMatmulRule, arrange_product
from .rows import GPURowsRule, arrange_rows

#: The CUDA backend's rules, by anchor operator; groups none takes get the default.
RULES = RuleRegistry("cuda")
RULES.register(GPUMatmulRule())
RULES.register(GPURowsRule())
RULES.set_fallback(GPUDefaultRule())

__all__ = ["RULES", "GPUDefaultRule", "GPUMatmulRule", "GPURowsRule", "arrange_elementwise",
           "arrange_product", "arrange_rows", "bind_flat"]
