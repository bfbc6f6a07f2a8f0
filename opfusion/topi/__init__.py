"""TE computes for the graph operators (TVM's TOPI, for opfusion).

``get_compute(op_name)`` gives the function turning a call into tensor expressions. The
schedules of fused groups are the backends' schedule rules (:mod:`opfusion.backend`)."""

from .registry import get_compute, ops_with_compute, register_compute

__all__ = ["get_compute", "ops_with_compute", "register_compute"]
