"""GPU convolutions (nn.conv2d, NCHW, the direct compute of :mod:`opfusion.topi.gpu`):
output-channel x pixel tiles, register tiles, weights staged in shared memory.

A block computes ``block_channels`` output channels of ``threads_x * thread_pixels``
consecutive output pixels of one image (rows laid end to end; ``blockIdx.y`` the channel
tile, ``blockIdx.x`` the pixel tile, ``blockIdx.z`` the image). Its threads form a grid of
``block_channels / thread_channels`` (``threadIdx.y``) x ``threads_x`` (``threadIdx.x``);
each thread accumulates ``thread_channels`` channels x ``thread_pixels`` consecutive pixels of
one row in registers, over the input channels and the window, then applies the elementwise
epilogue (bias, activation, residual) and stores. With ``shared`` on, the input channels
run in steps of ``k_step``: the block's threads copy the weights of the block's channels for
that step into shared memory together, wait at a barrier, then accumulate; every thread of
a block reads the same weights, so each is fetched from global memory once per block. The
input is read from global memory (through the caches): neighbouring threads read
neighbouring pixels.

Knobs: ``block_channels`` (8-128), ``thread_channels`` (1-8), ``threads_x`` (8-64),
``thread_pixels`` (1, 2, 4), ``k_step`` (4, 8, 16), ``shared``; a point must give blocks of
32 to 1024 threads whose weight tile fits shared memory."""

from __future__ import annotations

from typing import Any

from .... import te
from ....target import Target
from ...schedule_rule import Config, ConfigSpace, Knob, KnobValue, ScheduleError, ScheduleRule
from .default import DEFAULT_THREADS, accumulator_and_owner, arrange_elementwise
from .matmul import MAX_GRID_Z, cooperative_copy


class GPUConv2dRule(ScheduleRule):
    """Tiled direct convolutions: see the module docstring."""

    name = "gpu_conv2d"
    ops = ("nn.conv2d",)

    def space(self, anchor: Any, output: Any, target: Target) -> ConfigSpace | None:
        op = anchor.op
        if (not isinstance(op, te.ComputeOp) or len(op.axis) != 4 or len(op.reduce_axis) != 3
                or tuple(output.shape) != tuple(anchor.shape)
                or int(anchor.shape[0]) > MAX_GRID_Z):
            return None
        limit = target.max_threads_per_block
        shared_bytes = target.max_shared_memory_per_block
        window = int(op.reduce_axis[1].dom.extent) * int(op.reduce_axis[2].dom.extent)

        def fits(c: dict[str, KnobValue]) -> bool:
            threads = int(c["block_channels"]) // int(c["thread_channels"]) * int(
                c["threads_x"])
            tile = int(c["block_channels"]) * int(c["k_step"]) * window * 4
            return 32 <= threads <= limit and (not c["shared"] or tile <= shared_bytes)

        fits.__doc__ = "blocks of 32 to the target's threads whose weight tile fits"
        return ConfigSpace(self.name, [
            Knob("block_channels", (8, 16, 32, 64, 128), "output channels per block"),
            Knob("thread_channels", (1, 2, 4, 8), "output channels of each thread's tile"),
            Knob("threads_x", (8, 16, 32, 64), "threads along the pixels"),
            Knob("thread_pixels", (1, 2, 4), "consecutive pixels of each thread's tile"),
            Knob("k_step", (4, 8, 16), "input channels per shared-memory stage"),
            Knob("shared", (True, False), "stage the block's weights in shared memory"),
        ], fits)

    def default_config(self, anchor: Any, output: Any, target: Target) -> Config:
        space = self.space(anchor, output, target)
        assert space is not None
        tile = _default_tile(anchor)
        # The weights of k_step input channels in shared memory when the tile asks for it:
        # fewer for wide windows (an 11x11 one), none when even 4 do not fit.
        steps = ((tile.pop("k_step"), tile.pop("shared")), (4, True), (8, False))
        for k_step, shared in steps:
            try:
                return space.config(**tile, k_step=k_step, shared=shared)
            except ScheduleError:
                continue
        raise ScheduleError("gpu_conv2d: no default config fits")  # (shared=False always does)

    def apply(self, s: te.Schedule, anchor: Any, output: Any, target: Target,
              config: Config) -> None:
        arrange_conv2d(s, anchor, output, int(config["block_channels"]),
                       int(config["thread_channels"]), int(config["threads_x"]),
                       int(config["thread_pixels"]), int(config["k_step"]),
                       bool(config["shared"]))
        arrange_elementwise(s, DEFAULT_THREADS)


