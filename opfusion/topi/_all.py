"""Import every module that registers computes or schedules (keeps registration in one place)."""

import importlib

for _name in ("elemwise", "broadcast", "reduce", "transform", "image", "nn", "nn_pool",
              "nn_norm"):
    try:
        importlib.import_module(f"{__package__}.{_name}")
    except ModuleNotFoundError as _err:  # a family not written yet
        if _err.name != f"{__package__}.{_name}":
            raise
