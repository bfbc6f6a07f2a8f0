"""opfusion on an NVIDIA GPU against PyTorch eager and torch.compile, in one run.

    python benchmarks/gpu.py [--repeat 20] [--batch 32]

Two workloads, as the CUDA issue asks: ResNet-50 at batch 32 (224 x 224, random weights; the
torch side is torchvision's resnet50 when torchvision is installed) and an elementwise chain
over 64M float32 elements (``relu(x * 1.5 + 0.25) * sigmoid(x)``: one read and one write of
256 MB each at best), whose bandwidth bound is printed from the GPU's memory clock and bus
width. opfusion's time is its launches alone (``GPUExecutor.execute``: inputs already on the
device), torch's the same (tensors on the GPU); each is the median of ``--repeat`` timed
runs after warm-up, measured with CUDA events (opfusion) and ``torch.cuda.Event`` (torch),
all in this one process. Without an NVIDIA GPU and its driver it says so and exits."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from opfusion import op, testing
from opfusion.backend.cuda.runtime import cuda_device
from opfusion.compiler.gpu import GPUExecutor, build_gpu_model
from opfusion.errors import DeviceError
from opfusion.ir.expr import Function, Var
from opfusion.ir.types import TensorType

CHAIN_ELEMENTS = 64 * 1024 * 1024


def bandwidth_bound_ms(device, nbytes: int) -> float | None:
    """Milliseconds to move ``nbytes`` at the GPU's peak memory bandwidth (DDR: two
    transfers per clock), from the driver's attributes."""
    cu = device.cu
    attr = cu.CUdevice_attribute
    err, clock_khz = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE,
                                             device.device)
    err2, bus_bits = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH,
                                             device.device)
    if err != cu.CUresult.CUDA_SUCCESS or err2 != cu.CUresult.CUDA_SUCCESS or not clock_khz:
        return None
    bytes_per_second = 2 * clock_khz * 1e3 * bus_bits / 8
    return nbytes / bytes_per_second * 1e3


def time_opfusion(exe: GPUExecutor, inputs, repeat: int) -> float:
    exe.run(*inputs)  # uploads the inputs; warm-up
    exe.execute()
    times = []
    for _ in range(repeat):
        start = exe.device.timer()
        exe.execute()
        times.append(exe.device.elapsed_ms(start))
    return statistics.median(times)


def time_torch(fn, args, repeat: int) -> float:
    import torch

    with torch.no_grad():
        for _ in range(3):
            fn(*args)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeat):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    return statistics.median(times)


def torch_peers(fn, args, repeat: int) -> dict[str, float]:
    """Eager and torch.compile times of ``fn``, where torch has CUDA."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    out = {"torch eager": time_torch(fn, args, repeat)}
    try:
        compiled = torch.compile(fn)
        out["torch.compile"] = time_torch(compiled, args, repeat)
    except Exception as err:  # no triton or a compiler error: report, go on
        print(f"  torch.compile failed: {type(err).__name__}: {err}")
    return out


def chain_rows(device, repeat: int) -> None:
    x = Var("x", TensorType((CHAIN_ELEMENTS,), "float32"))
    body = op.multiply(op.nn.relu(op.add(op.multiply(x, op.const(1.5)), op.const(0.25))),
                       op.sigmoid(x))
    exe = GPUExecutor(build_gpu_model(Function([x], body), target=f"cuda -arch={device.arch}"),
                      device)
    data = np.random.default_rng(0).standard_normal(CHAIN_ELEMENTS).astype("float32")
    results = {"opfusion": time_opfusion(exe, [data], repeat)}
    try:
        import torch

        if torch.cuda.is_available():
            tx = torch.from_numpy(data).cuda()
            results.update(torch_peers(
                lambda t: torch.relu(t * 1.5 + 0.25) * torch.sigmoid(t), [tx], repeat))
    except ImportError:
        pass
    bound = bandwidth_bound_ms(device, 2 * data.nbytes)
    report("elementwise chain, 64M float32", results, bound)
    exe.close()


def resnet_rows(device, batch: int, repeat: int) -> None:
    mod, params = testing.WORKLOADS["resnet50"](batch_size=batch)
    start = time.perf_counter()
    model = build_gpu_model(mod, params, f"cuda -arch={device.arch}")
    exe = GPUExecutor(model, device)
    print(f"  resnet50: {len(model.kernels)} kernels, compiled in "
          f"{time.perf_counter() - start:.1f} s")
    data = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype("float32")
    results = {"opfusion": time_opfusion(exe, [data], repeat)}
    try:
        import torch
        import torchvision

        if torch.cuda.is_available():
            net = torchvision.models.resnet50().eval().cuda()
            results.update(torch_peers(net, [torch.from_numpy(data).cuda()], repeat))
    except ImportError:
        print("  (torch or torchvision missing: no peers for resnet50)")
    report(f"resnet50, batch {batch}", results, None)
    exe.close()


def report(title: str, results: dict[str, float], bound: float | None) -> None:
    print(f"\n{title}")
    base = results["opfusion"]
    for name, ms in results.items():
        ratio = "" if name == "opfusion" else f"  opfusion/this {base / ms:.2f}x"
        print(f"  {name:<14} {ms:9.3f} ms{ratio}")
    if bound is not None:
        print(f"  bandwidth bound {bound:.3f} ms; opfusion at {base / bound:.2f}x of it")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    try:
        device = cuda_device()
    except DeviceError as err:
        print(f"no GPU to measure on: {err}")
        return 0
    print(f"device: {device.name} ({device.arch})")
    chain_rows(device, args.repeat)
    resnet_rows(device, args.batch, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
