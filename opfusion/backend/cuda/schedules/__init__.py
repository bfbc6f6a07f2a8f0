"""The CUDA backend's schedule rules.

=============  ==========================================  ===================================
rule           anchors                                     knobs
=============  ==========================================  ===================================
gpu_default    any group no rule takes (the fallback)      threads
=============  ==========================================  ===================================

See :mod:`opfusion.backend.schedule_rule` for the contract."""

from __future__ import annotations

from ...schedule_rule import RuleRegistry
from .default import GPUDefaultRule, arrange_elementwise, bind_flat

#: The CUDA backend's rules, by anchor operator; groups none takes get the default.
RULES = RuleRegistry("cuda")
RULES.set_fallback(GPUDefaultRule())

__all__ = ["RULES", "GPUDefaultRule", "arrange_elementwise", "bind_flat"]
