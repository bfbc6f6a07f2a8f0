"""Helpers of the tests of products and convolutions of 8-bit words: the targets with and
without word products, random codes, and one-function modules."""

import numpy as np

import opfusion as opf
from opfusion.ir.expr import Function
from opfusion.ir.module import IRModule
from opfusion.ir.visitor import post_order
from opfusion.target import Target, host_target

VNNI = Target("c -mattr=+avx512f,+avx512dq,+avx512bw,+avx512vl,+avx2,+fma,+avx512vnni")
AVX512 = Target("c -mattr=+avx512f,+avx512dq,+avx512bw,+avx512vl,+avx2,+fma")
AVX2 = Target("c -mattr=+avx2,+fma")
AVXVNNI = Target("c -mattr=+avx2,+fma,+avxvnni")  # Intel's client cores: VNNI without AVX-512
SSE = Target("c -mattr=+sse4.2")


def runs_here(target):
    """Whether the host runs ``target``'s code."""
    return set(target.features) <= set(host_target().features)


def random_codes(rng, shape, dtype):
    """Uniform values over the whole range of the integer ``dtype``."""
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def module(expr):
    """A type-checked module of one function of ``expr``'s free variables."""
    params = [n for n in post_order(expr) if isinstance(n, opf.ir.Var)]
    return opf.transform.InferType()(IRModule.from_expr(Function(params, expr)))
