"""PyTorch models three ways: eager, ``torch.compile`` (Inductor) and
``torch.compile(backend="opfusion")`` — latency and compile time, in one run.

    python benchmarks/torch_models.py [names...] [--repeat 30] [--no-inductor]

Models (default: all): torchvision's resnet18, mobilenet_v3_small, efficientnet_b0 and vit_b_16
(needs torchvision), ``encoder`` (a 2-layer ``nn.TransformerEncoder``, d_model 256, 8 heads,
input (1, 128, 256)) and ``gpt`` (a GPT-style block, d_model 256, 8 heads, causal, input
(1, 128, 256)), all with random calibrated weights (opfusion.testing.torch_models); batch 1,
standard-normal input, under ``torch.inference_mode()``, every engine on the host's cores.

Compile time is the first call of the compiled model (dynamo's trace, the backend's
compilation and one run), cold for both: opfusion's kernel cache and Inductor's caches point
at an empty folder and Inductor's FX graph cache is off. Latencies are medians of batches
timed interleaved (``overhead.interleaved``, as ``models.py``: a drifting machine moves every
engine alike). ``max diff`` is the largest
difference of a compiled model's output from eager's, relative to eager's largest value.
Ratios ``eager/opf`` and ``ind/opf`` are the other engine's time over opfusion's (above 1,
opfusion is faster). The header names the CPU, its ISA and the load: quote a table only from
a quiet machine."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

from models import BATCH_SECONDS, SETTLE_SECONDS, geomean
from overhead import interleaved

from opfusion.target import Target, host_cpu_name

TORCHVISION_NAMES = ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "vit_b_16"]
BLOCK_NAMES = ["encoder", "gpt"]
TOKENS, WIDTH, HEADS = 128, 256, 8


def build(name: str) -> tuple[Any, Any]:
    """The model and its input."""
    import torch

    from opfusion.testing import torch_models

    if name == "encoder":
        model = torch_models.transformer_encoder(WIDTH, HEADS)
        return model, torch.randn(1, TOKENS, WIDTH)
    if name == "gpt":
        return torch_models.gpt_block(WIDTH, HEADS), torch.randn(1, TOKENS, WIDTH)
    return torch_models.torchvision_model(name), torch.randn(torch_models.TORCHVISION_INPUT)


def first_call(fn: Callable[[Any], Any], x: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn(x)
    return out, time.perf_counter() - start


def relative_diff(got: Any, want: Any) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))


def compare(name: str, repeat: int, with_inductor: bool) -> dict[str, float]:
    import torch

    model, x = build(name)
    row: dict[str, float] = {}
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = model(x)
        engines = {"eager": model}
        backends = (["inductor"] if with_inductor else []) + ["opfusion"]
        for backend in backends:
            torch._dynamo.reset()
            compiled = torch.compile(model, backend=backend)
            out, seconds = first_call(compiled, x)
            row[f"{backend} compile"] = seconds
            row[f"{backend} diff"] = relative_diff(out, expected)
            engines[backend] = compiled
        for fn in engines.values():
            fn(x)
        times = interleaved([lambda fn=fn: fn(x) for fn in engines.values()], repeat, batch=1,
                            batch_seconds=BATCH_SECONDS, settle_seconds=SETTLE_SECONDS)
    row.update({engine: t for engine, t in zip(engines, times)})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="models (default: all)")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--no-inductor", action="store_true")
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="torch_models_")
    # Cold compiles for both compilers: empty kernel caches (set before torch is imported).
    os.environ["OPFUSION_CACHE_DIR"] = os.path.join(cache, "opfusion")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache, "inductor")
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
    import torch

    names = args.names or TORCHVISION_NAMES + BLOCK_NAMES
    host = Target("c")
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, cpu: {host_cpu_name()}, ISA {host.isa}, "
          f"{host.num_cores} cores, torch {torch.__version__} ({torch.get_num_threads()} "
          f"threads); load {os.getloadavg()[0]:.2f}")
    inductor = not args.no_inductor
    header = f"{'model':<20}{'eager ms':>10}"
    header += f"{'inductor ms':>13}" if inductor else ""
    header += f"{'opf ms':>9}{'eager/opf':>11}" + (f"{'ind/opf':>9}" if inductor else "")
    header += (f"{'ind compile s':>15}" if inductor else "") + f"{'opf compile s':>15}"
    header += f"{'opf diff':>10}"
    print(header)
    ratios: dict[str, list[float]] = {"eager": [], "inductor": []}
    try:
        for name in names:
            row = compare(name, args.repeat, inductor)
            line = f"{name:<20}{row['eager'] * 1e3:>10.2f}"
            line += f"{row['inductor'] * 1e3:>13.2f}" if inductor else ""
            line += f"{row['opfusion'] * 1e3:>9.2f}{row['eager'] / row['opfusion']:>11.2f}"
            ratios["eager"].append(row["eager"] / row["opfusion"])
            if inductor:
                line += f"{row['inductor'] / row['opfusion']:>9.2f}"
                line += f"{row['inductor compile']:>15.1f}"
                ratios["inductor"].append(row["inductor"] / row["opfusion"])
            line += f"{row['opfusion compile']:>15.1f}{row['opfusion diff']:>10.1e}"
            print(line, flush=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    summary = f"geomean eager/opfusion {geomean(ratios['eager']):.2f}"
    if inductor:
        summary += f" inductor/opfusion {geomean(ratios['inductor']):.2f}"
    print(summary)
    print(f"# load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