def _default_tile(anchor: Any) -> dict[str, Any]:
    """The heuristic's knobs for a convolution, by its kind, from ``opf.tune`` on an H200
    (ResNet-50 at batch 32, 12-68 candidates per convolution; ``benchmarks/gpu.py --tune``,
    batch-32 times, default -> the tuner's best):

    - the stem (few input channels, a 7x7 window): blocks of 8 channels x 16 pixels
      (2.09 ms -> 1.18 in the tuner);
    - 1x1 convolutions of 64 pixels or fewer (the last stage, stride 1 or 2): blocks of 64
      channels x 128 pixels, 4 x 4 per thread, 16 input channels of weights a step in shared
      memory (512 -> 2048 channels 0.729 ms -> 0.291, the 1024 -> 2048 projection 2.310 ->
      1.015; the small tile below had them);
    - other pointwise convolutions: tall register tiles (8 channels x 2 pixels) without shared
      memory (a thread's 8 weights of one input channel are 8 loads either way); most tuned to
      this shape or within 15% of it;
    - 3x3 stride-2 convolutions: narrow blocks of 8 threads along the pixels, 4 pixels each,
      16 channels, weights in shared memory (128 channels at 28 x 28 2.725 ms -> 1.293, 256 at
      14 x 14 3.349 -> 1.347, 512 at 7 x 7 3.017 -> 2.041, in tiles of this family);
    - strided 1x1 convolutions otherwise: one-warp blocks of 8 channels (2.80 ms -> 0.65);
    - other 3x3 convolutions of more than 64 pixels: 64 channels x 32 pixels a block, 8 sums
      a thread (2 channels x 4 pixels on rows of 28 or more, 4 x 2 on narrower ones), 4 input
      channels a step (64 channels at 56 x 56 1.273 ms -> 0.840, 256 at 14 x 14 1.629 ->
      1.129);
    - layers of 16 channels or fewer, and 3x3 ones of 64 pixels or fewer: 16 channels x 32
      pixels, weights in shared memory (512 channels at 7 x 7: 1.662 ms, the best 1.396)."""
    data = anchor.op.input_tensors[0]
    _, ry, rx = anchor.op.reduce_axis
    window = int(ry.dom.extent) * int(rx.dom.extent)
    in_channels = int(data.shape[1])
    channels = int(anchor.shape[1])
    width = int(anchor.shape[3])
    pixels = int(anchor.shape[2]) * width
    strided = int(data.shape[2]) >= 2 * int(anchor.shape[2])
    if in_channels <= 4:  # a stem: few input channels, a wide window
        return {"block_channels": 8, "thread_channels": 4, "threads_x": 16,
                "thread_pixels": 1, "k_step": 8, "shared": True}
    if window == 1 and pixels <= 64 and channels >= 64:  # the last stage's 1x1 layers
        return {"block_channels": 64, "thread_channels": 4, "threads_x": 32,
                "thread_pixels": 4, "k_step": 16, "shared": True}
    if strided and window > 1 and channels > 16:
        return {"block_channels": 16, "thread_channels": 1, "threads_x": 8,
                "thread_pixels": 4, "k_step": 8, "shared": True}
    if channels <= 16 or pixels <= 64:  # narrow layers and the last, small stages
        return {"block_channels": 16, "thread_channels": 2, "threads_x": 32,
                "thread_pixels": 1, "k_step": 8, "shared": True}
    if strided:
        return {"block_channels": 8, "thread_channels": 8, "threads_x": 32,
                "thread_pixels": 2, "k_step": 8, "shared": False}
    if window == 1:
        return {"block_channels": 64, "thread_channels": 8, "threads_x": 16,
                "thread_pixels": 2, "k_step": 8, "shared": False}
    wide = width >= 28
    return {"block_channels": 64, "thread_channels": 2 if wide else 4,
            "threads_x": 8 if wide else 16, "thread_pixels": 4 if wide else 2,
            "k_step": 4, "shared": True}


def arrange_conv2d(s: te.Schedule, anchor: Any, output: Any, block_channels: int,
                   thread_channels: int, threads_x: int, thread_pixels: int, k_step: int,
                   shared: bool) -> None:
    """The tiling of the module docstring with explicit knobs."""
    acc, owner = accumulator_and_owner(s, anchor, output)
    n, o, y, x = owner.op.axis
    channels = int(o.dom.extent)
    bo, oi = owner.split(o, factor=block_channels)
    ty, ro = owner.split(oi, factor=thread_channels)
    xo, rx = owner.split(x, factor=thread_pixels)
    pixels = owner.fuse(y, xo)
    bp, tx = owner.split(pixels, factor=threads_x)
    owner.reorder(n, bo, bp, ty, tx, ro, rx)
    owner.bind(n, "blockIdx.z")
    owner.bind(bo, "blockIdx.y")
    owner.bind(bp, "blockIdx.x")
    owner.bind(ty, "threadIdx.y")
    owner.bind(tx, "threadIdx.x")
    # The register tile's loops unrolled: the accumulators stay in registers only when
    # every index into them is a constant.
    owner.unroll(ro)
    owner.unroll(rx)
    stage = s[acc]
    stage.compute_at(owner, tx)
    _, ao, _, ax = stage.op.axis
    rc, ry, rxk = stage.op.reduce_axis
    rco, rci = stage.split(rc, factor=k_step)
    stage.reorder(rco, rci, ry, rxk, ao, ax)
    stage.unroll(ao)
    stage.unroll(ax)
    if not shared:
        return
    reads = s[acc].op.input_tensors
    weight = reads[1] if len(reads) > 1 else None  # the compute reads data, then weight
    if weight is None or int(weight.shape[0]) != channels:
        return
    copy = s.cache_read(weight, "shared", [acc])
    s[copy].compute_at(stage, rco)
    cooperative_copy(s[copy], int(ty.dom.extent), int(tx.dom.extent))
