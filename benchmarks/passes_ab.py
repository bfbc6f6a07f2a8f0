"""One model compiled with and without a pass or a compile option, timed interleaved.

    python benchmarks/passes_ab.py resnet50 --disable MergeParallelProducts
    python benchmarks/passes_ab.py densenet121 --config compile.inplace_concatenate=false
    python benchmarks/passes_ab.py bert_layer --disable MergeParallelProducts --repeat 300

The model (a light, vision or transformer model's name, or an .onnx file, as
``benchmarks/models.py`` takes them) is compiled twice in one process: with the pass context's
defaults (``A``), and with the passes named by ``--disable`` disabled and the options of
``--config key=value`` set (``B``; true/false, integers and other strings as given). Both are
checked against each other, then timed in alternating batches (``overhead.interleaved``, a
pause before each batch), so a drifting machine favours neither; the line printed gives each
median and ``B / A`` (above 1: the defaults are faster). Check that the machine is quiet
(``uptime``) first, and run it twice: on a virtual machine whose host is busy, the ratio of
two runs minutes apart can differ by several per cent."""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np
from models import model_path
from overhead import interleaved

import opfusion as opf


def option(text: str) -> tuple[str, Any]:
    """``key=value`` as the pass context's config entry (true/false, an int, or the text)."""
    key, _, value = text.partition("=")
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    try:
        return key, int(value)
    except ValueError:
        return key, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--disable", action="append", default=[], metavar="PASS")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--repeat", type=int, default=100)
    args = parser.parse_args()
    mod, params = opf.frontend.from_onnx(model_path(args.model))
    config = dict(option(text) for text in args.config)
    with opf.transform.PassContext(opt_level=3):
        default = opf.compile(mod, params=params)
    with opf.transform.PassContext(opt_level=3, disabled_pass=args.disable, config=config):
        changed = opf.compile(mod, params=params)
    x = np.random.default_rng(0).standard_normal(default.get_inputs()[0].shape).astype(
        np.float32)
    want = default.run([x])[0]
    diff = float(np.abs(changed.run([x])[0] - want).max() / max(np.abs(want).max(), 1e-30))
    a, b = interleaved([lambda: default.run([x]), lambda: changed.run([x])], args.repeat,
                       batch=3, batch_seconds=0.2, settle_seconds=0.05)
    what = ", ".join([*(f"without {p}" for p in args.disable),
                      *(f"{k}={v}" for k, v in config.items())]) or "the same"
    print(f"# {args.model}: ISA {opf.Target('c').isa}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f}; B: {what}; max diff {diff:.1e}")
    print(f"A {a * 1e3:.3f} ms ({len(default.steps)} kernels)  B {b * 1e3:.3f} ms "
          f"({len(changed.steps)} kernels)  B/A {b / a:.3f}x")


if __name__ == "__main__":
    main()
