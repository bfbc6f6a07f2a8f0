"""opfusion on an NVIDIA GPU against PyTorch eager and torch.compile, in one run.

    python benchmarks/gpu.py [--repeat 20] [--batch 32] [--sweep] [--products] [--tf32 [fast]]
                             [--tune SECONDS [--records FILE]] [--staging SECONDS]
                             [--product-sweep SECONDS] [--skip chain,resnet50] [--no-check]

Two workloads, as the CUDA issue asks: ResNet-50 at batch 32 (224 x 224, random weights; the
torch side is torchvision's resnet50 when torchvision is installed) and an elementwise chain
over 64M float32 elements (``relu(x * 1.5 + 0.25) * sigmoid(x)``: one read and one write of
256 MB each at best), whose bandwidth bound is those bytes over the bandwidth of a measured
1 GiB device-to-device copy. Both of opfusion's results are checked (the chain against NumPy,
resnet50 against the NumPy reference interpreter). For resnet50 torch is timed with its
defaults (cuDNN convolutions in TF32 on the tensor cores) and in plain float32 (``fp32``
rows, ``allow_tf32`` off), which is the arithmetic opfusion's kernels do. opfusion's time is
its launches alone (``GPUExecutor.execute``: inputs already on the device), torch's the same
(tensors on the GPU); each is the median of ``--repeat`` timed
runs after warm-up, measured with CUDA events (opfusion) and ``torch.cuda.Event`` (torch),
all in this one process. Without an NVIDIA GPU and its driver it says so and exits.

``--tf32`` builds resnet50 for ``cuda -tf32=1``: its convolutions and products on tensor
cores in TF32 (``gpu_conv2d_mma``, ``gpu_mma``), the arithmetic of torch's default rows, and
times it built for ``-tf32=fast`` as well (the operands truncated by the tensor cores, as
cuDNN's are under torch, instead of rounded: no instructions to round); ``--tf32 fast``
builds for ``-tf32=fast`` first and times ``-tf32=1`` as the other, and the staging and
product sweeps run in the mode given.
``--products`` first times three products (dense, random operands) in float32 tiles and on
tensor cores in TF32 (``-tf32=1``, ``backend/cuda/schedules/mma.py``), each checked against
NumPy, against ``torch.matmul`` in float32 and in TF32 (``allow_tf32``). With ``--tf32`` the
check is against the reference with TF32-rounded operands as well (``tf32_operands``), and
``--staging`` first times each of resnet50's tensor-core convolutions through the GPU runner
with its sums stored through shared memory and without (``staged_store``), with its copies
async two and three steps ahead (``async_stages``), and in other staged tiles, with the sums
weighted by the layers' counts."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
import time

import numpy as np

import opfusion as opf
from opfusion import op, testing
from opfusion.autotune.measure import MeasureOptions
from opfusion.backend.cuda.runtime import cuda_device
from opfusion.backend.schedule_rule import ScheduleError
from opfusion.compiler.gpu import GPUExecutor, build_gpu_model
from opfusion.errors import DeviceError
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function, Var, const
from opfusion.ir.types import TensorType

CHAIN_ELEMENTS = 64 * 1024 * 1024
#: (rows, contraction, columns) of the products --products times: a square one, and BERT-large's
#: feed-forward input and output at 4096 tokens.
PRODUCTS = ((4096, 4096, 4096), (4096, 1024, 4096), (4096, 4096, 1024))


def copy_bandwidth_gbs(device, nbytes: int = 1 << 30, repeat: int = 10) -> float:
    """The GPU's measured memory bandwidth: a device-to-device copy of ``nbytes``, counting
    the bytes read and the bytes written (the ceiling an elementwise kernel can reach)."""
    cu = device.cu
    err, src = cu.cuMemAlloc(nbytes)
    err2, dst = cu.cuMemAlloc(nbytes)
    if err != cu.CUresult.CUDA_SUCCESS or err2 != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuMemAlloc of two {nbytes >> 20} MiB buffers failed")
    try:
        times = []
        for _ in range(repeat + 2):
            start = device.timer()
            cu.cuMemcpyDtoD(dst, src, nbytes)
            times.append(device.elapsed_ms(start))
        return 2 * nbytes / (statistics.median(times[2:]) * 1e-3) / 1e9
    finally:
        cu.cuMemFree(src)
        cu.cuMemFree(dst)


def time_opfusion(exe: GPUExecutor, repeat: int) -> float:
    exe.execute()  # warm-up (the inputs are already on the device)
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


def torch_peers(fn, args, repeat: int, tf32_rows: bool = False) -> dict[str, float]:
    """Eager and torch.compile times of ``fn``, where torch has CUDA. With ``tf32_rows``
    each is timed twice: with torch's defaults (cuDNN convolutions in TF32 on tensor cores)
    and in plain float32 arithmetic (``allow_tf32`` off), which is what opfusion computes."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    runs = {"torch eager": fn}
    try:
        compiled = torch.compile(fn)
        start = time.perf_counter()
        with torch.no_grad():
            compiled(*args)
        torch.cuda.synchronize()
        print(f"  torch.compile took {time.perf_counter() - start:.1f} s")
        runs["torch.compile"] = compiled
    except Exception as err:  # no triton or a compiler error: report, go on
        print(f"  torch.compile failed: {type(err).__name__}: {err}")
    out = {}
    for name, run in runs.items():
        out[name] = time_torch(run, args, repeat)
    if tf32_rows:
        saved = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            for name, run in runs.items():
                out[f"{name} fp32"] = time_torch(run, args, repeat)
        finally:
            torch.backends.cudnn.allow_tf32 = saved
    return out


