"""The machine code is generated for: :class:`Target`, parsed from strings such as ``"c"``,
``"llvm -mcpu=znver4"`` or ``"c -mattr=+avx2,+fma"``; the host's facts; ISA tables."""

from .host import host_arch, host_cpu_name, host_features, host_num_cores
from .target import (
    Target,
    TargetError,
    TargetKind,
    as_target,
    host_target,
    register_target_kind,
    target_kinds,
)

__all__ = ["Target", "TargetError", "TargetKind", "as_target", "host_arch", "host_cpu_name",
           "host_features", "host_num_cores", "host_target", "register_target_kind",
           "target_kinds"]
