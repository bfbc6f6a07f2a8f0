"""The kernel-level hello world: a vector addition written as a tensor expression, scheduled
(split, parallel, vectorize), lowered to loop IR, compiled to C and run.

    python examples/hello_kernel.py
"""

import numpy as np

import opfusion as opf
from opfusion import te

n = 1024
A = te.placeholder((n,), name="A")
B = te.placeholder((n,), name="B")
C = te.compute(A.shape, lambda i: A[i] + B[i], name="C")   # what to compute

s = te.create_schedule(C.op)                               # how to compute it
outer, inner = s[C].split(C.op.axis[0], factor=64)
s[C].parallel(outer)
s[C].vectorize(inner)
print(opf.lower(s, [A, B, C]))                             # the loop IR

vecadd = opf.build(s, [A, B, C], target="c", name="vecadd")
print(vecadd.get_source())                                 # the generated C

rng = np.random.default_rng(0)
a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
c = np.empty(n, np.float32)
vecadd(a, b, c)                                            # numpy arrays in place
np.testing.assert_array_equal(c, a + b)
print("vecadd(a, b) == a + b")