def chain_rows(device, repeat: int, bandwidth: float, sweep: bool) -> None:
    x = Var("x", TensorType((CHAIN_ELEMENTS,), "float32"))
    scale, shift = const(np.float32(1.5)), const(np.float32(0.25))
    func = Function([x], op.multiply(op.nn.relu(op.add(op.multiply(x, scale), shift)),
                                     op.sigmoid(x)))
    target = f"cuda -arch={device.arch}"
    data = np.random.default_rng(0).standard_normal(CHAIN_ELEMENTS).astype("float32")
    want = np.maximum(data * 1.5 + 0.25, 0) / (1 + np.exp(-data))
    exe = GPUExecutor(build_gpu_model(func, target=target), device)
    (got,) = exe.run(data)
    error = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    results = {"opfusion": time_opfusion(exe, repeat)}
    exe.close()
    if sweep:
        chain_sweep(func, target)
    try:
        import torch

        if torch.cuda.is_available():
            tx = torch.from_numpy(data).cuda()
            results.update(torch_peers(
                lambda t: torch.relu(t * 1.5 + 0.25) * torch.sigmoid(t), [tx], repeat))
    except ImportError:
        pass
    bound = 2 * data.nbytes / (bandwidth * 1e9) * 1e3
    report(f"elementwise chain, 64M float32 (max error {error:.1e} of the largest output)",
           results, bound)


