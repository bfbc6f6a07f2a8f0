"""NDArray: a tensor on a device, the argument type of compiled kernels (``opf.nd``).

On the CPU an NDArray is a thin wrapper over a C-contiguous NumPy array. ``array`` wraps such an
array without copying (the kernel then reads and writes the caller's memory) and copies anything
else (strided views, Fortran order, foreign byte order) into a fresh 64-byte aligned buffer."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import DeviceError, OpfusionError
from ..ir.types import normalize_dtype
from .device import Device, cpu
from .device import device as _device

#: Alignment of buffers that opfusion allocates: one cache line, enough for any vector load.
ALIGNMENT = 64


class NDArray:
    """A tensor on a device. Build one with ``opf.nd.array`` or ``opf.nd.empty``."""

    __slots__ = ("_data", "_device")

    def __init__(self, data: np.ndarray, device: Device | None = None) -> None:
        if not isinstance(data, np.ndarray) or not data.flags.c_contiguous:
            raise OpfusionError("NDArray wraps a C-contiguous numpy.ndarray; use opf.nd.array()")
        self._data = data
        self._device = cpu() if device is None else device

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape, a tuple of ints."""
        return self._data.shape

    @property
    def dtype(self) -> str:
        """The element type's name, e.g. ``"float32"``."""
        return self._data.dtype.name

    @property
    def device(self) -> Device:
        """The device that holds the data."""
        return self._device

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def nbytes(self) -> int:
        return self._data.nbytes

    def numpy(self) -> np.ndarray:
        """Return a NumPy copy of the data (later writes by kernels do not show in it)."""
        return self._data.copy()

    def copyfrom(self, source: np.ndarray | NDArray) -> NDArray:
        """Copy ``source`` (same shape; cast to this dtype) into this array and return it."""
        values = source._data if isinstance(source, NDArray) else np.asarray(source)
        if values.shape != self.shape:
            raise OpfusionError(
                f"cannot copy an array of shape {values.shape} into an NDArray of shape "
                f"{self.shape}"
            )
        np.copyto(self._data, values, casting="unsafe")
        return self

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        # NumPy protocol: np.asarray(nd) gives the wrapped array itself (no copy).
        if dtype is not None and np.dtype(dtype) != self._data.dtype:  # type: ignore[arg-type]
            return self._data.astype(dtype)  # type: ignore[call-overload]
        return self._data

    def __repr__(self) -> str:
        return f"<opf.nd.NDArray shape={self.shape} dtype={self.dtype} device={self.device}>"


def _check_device(dev: object) -> Device:
    if dev is None:
        return cpu()
    found = _device(dev) if not isinstance(dev, Device) else dev
    if found.kind != "cpu":
        raise DeviceError(f"opfusion keeps tensors on the CPU only, not on {found}")
    return found


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def aligned_copy(values: np.ndarray) -> np.ndarray:
    """``values`` C-contiguous at a 64-byte boundary (ALIGNMENT): as it is when it already
    is, else a copy. Kernels read constants in vectors of up to 64 bytes; from an array
    NumPy allocated (16-byte aligned) each such load spans two cache lines."""
    if values.flags.c_contiguous and values.ctypes.data % ALIGNMENT == 0:
        return values
    out = _aligned_empty(values.shape, values.dtype)
    np.copyto(out, values)
    return out


def _checked_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    for dim in dims:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 0:
            raise OpfusionError(f"shape {dims} has a bad dimension {dim!r}: use non-negative ints")
    return tuple(int(d) for d in dims)


def empty(shape: int | Sequence[int], dtype: object = "float32",
          device: Device | str | None = None) -> NDArray:
    """Return an uninitialised NDArray of ``shape`` and ``dtype``, 64-byte aligned."""
    dev = _check_device(device)
    np_dtype = np.dtype(normalize_dtype(dtype))
    return NDArray(_aligned_empty(_checked_shape(shape), np_dtype), dev)


def array(data: object, device: Device | str | None = None, dtype: object = None) -> NDArray:
    """Return an NDArray holding ``data`` (a NumPy array, an NDArray or nested lists).

    A C-contiguous NumPy array in native byte order, whose dtype is already ``dtype``, is
    wrapped without copying: kernels then write into the caller's array. Anything else is
    copied into a fresh aligned buffer."""
    dev = _check_device(device)
    if isinstance(data, NDArray):
        data = data._data
    values = np.asarray(data)
    want = np.dtype(normalize_dtype(values.dtype if dtype is None else dtype))
    if (values.dtype == want and values.dtype.isnative and values.flags.c_contiguous
            and values.flags.aligned):
        return NDArray(values, dev)
    out = _aligned_empty(values.shape, want)
    np.copyto(out, values, casting="unsafe")
    return NDArray(out, dev)
