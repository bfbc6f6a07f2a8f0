"""Graph transformations: the pass infrastructure and the passes that prepare a graph for
fusion (and fusion itself).

Every pass is made by a factory, as in TVM — ``InferType()``, ``FoldConstant()``,
``FuseOps(fuse_opt_level=3)`` — and the :class:`Pass` it returns is called on an IRModule to
get a new IRModule: ``mod = opf.transform.FoldConstant()(mod)``. ::

    with opf.transform.PassContext(opt_level=3, instruments=[PassTimingInstrument()]):
        mod = opf.transform.optimize(mod, params)
"""

from .alter_op_layout import AlterOpLayout, alter_op_layout
from .common_subexpr import EliminateCommonSubexpr
from .context import ConfigOption, PassContext, list_pass_configs, register_pass_config
from .dead_code import DeadCodeElimination
from .fold_channel_shuffle import FoldChannelShuffle
from .fold_constant import BindParams, FoldConstant, bind_params, fold_constant
from .fold_scale_axis import BackwardFoldScaleAxis, FoldScaleAxis, ForwardFoldScaleAxis
from .fuse import (
    FuseOptions,
    FusionGroup,
    FusionPlan,
    FusionRefusal,
    FusionReport,
    InvalidFusionError,
    check_fused_module,
    check_fusion_plan,
    explain_fusion,
    fusion_to_dot,
    plan_fusion,
    render_fusion_svg,
)
from .fuse_attention import FuseAttention
from .fuse_ops import FuseOps
from .fusion import (
    FusionMerge,
    HorizontalFusePass,
    InputFusePass,
    RecomputeFusePass,
    VerticalFusePass,
    register_fusion_policy,
    registered_policies,
    unregister_fusion_policy,
)
from .fusion_strategy import (
    FusionStrategy,
    fusion_strategies,
    get_fusion_strategy,
    register_fusion_strategy,
    unregister_fusion_strategy,
)
from .infer_type import InferType
from .instrument import DumpIR, PassInstrument, PassTiming, PassTimingInstrument, PrintIR
from .legalize_checked_indices import LegalizeCheckedIndices
from .merge_parallel_products import MergeParallelProducts
from .optimize import optimization_passes, optimize
from .pack_matmul_weights import PackMatmulWeights
from .pad_channel_blocks import PadChannelBlocks
from .pad_conv_channels import PadConvChannels
from .pass_infra import (
    FunctionPass,
    ModulePass,
    Pass,
    PassInfo,
    Sequential,
    function_pass,
    get_pass,
    module_pass,
    pass_factory,
    register_pass,
)
from .pattern import (
    Bindings,
    Pattern,
    has_attr,
    has_dtype,
    has_shape,
    has_type,
    is_constant,
    is_expr,
    is_op,
    is_tuple,
    is_tuple_get_item,
    is_var,
    wildcard,
)
from .pattern_rewrite import PatternCallback, PatternRewrite, rewrite, rule
from .rewrites import FuseDenseAdd, FuseMultiplyAdd
from .round_tf32_weights import RoundTF32Weights
from .simplify_expr import SimplifyExpr
from .simplify_inference import SimplifyInference
from .tabulate_codes import TabulateCodes
from .word_convolutions import WordConvolutions

__all__ = [
    "AlterOpLayout", "BackwardFoldScaleAxis", "BindParams", "Bindings", "ConfigOption",
    "DeadCodeElimination", "DumpIR", "EliminateCommonSubexpr", "FoldChannelShuffle",
    "FoldConstant", "FoldScaleAxis",
    "ForwardFoldScaleAxis", "FunctionPass", "FuseAttention", "FuseDenseAdd", "FuseMultiplyAdd",
    "FuseOps", "FuseOptions", "FusionGroup", "FusionMerge", "FusionPlan", "FusionRefusal",
    "FusionReport",
    "FusionStrategy", "HorizontalFusePass", "InferType", "InputFusePass", "InvalidFusionError",
    "LegalizeCheckedIndices", "MergeParallelProducts", "ModulePass", "PackMatmulWeights",
    "PadChannelBlocks", "PadConvChannels", "Pass",
    "PassContext",
    "PassInfo", "PassInstrument", "PassTiming", "PassTimingInstrument", "Pattern",
    "PatternCallback", "PatternRewrite", "PrintIR",
    "RecomputeFusePass", "RoundTF32Weights", "Sequential", "SimplifyExpr", "SimplifyInference",
    "TabulateCodes",
    "VerticalFusePass", "WordConvolutions",
    "alter_op_layout", "bind_params", "check_fused_module", "check_fusion_plan", "explain_fusion",
    "fold_constant", "function_pass", "fusion_strategies", "fusion_to_dot", "get_fusion_strategy",
    "get_pass", "has_attr", "has_dtype", "has_shape", "has_type", "is_constant", "is_expr", "is_op",
    "is_tuple", "is_tuple_get_item", "is_var", "list_pass_configs", "module_pass",
    "optimization_passes", "optimize", "pass_factory", "plan_fusion", "register_fusion_policy",
    "register_fusion_strategy", "register_pass", "register_pass_config", "registered_policies",
    "render_fusion_svg", "rewrite", "rule", "unregister_fusion_policy",
    "unregister_fusion_strategy", "wildcard",
]