def product_rows(device, repeat: int, shapes=PRODUCTS) -> None:
    """Each of ``shapes`` as ``x @ w.T`` (nn.dense) in float32 tiles and on tensor cores,
    checked against NumPy, with torch.matmul's times in float32 and in TF32."""
    rng = np.random.default_rng(0)
    for rows, depth, cols in shapes:
        x = rng.standard_normal((rows, depth)).astype("float32")
        w = rng.standard_normal((cols, depth)).astype("float32")
        xv, wv = Var("x", TensorType(x.shape, "float32")), Var("w", TensorType(w.shape, "float32"))
        func = Function([xv, wv], op.nn.dense(xv, wv))
        want = x.astype(np.float64) @ w.astype(np.float64).T
        results = {}
        for label, option in (("opfusion", ""), ("opfusion tf32", " -tf32=1"),
                              ("opfusion tf32 fast", " -tf32=fast")):
            model = build_gpu_model(func, target=f"cuda -arch={device.arch}{option}")
            configs = [k.schedule_config for k in model.kernels if k.schedule_config]
            exe = GPUExecutor(model, device)
            (got,) = exe.run(x, w)
            error = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            results[label] = time_opfusion(exe, repeat)
            print(f"  {label}: {configs[0] if configs else 'no rule'}, max error "
                  f"{error:.1e} of the largest output")
            exe.close()
        try:
            import torch

            if torch.cuda.is_available():
                tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
                saved = torch.backends.cuda.matmul.allow_tf32
                try:
                    for label, allow in (("torch fp32", False), ("torch tf32", True)):
                        torch.backends.cuda.matmul.allow_tf32 = allow
                        results[label] = time_torch(lambda a, b: a @ b.T, [tx, tw], repeat)
                finally:
                    torch.backends.cuda.matmul.allow_tf32 = saved
        except ImportError:
            pass
        report(f"dense {rows} x {depth} x {cols} ({2 * rows * depth * cols / 1e12:.2f} TFLOP)",
               results, None)
        flops = 2 * rows * depth * cols
        print("  " + ", ".join(f"{name} {flops / (ms * 1e-3) / 1e12:.1f} TFLOP/s"
                               for name, ms in results.items()))


def chain_sweep(func, target: str) -> None:
    """Every config of the default schedule (threads, elements and vector steps per
    thread) on the chain, through ``opf.tune`` on the GPU (each checked against the
    reference, timed with events, back to back), to choose the heuristic."""
    result = opf.tune(func, target=target, trials=1000, records=None, confirm=0,
                      options=MeasureOptions(repeat=5))
    records = sorted((r for r in result.records.records if r.ok), key=lambda r: r.seconds)
    print(f"  chain, {len(records)} default-schedule configs (ms):")
    for record in records:
        print(f"    {record.seconds * 1e3:8.3f}  {record.knobs}")


def resnet_rows(device, batch: int, repeat: int, check: bool, profile: int,
                tune_seconds: float, records: str | None, tf32: str | None = None) -> None:
    start = time.perf_counter()
    mod, params = testing.WORKLOADS["resnet50"](batch_size=batch)
    print(f"\n  resnet50 workload (random weights, calibrated) in "
          f"{time.perf_counter() - start:.1f} s")
    target = f"cuda -arch={device.arch}" + (f" -tf32={tf32}" if tf32 else "")
    (image,) = [p for p in mod["main"].params if p.name_hint not in params]
    data = np.random.default_rng(0).standard_normal(
        [int(d) for d in image.type_annotation.shape]).astype("float32")
    want = None
    if check:
        start = time.perf_counter()
        want = evaluate(mod, {image.name_hint: data, **params})
        print(f"  NumPy reference in {time.perf_counter() - start:.0f} s")
        if tf32:
            with tf32_operands():
                rounded = evaluate(mod, {image.name_hint: data, **params})
            error = float(np.max(np.abs(rounded - want)) / np.max(np.abs(want)))
            print(f"  the reference with TF32-rounded operands is {error:.1e} of the largest "
                  "output from it (what TF32 arithmetic alone moves)")
            want = rounded
    results = {"opfusion": opfusion_row(device, mod, params, target, data, want, repeat,
                                        profile, None)}
    if tf32:  # the other way to give the tensor cores their operands
        other = "fast" if tf32 == "1" else "1"
        results[f"opfusion -tf32={other}"] = opfusion_row(
            device, mod, params, target.replace(f"-tf32={tf32}", f"-tf32={other}"), data,
            want, repeat, 0, None)
    if tune_seconds:
        start = time.perf_counter()
        tuned = opf.tune(mod, params, target=target, trials=100000, seconds=tune_seconds,
                         records=records, options=MeasureOptions(repeat=3))
        print(f"  tuned {len(tuned.tasks)} tasks with {sum(t.trials for t in tuned.tasks)} "
              f"candidates in {time.perf_counter() - start:.0f} s; per task (default -> "
              "best, ms):")
        for task in tuned.tasks:
            if task.default_seconds and task.best_seconds:
                print(f"    {task.task.name:<40} x{task.task.weight}  "
                      f"{task.default_seconds * 1e3:8.3f} -> {task.best_seconds * 1e3:8.3f}  "
                      f"{task.best_config}")
        results["opfusion tuned"] = opfusion_row(device, mod, params, target, data, want,
                                                 repeat, profile, tuned.records)
    try:
        import torch
        import torchvision

        if torch.cuda.is_available():
            net = torchvision.models.resnet50().eval().cuda()
            results.update(torch_peers(net, [torch.from_numpy(data).cuda()], repeat,
                                       tf32_rows=True))
    except ImportError:
        print("  (torch or torchvision missing: no peers for resnet50)")
    report(f"resnet50, batch {batch}", results, None)


