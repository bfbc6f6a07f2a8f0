"""Graph transformations: the pass infrastructure and the passes that prepare a graph for
fusion (and fusion itself).

Every pass is a :class:`Pass` — call it on an IRModule to get a new IRModule::

    with opf.transform.PassContext(opt_level=3, instruments=[PassTimingInstrument()]):
        mod = opf.transform.optimize(mod, params)
"""

from .context import ConfigOption, PassContext, list_pass_configs, register_pass_config
from .instrument import DumpIR, PassInstrument, PassTiming, PassTimingInstrument, PrintIR
from .pass_infra import (
    FunctionPass,
    ModulePass,
    Pass,
    PassInfo,
    Sequential,
    function_pass,
    get_pass,
    module_pass,
    register_pass,
)

__all__ = [
    "ConfigOption", "DumpIR", "FunctionPass", "ModulePass", "Pass", "PassContext", "PassInfo",
    "PassInstrument", "PassTiming", "PassTimingInstrument", "PrintIR", "Sequential",
    "function_pass", "get_pass", "list_pass_configs", "module_pass", "register_pass",
    "register_pass_config",
]
