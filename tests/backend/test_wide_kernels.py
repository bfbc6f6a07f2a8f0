"""A kernel with more parameters than ctypes takes in one prototype (1024) is called through
its thunk: a concatenation of 1100 computed values compiles, runs and profiles."""

import numpy as np

import opfusion as opf
from opfusion import op
from opfusion.ir.expr import Var
from opfusion.ir.types import TensorType


def test_concatenation_of_1100_values_runs_through_the_thunk():
    values = [Var(f"x{i}", TensorType((1, 2), "float32")) for i in range(1100)]
    func = opf.ir.Function(values, op.concatenate([op.exp(v) for v in values], axis=0))
    exe = opf.compile(func)
    feeds = {f"x{i}": np.full((1, 2), i / 1000, np.float32) for i in range(1100)}
    (out,) = exe.run(feeds)
    np.testing.assert_allclose(out, np.exp(np.concatenate(list(feeds.values()))), rtol=1e-6)
    assert exe.profile(feeds, repeat=1) is not None