#: The product sweep's tiles (warps_m, warps_n, tiles_m, tiles_n): blocks of 128 x 128 to
#: 64 x 64, warp tiles of 64 x 64 to 32 x 32, the largest first (past 48 KiB of tiles they
#: take dynamic shared memory).
PRODUCT_TILES = ((2, 2, 4, 8), (4, 2, 2, 8), (2, 4, 4, 4), (4, 4, 2, 4), (2, 2, 4, 4),
                 (2, 2, 2, 8), (2, 1, 4, 8), (1, 2, 4, 8), (2, 2, 2, 4))

#: Each tile's pipelines in the product sweep: (k_step, double_buffer, async_stages).
PRODUCT_PIPELINES = ((16, False, 0), (32, False, 0), (16, True, 0), (32, True, 0),
                     (16, False, 2), (16, False, 3), (32, False, 2), (8, False, 3))


def product_sweep(device, seconds_cap: float, shape=(4096, 4096, 4096), mode: str = "1"
                  ) -> None:
    """The tensor-core product ``shape`` (rows, contraction, columns; nn.dense, TF32)
    through the GPU runner in :data:`PRODUCT_TILES` x :data:`PRODUCT_PIPELINES` where the
    rule's space admits them (each checked against the reference first): TFLOP/s per config,
    best first. What the product kernel reaches by its tiles and pipelines alone, beside
    cuBLAS's figure in ``--products``; ``mode``: ``-tf32=`` 1 or fast."""
    from opfusion.autotune.gpu_runner import GPURunner
    from opfusion.autotune.measure import generate_candidates, task_data
    from opfusion.autotune.task import extract_tasks

    rows, depth, cols = shape
    xv = Var("x", TensorType((rows, depth), "float32"))
    wv = Var("w", TensorType((cols, depth), "float32"))
    func = Function([xv, wv], op.nn.dense(xv, wv))
    (task,) = [t for t in extract_tasks(func, {}, f"cuda -arch={device.arch} -tf32={mode}")
               if t.rule == "gpu_mma"]
    configs = []
    for (wm, wn, tm, tn), (k_step, double, stages) in itertools.product(PRODUCT_TILES,
                                                                       PRODUCT_PIPELINES):
        try:
            configs.append(task.space.config(
                warps_m=wm, warps_n=wn, tiles_m=tm, tiles_n=tn, k_step=k_step, shared=True,
                double_buffer=double, async_stages=stages))
        except ScheduleError:
            continue
    configs = [task.default] + [c for c in configs if dict(c) != dict(task.default)]
    print(f"\n  product sweep: {rows} x {depth} x {cols}, -tf32={mode}, {len(configs)} configs "
          f"(default first: {dict(task.default)})")
    runner = GPURunner(device)
    flops = 2.0 * rows * depth * cols
    timed = []
    start = time.perf_counter()
    for config in configs:
        if time.perf_counter() - start > seconds_cap:
            print("  (time cap reached)")
            break
        (result,) = runner.run(task_data(task), generate_candidates(task, [config]),
                               MeasureOptions(repeat=3))
        if result.ok:
            timed.append((result.seconds, config))
        else:
            print(f"    failed {dict(config)}: {result.error[:100]}")
    for seconds, config in sorted(timed, key=lambda item: item[0]):
        mark = " (default)" if dict(config) == dict(task.default) else ""
        print(f"    {seconds * 1e3:8.3f} ms {flops / seconds / 1e12:6.1f} TFLOP/s  "
              f"{dict(config)}{mark}")


