"""``python -m opfusion``: the command line. ``demo`` shows the pipeline on a built-in graph."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .errors import OpfusionError


def demo() -> int:
    """Build seed 000's example graph, print it, parse the text back and evaluate it."""
    from .ir import evaluate, parse, structural_equal
    from .testing.examples import seed_example

    mod = seed_example()
    print("The example graph (seed 000): conv2d -> add -> relu, conv2d * 0.5, add\n")
    print(mod.astext(show_meta_data=False))
    text = str(mod)
    start = time.perf_counter()
    parsed = parse(text)
    elapsed_ms = 1e3 * (time.perf_counter() - start)
    print(f"\nprinted {len(text)} characters; parsed back in {elapsed_ms:.1f} ms; "
          f"structurally equal: {structural_equal(parsed, mod)}")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 3)).astype(np.float32)
    out = evaluate(mod, {"x": x, "weight": w})
    print(f"reference interpreter: output {out.dtype}{list(out.shape)}, "
          f"mean {out.mean():.4f}, max {out.max():.4f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="opfusion", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="build, print, parse and evaluate a built-in graph")
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return demo()
    except OpfusionError as err:
        if args.debug:
            raise
        print(f"opfusion: error: {err}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
