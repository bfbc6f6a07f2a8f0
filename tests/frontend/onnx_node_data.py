"""The ONNX backend suite's node tests, generated once into a cache and loaded from there.

The onnx wheel ships no per-node test data: its runner rebuilds the ~1900 node cases in memory
from the case definitions (``onnx.backend.test.case.node``) in every process, with unseeded
``np.random`` inputs, so each run would test other numbers. Here they are generated once, in a
subprocess with ``np.random.seed(0)``, into
``<cache>/onnx-node-tests/<onnx version>/generated-node``
(``<cache>`` is ``$OPFUSION_CACHE_DIR``, else ``$XDG_CACHE_HOME/opfusion``, else
``~/.cache/opfusion``). The tree is written beside its final place and renamed into it, so it
is either complete or absent. It has the layout of the wheel's other on-disk kinds
(``<test>/model.onnx``, ``<test>/test_data_set_0/{input,output}_<i>.pb``, ``data.json`` with
the case's tolerances) and loads with ``onnx.backend.test.loader.load_model_tests``.

Used by ``test_onnx_backend.py`` and ``benchmarks/onnx_backend_report.py``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx
from onnx.backend.test.case.test_case import TestCase
from onnx.backend.test.loader import load_model_tests

KIND = "generated-node"  # not "node": the loader builds that kind in memory instead
SEED = 0


def cache_root() -> Path:
    if os.environ.get("OPFUSION_CACHE_DIR"):
        return Path(os.environ["OPFUSION_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "opfusion"


def node_data_dir() -> Path:
    """The directory holding ``generated-node/<test name>/...``, generated on first use."""
    root = cache_root() / "onnx-node-tests" / onnx.__version__
    if not (root / KIND).is_dir():
        _generate(root)
    return root


def load_node_tests() -> list[TestCase]:
    """The node test cases (``model_dir`` set, loaded lazily by the runner), by name."""
    cases = load_model_tests(data_dir=str(node_data_dir()), kind=KIND)
    return sorted(cases, key=lambda case: case.name)


def _generate(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{KIND}-", dir=root))
    try:
        # A fresh interpreter: the case modules draw their inputs at import time, so the seed
        # only holds if nothing imported them before.
        subprocess.run([sys.executable, __file__, str(scratch)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            os.rename(scratch / KIND, root / KIND)
        except OSError:
            if not (root / KIND).is_dir():  # not another process that won the race
                raise
    except subprocess.CalledProcessError as err:
        raise RuntimeError(f"generating the ONNX node tests failed:\n{err.stderr}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _write_cases(out: Path) -> None:
    """Write every node case under ``out/node`` (runs in the subprocess)."""
    import json
    import warnings

    import numpy as np

    np.random.seed(SEED)
    warnings.simplefilter("ignore")
    from onnx.backend.test.loader import load_node_model_tests

    for case in load_node_model_tests():
        case_dir = out / KIND / case.name
        case_dir.mkdir(parents=True)
        (case_dir / "model.onnx").write_bytes(case.model.SerializeToString())
        (case_dir / "data.json").write_text(json.dumps({"rtol": case.rtol, "atol": case.atol}))
        graph = case.model.graph
        for index, (inputs, outputs) in enumerate(case.data_sets):
            data_dir = case_dir / f"test_data_set_{index}"
            data_dir.mkdir()
            for prefix, values, infos in (("input", inputs, graph.input),
                                          ("output", outputs, graph.output)):
                for j, value in enumerate(values):
                    proto = _to_proto(value, infos[j])
                    (data_dir / f"{prefix}_{j}.pb").write_bytes(proto.SerializeToString())


def _to_proto(value, info):
    """``value`` as the proto its value info calls for (as onnx's cmd_tools writes it)."""
    from onnx import numpy_helper

    kind = info.type.WhichOneof("value")
    if kind == "map_type":
        return numpy_helper.from_dict(value, info.name)
    if kind == "sequence_type":
        return numpy_helper.from_list(value, info.name)
    if kind == "optional_type":
        return numpy_helper.from_optional(value, info.name)
    if isinstance(value, onnx.TensorProto):
        return value
    return numpy_helper.from_array(value, info.name)


if __name__ == "__main__":
    _write_cases(Path(sys.argv[1]))