#: The staged-store sweep's variants of each tensor-core convolution (besides its default
#: and the earlier heuristic's config): block tiles and pixels, staged, single-buffered.
STAGING_VARIANTS = tuple(
    {"warps_m": wm, "warps_n": wn, "tiles_m": tm, "tiles_n": tn, "pixels": pixels}
    for wm, wn, tm, tn, pixels in ((2, 2, 2, 2, 2), (2, 1, 2, 2, 4), (2, 1, 2, 2, 8),
                                   (1, 2, 2, 2, 4), (2, 2, 1, 2, 4), (2, 2, 2, 1, 4),
                                   (2, 1, 2, 2, 7), (4, 1, 2, 2, 2)))


#: The sweep's larger warp tiles (64 channels or 32 images a warp: fewer operand loads per
#: instruction; past 48 KiB of tiles they take dynamic shared memory), each with the
#: default's staging and pipeline.
WIDE_VARIANTS = tuple(
    {"warps_m": wm, "warps_n": wn, "tiles_m": tm, "tiles_n": tn, "pixels": pixels}
    for wm, wn, tm, tn, pixels in ((2, 1, 4, 2, 4), (1, 2, 4, 2, 4), (2, 2, 4, 2, 2),
                                   (2, 1, 4, 4, 2), (1, 1, 4, 4, 4)))


def async_variant(task, stages: int):
    """The default config with its copies async (``async_stages``), its contraction in
    8-channel steps where the default's steps would leave one; None where it does not fit."""
    for k_step in dict.fromkeys((task.default["k_step"], 8)):
        try:
            return task.space.config(**{**task.default, "async_stages": stages,
                                        "double_buffer": False, "k_step": k_step})
        except ScheduleError:
            continue
    return None


