"""Import every module that registers computes or schedules (keeps registration in one place)."""

from . import (  # noqa: F401  (each module registers its computes on import)
    broadcast,
    elemwise,
    gpu,
    image,
    nn,
    nn_attention,
    nn_norm,
    nn_pool,
    reduce,
    transform,
)
