"""The CPU backend's schedule rules: one per anchor operator family, and the default.

=============  ==========================================  ===================================
rule           anchors                                     knobs
=============  ==========================================  ===================================
conv2d         nn.conv2d, nn.conv2d_transpose              channel_block, col_blocks,
                                                           task_channels, row_block,
                                                           channel_pass
conv2d_nchwc   nn.conv2d_nchwc                             channel_tile, col_units,
                                                           task_blocks, row_block,
                                                           k_blocks, line_chunks,
                                                           rows_first, prefetch
conv2d_        nn.conv2d_winograd_nchwc                    channel_tile, col_tiles,
winograd                                                   task_blocks, row_tiles
matmul_dot     nn.dense, nn.matmul, nn.batch_matmul        rows, cols, block
               (both operands along the contraction)
matmul_plain   the same (any other product)                rows, cols, k_unroll, block,
                                                           prefetch
pool           nn.max_pool2d, nn.avg_pool2d, global forms  vector_width (NCHW), col_tile
                                                           (NCHW<k>c)
rows           nn.softmax, nn.log_softmax, nn.layer_norm   vector_width
layout         layout_transform, channel_shuffle           lanes_outside
lrn            nn.lrn (along the channels of NCHW)         vector_width
attention      nn.attention                                key_cols, value_cols
default        any other group (the fallback)              vector_width, parallel
=============  ==========================================  ===================================

See :mod:`opfusion.backend.schedule_rule` for the contract. The loops that matter are tiled
on the *owner*: the group's output when it is an elementwise epilogue of the anchor's shape
(the anchor is then inlined into it, or computed at the owner's tiles when it is a
reduction), else the anchor itself. The accumulating stage is computed at the owner's tile,
so an intermediate result never goes to memory. Stages a rule did not arrange get
:func:`.common.arrange_rest`: data loops fused and parallel."""

from __future__ import annotations

from ...schedule_rule import RuleRegistry
from .attention import AttentionRule, attention_blocks
from .common import arrange_blocked_sums, arrange_rest, sum_parts_at
from .conv2d import Conv2dRule, conv2d_tiles
from .conv2d_nchwc import Conv2dNCHWcRule, conv2d_nchwc_tiles
from .default import DefaultRule, arrange_default, default_schedule
from .layout import LayoutRule
from .lrn import LrnRule
from .matmul import MatmulDotRule, MatmulPlainRule, dot_tiles, plain_tiles
from .pool import PoolRule, pool_rows
from .rows import RowsRule, normalized_rows
from .winograd import WinogradRule, winograd_tiles

#: The CPU backend's rules, by anchor operator; groups none takes get the default.
RULES = RuleRegistry("cpu")
for _rule in (Conv2dRule(), Conv2dNCHWcRule(), WinogradRule(), MatmulDotRule(),
              MatmulPlainRule(), PoolRule(), RowsRule(), LayoutRule(), LrnRule(),
              AttentionRule()):
    RULES.register(_rule)
RULES.set_fallback(DefaultRule())

__all__ = ["RULES", "AttentionRule", "Conv2dNCHWcRule", "Conv2dRule", "DefaultRule",
           "LayoutRule", "LrnRule", "MatmulDotRule", "MatmulPlainRule", "PoolRule", "RowsRule",
           "WinogradRule", "arrange_blocked_sums", "arrange_default", "arrange_rest",
           "attention_blocks", "conv2d_nchwc_tiles", "conv2d_tiles", "default_schedule",
           "dot_tiles", "normalized_rows", "plain_tiles", "pool_rows", "sum_parts_at",
           "winograd_tiles"]
