"""Devices that hold tensors and run kernels: only the host CPU for now.

A device is a small immutable value (kind and index). ``device("cuda")`` is recognised and refused
with a clear message, so that code written for later targets fails early and readably."""

from __future__ import annotations

from ..errors import DeviceError

#: Device kinds that opfusion recognises, with whether this build can run kernels on them.
_KNOWN_KINDS = {"cpu": True, "llvm": True, "c": True, "cuda": False, "gpu": False,
                "rocm": False, "metal": False, "vulkan": False, "opencl": False}

#: Aliases that name the host CPU (TVM scripts write ``tvm.device("llvm", 0)``).
_CPU_ALIASES = ("cpu", "llvm", "c")


class Device:
    """A place where tensors live and kernels run, e.g. ``Device("cpu", 0)``."""

    __slots__ = ("kind", "index")

    def __init__(self, kind: str = "cpu", index: int = 0) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "index", index)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Device is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and (self.kind, self.index) == (other.kind, other.index)

    def __hash__(self) -> int:
        return hash((self.kind, self.index))

    def __repr__(self) -> str:
        return f"{self.kind}({self.index})"


def device(kind: str | Device = "cpu", index: int = 0) -> Device:
    """Return the device named ``kind`` (``"cpu"``; ``"llvm"`` and ``"c"`` are aliases).

    Raises DeviceError for a device kind that opfusion does not know or cannot run yet."""
    if isinstance(kind, Device):
        return kind
    if not isinstance(kind, str):
        raise DeviceError(f"a device is named by a string such as 'cpu', not {kind!r}")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise DeviceError(f"device index must be a non-negative integer, not {index!r}")
    name = kind.strip().lower()
    if name not in _KNOWN_KINDS:
        known = ", ".join(repr(k) for k in _KNOWN_KINDS if _KNOWN_KINDS[k])
        raise DeviceError(f"unknown device {kind!r}; opfusion runs on {known}")
    if not _KNOWN_KINDS[name]:
        raise DeviceError(
            f"device {kind!r} is not supported yet: opfusion generates C for the host CPU only. "
            "Use opf.device('cpu')."
        )
    if index != 0:
        raise DeviceError(f"device cpu({index}) does not exist: the host CPU is cpu(0)")
    return Device("cpu", 0)


def cpu(index: int = 0) -> Device:
    """Return the host CPU device (the same as ``device("cpu", index)``)."""
    return device("cpu", index)
