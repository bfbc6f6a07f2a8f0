"""From a fused graph to native code: lowering each fused group to one kernel, planning
memory, and the compile pipeline behind ``opf.compile``."""

from .lower_group import LoweredGroup, lower_primitive_function

__all__ = ["LoweredGroup", "lower_primitive_function"]
