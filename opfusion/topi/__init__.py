"""TE computes and default CPU schedules for the graph operators (TVM's TOPI, for opfusion).

``get_compute(op_name)`` gives the function turning a call into tensor expressions;
``get_schedule(op_name)`` the schedule of a fused group anchored at that op."""

from .registry import (
    get_compute,
    get_schedule,
    ops_with_compute,
    register_compute,
    register_schedule,
)

__all__ = ["get_compute", "get_schedule", "ops_with_compute", "register_compute",
           "register_schedule"]