def staging_rows(device, batch: int, seconds_cap: float, mode: str = "1") -> None:
    """Each tensor-core convolution of resnet50 (TF32) through the GPU runner: the default,
    the default with ``staged_store`` flipped, the default with async copies two and three
    steps deep (:func:`async_variant`), :data:`STAGING_VARIANTS` staged and
    :data:`WIDE_VARIANTS` as the default stages; ms per config and the sums weighted by the
    layers' counts."""
    from opfusion.autotune.gpu_runner import GPURunner
    from opfusion.autotune.measure import generate_candidates, task_data
    from opfusion.autotune.task import extract_tasks

    mod, params = testing.WORKLOADS["resnet50"](batch_size=batch)
    tasks = [t for t in extract_tasks(mod, params, f"cuda -arch={device.arch} -tf32={mode}")
             if t.rule == "gpu_conv2d_mma"]
    runner = GPURunner(device)
    totals = {"default": 0.0, "flipped": 0.0, "async2": 0.0, "async3": 0.0, "best": 0.0}
    start = time.perf_counter()
    print(f"\n  staged stores: {len(tasks)} tensor-core convolutions (ms; weight x)")
    for task in tasks:
        if time.perf_counter() - start > seconds_cap:
            print("  (time cap reached)")
            break
        named = {"default": task.default, "async2": async_variant(task, 2),
                 "async3": async_variant(task, 3)}
        flip = {**task.default, "staged_store": not task.default["staged_store"]}
        variants = [("flipped", flip)] + [
            (f"v{i}", {**task.default, **v, "staged_store": True, "double_buffer": False})
            for i, v in enumerate(STAGING_VARIANTS)] + [
            (f"w{i}", {**task.default, **v}) for i, v in enumerate(WIDE_VARIANTS)]
        for label, values in variants:
            try:
                named[label] = task.space.config(**values)
            except ScheduleError:  # does not fit this convolution
                continue
        labels = [k for k, v in named.items() if v is not None]
        results = runner.run(task_data(task), generate_candidates(task, [named[k]
                                                                         for k in labels]),
                             MeasureOptions(repeat=3))
        times = {k: (r.seconds * 1e3 if r.ok else None) for k, r in zip(labels, results)}
        errors = [f"{k}: {r.error[:80]}" for k, r in zip(labels, results) if not r.ok]
        ok = [t for t in times.values() if t is not None]
        for key in ("default", "flipped", "async2", "async3"):
            totals[key] += task.weight * (times.get(key) or times.get("default") or 0.0)
        totals["best"] += task.weight * (min(ok) if ok else 0.0)
        best = min((t, k) for k, t in times.items() if t is not None) if ok else (0, "-")
        print(f"    {task.name:<34} x{task.weight}  "
              + " ".join(f"{k}={t:.3f}" for k, t in times.items() if t is not None)
              + f"  best {best[1]}: {dict(named[best[1]]) if ok else ''}")
        for line in errors:
            print(f"      failed {line}")
    print("  weighted sums (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in totals.items()))


@contextlib.contextmanager
def tf32_operands():
    """The reference interpreter with the operands of convolutions and products rounded to
    TF32 as the tensor cores round them (``cvt.rna``: 10 bits of mantissa, ties away), so
    that a TF32 build can be checked to float32's accuracy, not TF32's."""
    from opfusion.ir.op import get_op
    from opfusion.tir.mma import round_tf32_array as rounded

    ops = [get_op(name) for name in ("nn.conv2d", "nn.dense", "nn.matmul", "nn.batch_matmul")]
    saved = [o.reference for o in ops]
    try:
        for o, reference in zip(ops, saved):
            o.reference = (lambda x, w, *a, _ref=reference, **k:
                           _ref(rounded(x), rounded(w), *a, **k))
        yield
    finally:
        for o, reference in zip(ops, saved):
            o.reference = reference


def opfusion_row(device, mod, params, target: str, data, want, repeat: int, profile: int,
                 records) -> float:
    """Build resnet50 for the GPU (with ``records``' configs when given), check it against
    ``want``, time it and print its slowest groups."""
    start = time.perf_counter()
    model = build_gpu_model(mod, params, target, records=records)
    exe = GPUExecutor(model, device)
    launches = sum(len(g.launches) for g in model.source.groups)
    label = "tuned" if records is not None else "default configs"
    print(f"  resnet50 ({label}): {len(model.kernels)} kernels, {launches} launches, built "
          f"and compiled in {time.perf_counter() - start:.1f} s")
    (got,) = exe.run(data)
    if want is not None:
        error = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        print(f"  max error {error:.1e} of the largest output against the NumPy reference")
    ms = time_opfusion(exe, repeat)
    if profile:
        print_profile(model, exe.profile(data), profile)
    exe.close()
    return ms


def print_profile(model, times: list[tuple[str, float]], count: int) -> None:
    """The ``count`` slowest groups of one profiled run: time, kind, TFLOP/s of products and
    convolutions, and the schedule config (what a lease needs to tell a slow tile from a
    slow kind of layer)."""
    from profile_kinds import kind_and_flops

    groups = {g.name: g for g in model.kernels}
    total = sum(t for _, t in times)
    print(f"  slowest groups (of {total:.2f} ms with a sync per group):")
    for name, t in sorted(times, key=lambda t: -t[1])[:count]:
        group = groups.get(name)
        kind, flops = kind_and_flops(group) if group is not None else ("", 0.0)
        rate = f"{flops / (t * 1e-3) / 1e12:6.1f} TFLOP/s" if flops and t > 0 else " " * 14
        config = (group.schedule_config or {}) if group is not None else {}
        knobs = " ".join(f"{k}={v}" for k, v in config.get("knobs", {}).items())
        print(f"    {t:8.3f} ms  {rate}  {name}  {kind}  {config.get('rule', '')} {knobs}")


def report(title: str, results: dict[str, float], bound: float | None) -> None:
    print(f"\n{title}")
    base = results["opfusion"]
    for name, ms in results.items():
        ratio = "" if name == "opfusion" else f"  opfusion/this {base / ms:.2f}x"
        print(f"  {name:<22} {ms:9.3f} ms{ratio}")
    if bound is not None:
        print(f"  bandwidth bound {bound:.3f} ms (measured copy); "
              + ", ".join(f"{name} at {ms / bound:.2f}x of it" for name, ms in results.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--no-check", action="store_true",
                        help="skip the resnet50 comparison with the NumPy reference")
    parser.add_argument("--profile", type=int, default=12, metavar="N",
                        help="print resnet50's N slowest groups (0: none)")
    parser.add_argument("--tune", type=float, default=0.0, metavar="SECONDS",
                        help="also tune resnet50's groups on the GPU for about this long and "
                             "time the tuned model, and time every config of the chain's")
    parser.add_argument("--sweep", action="store_true",
                        help="time every config of the chain's default schedule (--tune "
                             "does too)")
    parser.add_argument("--records", default=None,
                        help="where the tuning records go (default: kept in memory)")
    parser.add_argument("--products", action="store_true",
                        help="first time three large products in float32 and in TF32")
    parser.add_argument("--product-sweep", type=float, default=0.0, metavar="SECONDS",
                        help="time the 4096-square TF32 product in the tiles and pipelines "
                             "of PRODUCT_TILES x PRODUCT_PIPELINES (for about this long)")
    parser.add_argument("--skip", default="", metavar="WORKLOADS",
                        help="comma-separated workloads not to run (chain, resnet50): a short "
                             "lease's second call")
    parser.add_argument("--staging", type=float, default=0.0, metavar="SECONDS",
                        help="time resnet50's tensor-core convolutions with and without "
                             "staged stores, with async copies 2 and 3 steps deep, and in "
                             "other staged tiles (for about this long)")
    parser.add_argument("--tf32", nargs="?", const="1", default=None, choices=("1", "fast"),
                        help="build resnet50 with -tf32=1 (products on tensor cores; "
                             "--tf32 fast: -tf32=fast), and time the other mode too")
    args = parser.parse_args()
    try:
        device = cuda_device()
    except DeviceError as err:
        print(f"no GPU to measure on: {err}")
        return 0
    bandwidth = copy_bandwidth_gbs(device)
    print(f"device: {device.name} ({device.arch}); device-to-device copy "
          f"{bandwidth:.0f} GB/s (read + write)")
    if args.products:
        product_rows(device, args.repeat)
    if args.product_sweep:
        product_sweep(device, args.product_sweep, mode=args.tf32 or "1")
    skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    if "chain" not in skip:
        chain_rows(device, args.repeat, bandwidth, bool(args.tune) or args.sweep)
    if args.staging:
        staging_rows(device, args.batch, args.staging, mode=args.tf32 or "1")
    if "resnet50" not in skip:
        resnet_rows(device, args.batch, args.repeat, not args.no_check, args.profile,
                    args.tune, args.records, args.tf32)
    return 0


if __name__ == "__main__":
    sys.exit(main())
