"""Tensor-core products (TF32 ``mma.sync``) without a GPU: the loop-IR interpreter runs each
warp's instruction as the hardware does, its operands exchanged between the lanes by the
PTX ISA's fragment layout, so every schedule is checked against the reference (within TF32's
rounding) and against a reference with TF32-rounded operands (to float32's); the CUDA it
emits compiles with NVRTC; on a GPU, the same products run on it."""

import numpy as np
import pytest

import opfusion as opf
from opfusion import op, te, testing
from opfusion.backend import get_backend
from opfusion.backend.cuda.emitter import cuda_module
from opfusion.backend.cuda.nvrtc import compile_cuda, nvrtc_available
from opfusion.backend.cuda.runtime import gpu_unavailable
from opfusion.compiler.lower_group import lower_primitive_function, schedule_space
from opfusion.errors import EvaluationError, ScheduleError
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function, Var
from opfusion.ir.types import TensorType
from opfusion.target import Target
from opfusion.target.target import TargetError
from opfusion.tir import mma
from opfusion.tir.interp import run

TF32 = Target("cuda -arch=sm_90 -tf32=1")
#: TF32 as cuBLAS and cuDNN do it: the float32 operands truncated by the tensor cores.
FAST = Target("cuda -arch=sm_90 -tf32=fast")
NO_NVRTC = nvrtc_available()
needs_nvrtc = pytest.mark.skipif(NO_NVRTC is not None, reason=f"NVRTC: {NO_NVRTC}")
#: TF32 keeps 10 bits of mantissa: a product's relative error grows to about 1e-3.
TF32_RTOL = 3e-3
_tf32 = mma.round_tf32_array


def _dense_relu(m, k, n):
    x, w, b = (Var("x", TensorType((m, k), "float32")), Var("w", TensorType((n, k), "float32")),
               Var("b", TensorType((n,), "float32")))
    return Function([x, w, b], op.nn.relu(op.nn.bias_add(op.nn.dense(x, w), b)))


def _batch_matmul(batch, m, k, n):
    a, b = (Var("a", TensorType((batch, m, k), "float32")),
            Var("b", TensorType((batch, k, n), "float32")))
    return Function([a, b], op.nn.batch_matmul(a, b, transpose_b=False))


def _typed(func):
    return opf.transform.InferType()(opf.IRModule.from_expr(func))["main"]


def _run_group(func, config=None, target=TF32):
    """``func`` lowered as one group for ``target``, run in the interpreter: (group, inputs,
    result)."""
    func = _typed(func)
    group = lower_primitive_function(func, "group", get_backend(target), config)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(tuple(p.type_annotation.shape)).astype("float32")
              for p in func.params]
    out = np.zeros(tuple(func.body.checked_type.shape), "float32")
    run(group.prim_func, *inputs, *[np.array(c) for c in group.constants], out)
    return group, inputs, out


def _check(func, config=None):
    """The group on tensor cores against the reference (TF32's tolerance) and against the
    reference of its TF32-rounded operands (float32's)."""
    group, inputs, out = _run_group(func, config)
    assert group.schedule_config["rule"] in ("gpu_mma", "gpu_conv2d_mma")
    typed = _typed(func)
    testing.assert_close(out, evaluate(typed, inputs), TF32_RTOL)
    rounded = [_tf32(a).astype("float32") if a.ndim > 1 else a for a in inputs]
    testing.assert_close(out, evaluate(typed, rounded), 1e-5)
    return group


def test_tf32_rounds_to_ten_bits_of_mantissa_ties_away_from_zero():
    assert mma.round_tf32(1.0 + 2.0 ** -11) == 1.0 + 2.0 ** -10  # a tie: away from zero
    assert mma.round_tf32(-(1.0 + 2.0 ** -11)) == -(1.0 + 2.0 ** -10)
    assert mma.round_tf32(1.0 + 2.0 ** -12) == 1.0
    assert mma.round_tf32(np.float32(np.pi)) == 3.140625
    for special in (np.inf, -np.inf):
        assert mma.round_tf32(special) == special
    assert np.isnan(mma.round_tf32(np.nan))


def test_the_tf32_target_option():
    assert TF32.allow_tf32 and not Target("cuda -arch=sm_90").allow_tf32
    assert not Target("c").allow_tf32
    with pytest.raises(TargetError, match="one of 0, 1, fast"):
        _ = Target("cuda -tf32=yes").allow_tf32
    with pytest.raises(TargetError, match="sm_80 or newer"):
        _ = Target("cuda -arch=sm_75 -tf32=1").allow_tf32
    with pytest.raises(TargetError, match="sm_80 or newer"):
        _ = Target("cuda -arch=sm_75 -tf32=fast").allow_tf32
    assert TF32.tf32_rounds_operands
    assert FAST.allow_tf32 and not FAST.tf32_rounds_operands
    assert not Target("cuda -arch=sm_90").tf32_rounds_operands


def test_the_tensor_cores_truncate_float32_operands_toward_zero():
    assert mma.truncate_tf32(1.0 + 2.0 ** -11) == 1.0  # rounding gives 1 + 2^-10
    assert mma.truncate_tf32(-(1.0 + 2.0 ** -10 + 2.0 ** -11)) == -(1.0 + 2.0 ** -10)
    assert mma.truncate_tf32(np.float32(np.pi)) == 3.140625
    assert mma.truncate_tf32(np.inf) == np.inf and np.isnan(mma.truncate_tf32(np.nan))
    values = np.random.default_rng(0).standard_normal(1000).astype("float32")
    values[:3] = (np.nan, -np.inf, 1e-40)  # and a denormal: its low bits dropped too
    want = [mma.truncate_tf32(float(v)) for v in values]
    np.testing.assert_array_equal(mma.truncate_tf32_array(values), np.float32(want))
    assert np.all(np.abs(mma.truncate_tf32_array(values[3:])) <= np.abs(values[3:]))


@pytest.mark.parametrize("shape", [(32, 16, 16), (64, 48, 32), (128, 64, 256)])
def test_dense_on_tensor_cores_with_the_default_config(shape):
    group = _check(_dense_relu(*shape))
    assert "mma_tf32" in str(group.prim_func)


def test_every_sampled_config_of_the_tensor_core_space_computes_the_reference():
    func = _dense_relu(64, 32, 64)
    rule, space, default = schedule_space(_typed(func), get_backend(TF32))
    assert rule.name == "gpu_mma"
    for config in [default, *space.sample(4, seed=3), *_each_pipeline(space)]:
        _check_pipelined(func, "gpu_mma", config, 32)


#: The ways a tensor-core rule copies its operands: (shared, double_buffer, async_stages).
PIPELINES = ((False, False, 0), (True, False, 0), (True, True, 0), (True, False, 2),
             (True, False, 3))


def _each_pipeline(space):
    """The first config of ``space`` that copies its operands in each of the ways of
    :data:`PIPELINES`."""
    found = {}
    for config in space:
        found.setdefault((config["shared"], config["double_buffer"], config["async_stages"]),
                         config)
    assert set(found) == set(PIPELINES)
    return [found[way] for way in PIPELINES]


def _check_pipelined(func, rule, config, depth):
    """:func:`_check` of ``config``; an async one's tiles filled by async copies, which the
    instruction rounds to TF32 as it reads them, where its contraction of ``depth`` takes
    two steps or more."""
    group = _check(func, {"rule": rule, "knobs": dict(config)})
    if config["async_stages"] and config["k_step"] < depth:
        text = str(group.prim_func)
        assert "async_copy(" in text and f"async_wait({config['async_stages'] - 2})" in text
        code = cuda_module([group.prim_func], target=TF32).code
        assert "cp.async.ca.shared.global" in code and "opf_tf32(p" in code


def test_batched_products_with_an_untransposed_right_operand():
    group = _check(_batch_matmul(2, 16, 24, 32))
    assert "bind[blockIdx.z]" in str(group.prim_func)


@pytest.mark.parametrize("func, target", [
    (_dense_relu(32, 16, 16), Target("cuda -arch=sm_90")),  # TF32 not allowed
    (_dense_relu(17, 16, 16), TF32),  # rows no 16-row tile divides
    (_dense_relu(32, 12, 16), TF32),  # a contraction of no whole 8-step
])
def test_other_products_keep_float32_tiles(func, target):
    group, inputs, out = _run_group(func, target=target)
    assert group.schedule_config["rule"] == "gpu_matmul"
    testing.assert_close(out, evaluate(_typed(func), inputs), 1e-5)


def _product(rows, cols):
    """TE's ``a (rows x 8) @ b (8 x cols)``: the operands, the result, a schedule and the
    result's local accumulator."""
    a = te.placeholder((rows, 8), name="a")
    b = te.placeholder((8, cols), name="b")
    k = te.reduce_axis((0, 8), name="k")
    c = te.compute((rows, cols), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    s = te.create_schedule(c.op)
    return a, b, c, s, s.cache_write(c, "local")


def _hand_scheduled(lanes=("threadIdx.x", "threadIdx.y")):
    """A 16 x 8 x 8 product scheduled by hand as one warp's instruction, its tile
    coordinates (t4, g) bound to ``lanes``."""
    a, b, c, s, acc = _product(16, 8)
    i, j = s[c].op.axis
    g, rows = s[c].split(i, factor=2)
    t4, cols = s[c].split(j, factor=2)
    s[c].reorder(g, t4, rows, cols)
    s[c].bind(t4, lanes[0])
    s[c].bind(g, lanes[1])
    s[acc].compute_at(s[c], t4)
    s[acc].reorder(s[acc].op.reduce_axis[0], *s[acc].op.axis)
    s[acc].tensorize(s[acc].op.reduce_axis[0], "mma_tf32")
    return opf.lower(s, [a, b, c]), a, b


def test_a_hand_written_tile_runs_as_the_warp_exchanges_it():
    func, _, _ = _hand_scheduled()
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal(s).astype("float32") for s in ((16, 8), (8, 8)))
    out = np.zeros((16, 8), "float32")
    run(func, x, y, out)
    np.testing.assert_allclose(out, _tf32(x) @ _tf32(y), rtol=1e-6, atol=1e-6)


def test_lanes_the_hardware_does_not_number_so_are_refused():
    func, _, _ = _hand_scheduled(lanes=("threadIdx.y", "threadIdx.x"))  # g on x: not a lane
    with pytest.raises(EvaluationError, match="t4 bound to threadIdx.x, g to threadIdx.y"):
        run(func, *(np.zeros(s, "float32") for s in ((16, 8), (8, 8), (16, 8))))


def test_the_nest_runs_as_a_plain_loop_off_the_gpu():
    a, b, c, s, acc = _product(4, 2)
    i, _ = s[c].op.axis
    outer, _ = s[c].split(i, factor=2)
    s[acc].compute_at(s[c], outer)
    s[acc].reorder(s[acc].op.reduce_axis[0], *s[acc].op.axis)
    s[acc].tensorize(s[acc].op.reduce_axis[0], "mma_tf32")
    func = opf.lower(s, [a, b, c])
    rng = np.random.default_rng(2)
    x, y = (rng.standard_normal(s).astype("float32") for s in ((4, 8), (8, 2)))
    out = np.zeros((4, 2), "float32")
    run(func, x, y, out)
    np.testing.assert_allclose(out, x @ y, rtol=1e-6)  # no thread binding: float32, as written


def test_tensorize_refuses_a_nest_that_is_no_instruction():
    a = te.placeholder((16, 16), name="a")
    k = te.reduce_axis((0, 16), name="k")
    c = te.compute((16, 16), lambda i, j: te.sum(a[i, k] * a[k, j], axis=k), name="c")
    s = te.create_schedule(c.op)
    with pytest.raises(ScheduleError, match="reduction loop of 8"):
        s[c].tensorize(s[c].op.reduce_axis[0], "mma_tf32")  # 16 steps, outside i and j
    with pytest.raises(ScheduleError, match="unknown tensor intrinsic"):
        s[c].tensorize(s[c].op.reduce_axis[0], "wmma_f16")


@needs_nvrtc
@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_the_emitted_instruction_compiles_with_nvrtc(arch):
    group = _check(_dense_relu(64, 32, 64), {"rule": "gpu_mma", "knobs": {
        "warps_m": 2, "warps_n": 2, "tiles_m": 1, "tiles_n": 2, "k_step": 16, "shared": True,
        "double_buffer": True, "async_stages": 0}})
    code = cuda_module([group.prim_func], target=TF32).code
    assert mma.INSTRUCTION in code and "cvt.rna.tf32.f32" in code
    ptx = compile_cuda(code, arch).decode()
    assert "mma.sync.aligned.m16n8k8" in ptx


NO_GPU = gpu_unavailable()


@pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))
@pytest.mark.parametrize("mode", ["1", "fast"])
def test_tensor_core_products_on_the_gpu_match_the_reference(mode):
    """``-tf32=fast`` checks that the tensor cores truncate the float32 operands they are
    given, as the interpreter does (PyTorch's notes on TF32 say they read the first 10 bits
    of the mantissa)."""
    func = _typed(_dense_relu(256, 128, 512))
    exe = opf.compile(opf.IRModule.from_expr(func), target=f"cuda -tf32={mode}")
    assert "gpu_mma" in {str(s.group.schedule_config.get("rule"))
                         for s in exe.model.steps if s.group.schedule_config}
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal(tuple(p.type_annotation.shape)).astype("float32")
              for p in func.params]
    got = exe.run(*inputs)[0]
    testing.assert_close(got, evaluate(func, inputs), 2 * TF32_RTOL)
    reduce = _tf32 if mode == "1" else mma.truncate_tf32_array
    rounded = [reduce(a).astype("float32") if a.ndim > 1 else a for a in inputs]
    # The tensor cores sum in float32 in their own order: within 1e-4, a third of what
    # TF32's rounding alone moves the result (3-4e-4), so the layout and the rounding are
    # both checked.
    testing.assert_close(got, evaluate(func, rounded), 1e-4)
    exe.close()


def _conv_relu(batch, channels, out_channels, size, kernel, stride, pad, groups=1,
               dilation=1):
    x = Var("x", TensorType((batch, channels, size, size), "float32"))
    w = Var("w", TensorType((out_channels, channels // groups, kernel, kernel), "float32"))
    b = Var("b", TensorType((out_channels,), "float32"))
    conv = op.nn.conv2d(x, w, strides=(stride, stride), padding=(pad, pad), groups=groups,
                        dilation=(dilation, dilation))
    return Function([x, w, b], op.nn.relu(op.nn.bias_add(conv, b)))


@pytest.mark.parametrize("case", [
    (8, 8, 16, 5, 3, 1, 1),  # 3x3, padded: the window's out-of-image taps add zero
    (8, 16, 32, 7, 3, 2, 1),  # strided
    (16, 16, 16, 4, 1, 1, 0),  # pointwise
    (8, 8, 16, 6, 3, 1, 2, 1, 2),  # dilated: a 5 x 5 window
])
def test_convolutions_on_tensor_cores_with_the_default_config(case):
    group = _check(_conv_relu(*case))
    assert group.schedule_config["rule"] == "gpu_conv2d_mma"
    window = (case[4] - 1) * (case[8] if len(case) > 8 else 1) + 1
    span = (group.schedule_config["knobs"]["pixels"] - 1) * case[5] + window
    # The input's shared tile is the windows of the block's pixels, not whole rows: a
    # clamped index (the padding test) spans no more than its unclamped form.
    assert f", {window}, {min(span, case[3])}], shared" in str(group.prim_func)


def test_every_sampled_config_of_the_tensor_core_convolutions_computes_the_reference():
    func = _conv_relu(16, 16, 32, 4, 3, 1, 1)
    rule, space, default = schedule_space(_typed(func), get_backend(TF32))
    assert rule.name == "gpu_conv2d_mma"
    configs = [default, *_each_pipeline(space)]
    configs.append(next(c for c in space.sample(8, seed=0)  # the copies at each row
                        if c["row_steps"] != default["row_steps"]))
    for config in configs:
        _check_pipelined(func, "gpu_conv2d_mma", config, 16)


@pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))
@pytest.mark.parametrize("case", [
    (32, 64, 64, 14, 3, 1, 1),  # 3x3, padded
    (32, 64, 128, 14, 1, 2, 0),  # strided 1x1
    (32, 16, 64, 28, 1, 1, 0),  # pointwise
])
def test_tensor_core_convolutions_on_the_gpu_match_the_reference(case):
    """The default config and sampled ones (double-buffered and not) through the GPU runner,
    which checks each one's outputs against the reference (1e-3 of the largest: a lane
    layout the hardware does not share is off by the values themselves) before timing it."""
    from opfusion.autotune.gpu_runner import GPURunner
    from opfusion.autotune.measure import MeasureOptions, generate_candidates, task_data
    from opfusion.autotune.task import extract_tasks

    (task,) = extract_tasks(_typed(_conv_relu(*case)), None, "cuda -tf32=1")
    assert task.rule == "gpu_conv2d_mma"
    configs = [task.default, *task.space.sample(6, seed=0)]
    assert {c["double_buffer"] for c in configs} == {False, True}
    results = GPURunner().run(task_data(task), generate_candidates(task, configs),
                              MeasureOptions(repeat=1, min_repeat_seconds=0.0))
    assert [r.error for r in results if not r.ok] == []


def _conv_residual(batch, channels, out_channels, size, kernel, stride, pad):
    """A bottleneck's last convolution: bias, the block's input added, ReLU."""
    func = _conv_relu(batch, channels, out_channels, size, kernel, stride, pad)
    out = (size + 2 * pad - kernel) // stride + 1
    r = Var("r", TensorType((batch, out_channels, out, out), "float32"))
    (relu,) = [func.body]
    return Function([*func.params, r], op.nn.relu(op.add(relu.args[0], r)))


@pytest.mark.parametrize("case, config", [
    ((16, 16, 64, 8, 1, 1, 0), {}),  # the heuristic's: pointwise, staged
    ((16, 16, 64, 8, 1, 1, 0), {"warps_m": 1, "warps_n": 2, "tiles_m": 2, "tiles_n": 1,
                                "pixels": 8, "k_step": 8, "row_steps": False, "shared": False,
                                "double_buffer": False, "staged_store": True,
                                "async_stages": 0}),
    ((8, 8, 32, 6, 3, 2, 1), {"warps_m": 2, "warps_n": 1, "tiles_m": 1, "tiles_n": 1,
                              "pixels": 1, "k_step": 8, "row_steps": True, "shared": True,
                              "double_buffer": True, "staged_store": True,
                              "async_stages": 0}),  # strided 3x3
])
def test_staged_sums_store_the_epilogue_in_the_outputs_order(case, config):
    from opfusion.tir import stmt as S

    func = _conv_residual(*case)
    group, inputs, out = _run_group(func, {"rule": "gpu_conv2d_mma", "knobs": config}
                                    if config else None)
    testing.assert_close(out, evaluate(_typed(func), inputs), TF32_RTOL)
    x, w, b, r = inputs  # the tensor cores' operands rounded; the residual taken as it is
    rounded = [_tf32(x).astype("float32"), _tf32(w).astype("float32"), b, r]
    testing.assert_close(out, evaluate(_typed(func), rounded), 1e-5)
    assert group.schedule_config["knobs"]["staged_store"]
    tiles = [b for b in _allocated(group.prim_func)
             if b.scope == "shared" and not b.name.endswith("_shared")]
    (tile,) = tiles  # the block's sums: images x channels x 1 x pixels, images padded
    knobs = group.schedule_config["knobs"]
    assert tile.shape[-1] == knobs["pixels"] and tile.strides[0] % 32 != 0
    # the output's store: consecutive threads (threadIdx.x) on consecutive pixels
    (store,) = [st for st in S.walk_stmts(group.prim_func.body)
                if isinstance(st, S.BufferStore) and st.buffer.scope == "global"]
    code = cuda_module([group.prim_func], target=TF32).code
    last = code[code.rindex("__syncthreads()"):]
    # (4 pixels a thread, one 16-byte store, where the block's pixels are whole vectors)
    vector = knobs["pixels"] % 4 == 0 and case[3] % 4 == 0
    written = f"reinterpret_cast<float4*>({store.buffer.name} + " if vector else \
        f"{store.buffer.name}["
    assert written in last and "threadIdx.x" in last
    assert ("reinterpret_cast<const float4*>(p3 + " in last) == vector  # the residual
    if NO_NVRTC is None:
        assert "mma.sync.aligned.m16n8k8" in compile_cuda(code, "compute_90").decode()


def test_the_heuristic_stages_short_contractions_and_keeps_large_tiles_for_long_ones():
    pointwise = lower_primitive_function(_typed(_conv_residual(32, 64, 256, 56, 1, 1, 0)),
                                         "g", get_backend(TF32))
    knobs = pointwise.schedule_config["knobs"]
    assert knobs["staged_store"] and knobs["warps_m"] * knobs["tiles_m"] * 16 == 64
    wide = lower_primitive_function(_typed(_conv_relu(32, 256, 256, 14, 3, 1, 1)), "g",
                                    get_backend(TF32))  # a 2304-step contraction
    knobs = wide.schedule_config["knobs"]
    assert knobs["warps_m"] * knobs["tiles_m"] == 4 and knobs["warps_n"] * knobs["tiles_n"] == 4


@pytest.mark.parametrize("func, target", [
    (_conv_relu(8, 8, 16, 4, 3, 1, 1), Target("cuda -arch=sm_90")),  # TF32 not allowed
    (_conv_relu(4, 8, 16, 4, 3, 1, 1), TF32),  # a batch of fewer than 8 images
    (_conv_relu(8, 3, 16, 4, 3, 1, 1), TF32),  # input channels in no whole 8-step
    (_conv_relu(8, 16, 16, 4, 3, 1, 1, groups=2), TF32),  # grouped
])
def test_other_convolutions_keep_float32_tiles(func, target):
    group, inputs, out = _run_group(func, target=target)
    assert group.schedule_config["rule"] == "gpu_conv2d"
    testing.assert_close(out, evaluate(_typed(func), inputs), 1e-5)


@needs_nvrtc
def test_resnet50_at_batch_32_convolves_on_tensor_cores_and_compiles():
    from opfusion.compiler.gpu import build_gpu_model

    mod, params = testing.WORKLOADS["resnet50"](batch_size=32, image_shape=(3, 32, 32))
    model = build_gpu_model(mod, params, "cuda -arch=sm_90 -tf32=1")
    configs = [k.schedule_config or {} for k in model.kernels]
    rules = [str(c.get("rule")) for c in configs]
    # every convolution (the stem's 3 input channels padded to 8), and the classifier
    assert rules.count("gpu_conv2d_mma") == 24 and rules.count("gpu_conv2d") == 0
    assert rules.count("gpu_mma") == 1
    assert any(c.get("knobs", {}).get("double_buffer") for c in configs)
    assert any(c.get("knobs", {}).get("staged_store") for c in configs)
    # PTX, and machine code for an A100 and an H100: ptxas checks what PTX does not
    # (registers, 48 KiB of static shared memory a block, the inline assembly's operands);
    # NVRTC runs outside the GIL, so the three builds go side by side
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3) as pool:
        ptx, *cubins = pool.map(lambda arch: compile_cuda(model.source.code, arch),
                                ("compute_90", "sm_80", "sm_90"))
    assert ptx.decode().count("mma.sync.aligned.m16n8k8") >= 24
    assert all(cubin[:4] == b"\x7fELF" for cubin in cubins)


def test_a_transformer_layer_runs_its_products_on_tensor_cores_on_the_interpreted_device():
    from opfusion.backend.cuda.runtime import InterpretedDevice
    from opfusion.compiler.gpu import GPUExecutor, build_gpu_model, interpret_inputs

    mod, params = testing.WORKLOADS["transformer_encoder"](
        **testing.SMALL_WORKLOAD_ARGS["transformer_encoder"])
    model = build_gpu_model(mod, params, TF32)
    rules = [str((k.schedule_config or {}).get("rule")) for k in model.kernels]
    assert rules.count("gpu_mma") == 4  # the projections and the feed-forward products
    exe = GPUExecutor(model, InterpretedDevice())
    inputs = interpret_inputs(model)
    got = exe.run(*inputs)[0]
    names = [p.name_hint for p in mod["main"].params if p.name_hint not in params]
    want = evaluate(mod, {**dict(zip(names, inputs)), **params})
    testing.assert_close(got, want, 5 * TF32_RTOL)  # measured 5e-4: TF32 products, layer norms
    exe.close()


def test_shared_tiles_are_padded_off_each_others_banks():
    from collections import Counter

    from opfusion.backend.cuda.schedules.mma import bank_offset, lane_coordinates
    from opfusion.tir import stmt as S

    rows, steps = lane_coordinates("rows", 1)  # rows 2 g apart, steps t4
    # a dense [rows x 16] tile puts 8 lanes on each of 4 banks; rows 18 apart, one each
    assert max(Counter((r * 16 + k) % 32 for r, k in zip(rows, steps)).values()) == 8
    assert bank_offset(tuple(rows), tuple(steps), 1, 16) == 18
    group = _check(_dense_relu(64, 32, 32), {"rule": "gpu_mma", "knobs": {
        "warps_m": 2, "warps_n": 2, "tiles_m": 1, "tiles_n": 1, "k_step": 16, "shared": True,
        "double_buffer": False, "async_stages": 0}})
    shared = [s.buffer for s in S.walk_stmts(group.prim_func.body)
              if isinstance(s, S.Allocate) and s.buffer.scope == "shared"]
    assert [b.strides for b in shared] == [(18, 1), (20, 1)]
    assert [b.size for b in shared] == [31 * 18 + 16, 15 * 20 + 16]


@pytest.mark.parametrize("func", [_dense_relu(64, 32, 64), _conv_relu(8, 16, 32, 6, 3, 1, 1)],
                         ids=["dense", "padded_conv"])
def test_tiles_only_tensor_cores_read_are_rounded_once_as_they_are_stored(func):
    from opfusion.tir import stmt as S

    group = _check(func)  # the interpreter rounds at the instruction: the same numbers
    shared = [s.buffer for s in S.walk_stmts(group.prim_func.body)
              if isinstance(s, S.Allocate) and s.buffer.scope == "shared"]
    # the operands' tiles; a convolution's staged sums are no operand and keep float32
    operands = [b for b in shared if b.name.endswith("_shared")]
    assert len(operands) == 2 and len(shared) - len(operands) == group.schedule_config[
        "knobs"].get("staged_store", False)
    assert mma.tf32_operand_buffers(group.prim_func) == {id(b) for b in operands}
    stores = [s for s in S.walk_stmts(group.prim_func.body)
              if isinstance(s, S.BufferStore) and s.buffer in operands]
    assert len(stores) in (2, 4)  # (double-buffered: a first step's, then the next ones')
    code = cuda_module([group.prim_func], target=TF32).code
    # every operand taken as it is; the rounding is at the stores into the two tiles (four
    # where a thread stores a vector it loaded whole)
    vectors = [s for s in S.walk_stmts(group.prim_func.body)
               if isinstance(s, S.For) and s.kind is S.ForKind.VECTORIZED
               and isinstance(s.body, S.BufferStore) and s.body.buffer in operands]
    assert code.count("__float_as_uint(") == 6
    assert code.count("__uint_as_float(opf_tf32(") == len(stores) + 3 * len(vectors)
    if NO_NVRTC is None:
        assert "mma.sync.aligned.m16n8k8" in compile_cuda(code, "compute_80").decode()


def test_a_tile_read_other_than_as_an_operand_is_rounded_at_the_instruction():
    # a's tile is read scaled: rounding its stores would round a, not 2 a, so its operands
    # keep their own rounding; b's tile is read as it is, rounded once when stored.
    a = te.placeholder((16, 16), name="a")
    b = te.placeholder((16, 8), name="b")
    k = te.reduce_axis((0, 16), name="k")
    c = te.compute((16, 8), lambda i, j: te.sum(a[i, k] * 2.0 * b[k, j], axis=k), name="c")
    s = te.create_schedule(c.op)
    tiles = [s.cache_read(t, "shared", [c]) for t in (a, b)]
    acc = s.cache_write(c, "local")
    i, j = s[c].op.axis
    g, rows = s[c].split(i, factor=2)
    t4, cols = s[c].split(j, factor=2)
    s[c].reorder(g, t4, rows, cols)
    s[c].bind(t4, "threadIdx.x")
    s[c].bind(g, "threadIdx.y")
    s[acc].compute_at(s[c], t4)
    ko, k8 = s[acc].split(s[acc].op.reduce_axis[0], factor=8)
    s[acc].reorder(ko, k8, *s[acc].op.axis)
    s[acc].tensorize(k8, "mma_tf32")
    for tile in tiles:
        s[tile].compute_at(s[acc], ko)
        fused = s[tile].fuse(*s[tile].op.axis)
        _, lane = s[tile].split(fused, factor=32)
        ty, tx = s[tile].split(lane, factor=4)
        s[tile].bind(ty, "threadIdx.y")
        s[tile].bind(tx, "threadIdx.x")
    func = opf.lower(s, [a, b, c])
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal(shape).astype("float32") for shape in ((16, 16), (16, 8)))
    out = np.zeros((16, 8), "float32")
    run(func, x, y, out)
    np.testing.assert_allclose(out, _tf32(2 * x) @ _tf32(y), rtol=1e-6, atol=1e-6)
    (b_tile,) = [t for t in _allocated(func) if t.name.startswith("b")]
    assert mma.tf32_operand_buffers(func) == {id(b_tile)}
    code = cuda_module([func], target=TF32).code
    assert code.count("__float_as_uint(") == 2 and code.count("= opf_tf32(") == 4


def _allocated(func):
    from opfusion.tir import stmt as S

    return [s.buffer for s in S.walk_stmts(func.body) if isinstance(s, S.Allocate)]


def test_storage_align_pads_a_temporary_and_nothing_reads_the_padding():
    from opfusion.tir import stmt as S

    a = te.placeholder((8, 6), name="a")
    b = te.compute((8, 6), lambda i, j: a[i, j] * 2.0, name="b")
    s = te.create_schedule(b.op)
    copy = s.cache_read(a, "local", [b])
    outer, _ = s[b].split(s[b].op.axis[0], factor=4)
    s[copy].compute_at(s[b], outer)  # four rows of a at a time
    with pytest.raises(ScheduleError, match="but the last"):
        s[copy].storage_align(s[copy].op.axis[1], 8, 3)
    s[copy].storage_align(s[copy].op.axis[0], 8, 3)
    func = opf.lower(s, [a, b])
    (buffer,) = [st.buffer for st in S.walk_stmts(func.body) if isinstance(st, S.Allocate)]
    assert buffer.strides == (11, 1) and buffer.size == 3 * 11 + 6
    x = np.random.default_rng(3).standard_normal((8, 6)).astype("float32")
    out = np.zeros((8, 6), "float32")
    run(func, x, out)  # unwritten padding is NaN in the interpreter: a read would show
    np.testing.assert_array_equal(out, x * 2)


def test_a_stem_gets_zero_channels_for_the_tensor_cores_and_computes_the_same():
    from opfusion.backend.cuda.runtime import InterpretedDevice
    from opfusion.compiler.gpu import GPUExecutor, build_gpu_model

    rng = np.random.default_rng(6)
    weight = rng.standard_normal((16, 3, 3, 3)).astype("float32")
    x = Var("x", TensorType((8, 3, 6, 6), "float32"))
    func = Function([x], op.nn.relu(op.nn.conv2d(x, opf.const(weight), strides=(2, 2),
                                                 padding=(1, 1))))
    for target, padded in ((TF32, True), (Target("cuda -arch=sm_90"), False)):
        model = build_gpu_model(func, target=target)
        ops = [name for k in model.kernels for name in k.op_names]
        assert ("nn.pad" in ops) == padded
        rules = [str((k.schedule_config or {}).get("rule")) for k in model.kernels]
        assert ("gpu_conv2d_mma" if padded else "gpu_conv2d") in rules
        data = rng.standard_normal((8, 3, 6, 6)).astype("float32")
        got = GPUExecutor(model, InterpretedDevice()).run(data)[0]
        testing.assert_close(got, evaluate(_typed(func), [data]),
                             TF32_RTOL if padded else 1e-5)


def test_only_convolutions_the_tensor_cores_take_are_padded():
    from opfusion.transform.pad_conv_channels import PadConvChannels

    for batch, groups, channels, padded in ((8, 1, 3, True), (4, 1, 3, False),
                                             (8, 1, 16, False), (8, 3, 3, False)):
        x = Var("x", TensorType((batch, channels, 5, 5), "float32"))
        w = Var("w", TensorType((6, channels // groups, 3, 3), "float32"))
        mod = opf.transform.InferType()(opf.IRModule.from_expr(
            Function([x, w], op.nn.conv2d(x, w, groups=groups))))
        out = PadConvChannels(TF32)(mod)
        text = str(out["main"])
        assert ("nn.pad" in text) == padded, (batch, groups, channels)
        assert "nn.pad" not in str(PadConvChannels(Target("cuda -arch=sm_90"))(mod)["main"])


def test_a_blocks_copy_inside_its_threads_loops_counts_once_per_thread():
    from opfusion.tir.work import kernel_work

    func = _run_group(_dense_relu(64, 32, 32), {"rule": "gpu_mma", "knobs": {
        "warps_m": 2, "warps_n": 2, "tiles_m": 1, "tiles_n": 1, "k_step": 16,
        "shared": True, "double_buffer": False, "async_stages": 0}})[0].prim_func
    # products: 64 x 32 x 32 multiply-adds, as 2 x 2 x 8 nests per thread; copies: each
    # element of the two 32-wide shared tiles once a step; the rest: the epilogue
    work = kernel_work(func.body)
    assert 64 * 32 * 32 <= work < 4 * 64 * 32 * 32


@pytest.mark.parametrize("async_stages", [0, 2])
def test_constant_weights_are_rounded_to_tf32_once_at_compile_time(monkeypatch, async_stages):
    """RoundTF32Weights rounds a convolution's constant weight to TF32 when the model is
    built; the kernel's facts say so, and it takes the weight as it is: copied into shared
    memory without a conversion, or asynchronously and then read by the instruction without
    one; the input is still rounded (as it is stored, or as it is read from an async tile).
    The numbers are those of the TF32-rounded operands."""
    from opfusion.backend.cuda.runtime import InterpretedDevice
    from opfusion.backend.cuda.schedules import conv2d_mma
    from opfusion.compiler.gpu import GPUExecutor, build_gpu_model

    if async_stages:
        heuristic = conv2d_mma.GPUConv2dMmaRule.default_config

        def with_async(self, anchor, output, target):
            config = dict(heuristic(self, anchor, output, target))
            return self.space(anchor, output, target).config(  # two steps of 8 channels
                **{**config, "async_stages": async_stages, "double_buffer": False, "k_step": 8})

        monkeypatch.setattr(conv2d_mma.GPUConv2dMmaRule, "default_config", with_async)
    func = _conv_relu(8, 16, 32, 6, 3, 1, 1)
    rng = np.random.default_rng(3)
    params = {"w": rng.standard_normal((32, 16, 3, 3)).astype("float32"),
              "b": rng.standard_normal(32).astype("float32")}
    mod = opf.IRModule.from_expr(func)
    model = build_gpu_model(mod, params, TF32)
    (conv,) = [k for k in model.kernels
               if (k.schedule_config or {}).get("rule") == "gpu_conv2d_mma"]
    assert conv.schedule_config["knobs"]["async_stages"] == async_stages
    assert mma.tf32_exact_params(conv.prim_func)  # the weight, by its facts
    code = model.source.code
    rounding = [line for line in code.splitlines() if "opf_tf32(" in line and "asm" not in line]
    assert not any("p1" in line for line in rounding)  # the weight as it is
    assert any("p0" in line for line in rounding)  # the input rounded
    assert ("cp.async" in code) == bool(async_stages)
    exe = GPUExecutor(model, InterpretedDevice())
    x = rng.standard_normal((8, 16, 6, 6)).astype("float32")
    got = exe.run(x)[0]
    exe.close()
    rounded = {**params, "w": _tf32(params["w"]).astype("float32")}
    testing.assert_close(got, evaluate(mod, {"x": _tf32(x).astype("float32"), **rounded}), 1e-5)
    testing.assert_close(got, evaluate(mod, {"x": x, **params}), TF32_RTOL)


@pytest.mark.parametrize("func", [
    _conv_relu(8, 16, 32, 6, 3, 1, 1),  # 3x3, padded: the window clamped to the image
    _conv_relu(8, 16, 32, 7, 3, 2, 1),  # strided
    _conv_relu(8, 16, 32, 8, 1, 1, 0),  # pointwise
    _dense_relu(64, 32, 64),
], ids=["3x3", "strided", "pointwise", "dense"])
def test_the_spaces_size_shared_tiles_as_lowering_lays_them_out(func, monkeypatch):
    """Each rule's space sizes a config's shared copies as lowering lays them out
    (``shared_copies``: bank padding, steps in flight, windows clamped to the image): the
    estimate is the lowered tiles' size wherever the copies are pipelined as asked, and
    above it where a single step leaves them plain."""
    from opfusion.backend.cuda.schedules import conv2d_mma
    from opfusion.backend.cuda.schedules import mma as mma_rule

    typed = _typed(func)
    backend = get_backend(TF32)
    rule, space, default = schedule_space(typed, backend)
    anchors = []
    schedule = backend.schedule

    def capture(s, anchor, output, op_name, config=None):
        anchors.append(anchor)
        return schedule(s, anchor, output, op_name, config)

    monkeypatch.setattr(backend, "schedule", capture)  # (the backend may be shared)
    configs = [c for c in [default, *space.sample(6, seed=1), *_each_pipeline(space)]
               if c["shared"]]
    for config in configs:
        group = lower_primitive_function(typed, "g", backend,
                                         {"rule": rule.name, "knobs": dict(config)})
        copies = (conv2d_mma if rule.name == "gpu_conv2d_mma" else mma_rule).shared_copies
        estimate = copies(anchors[-1])(config)
        tiles = [b for b in _allocated(group.prim_func)
                 if b.scope == "shared" and b.name.endswith("_shared")]
        steps = max(config["async_stages"], 2 if config["double_buffer"] else 1)
        pipelined = steps > 1 and all(b.shape[0] == steps for b in tiles)
        actual = sum(b.size for b in tiles)
        if steps == 1 or pipelined:
            assert actual == estimate, (dict(config), actual, estimate)
        else:
            assert actual < estimate


@pytest.mark.parametrize("func", [
    _dense_relu(64, 32, 64), _batch_matmul(2, 16, 24, 32),
    _conv_relu(16, 16, 32, 4, 1, 1, 0), _conv_relu(8, 16, 32, 6, 3, 1, 1),
], ids=["dense", "batch_matmul", "pointwise", "3x3"])
def test_fast_tf32_gives_the_tensor_cores_float32_operands_to_truncate(func):
    """``-tf32=fast``: no operand is rounded (no ``cvt.rna`` in the CUDA, none where a tile
    is stored), and the interpreter truncates each as the tensor cores read it: the result
    is the reference of truncated operands to float32's tolerance, and not that of rounded
    ones (random operands: rounding and truncation differ in about half of them)."""
    group, inputs, out = _run_group(func, target=FAST)
    assert group.schedule_config["rule"] in ("gpu_mma", "gpu_conv2d_mma")
    assert mma.truncates_operands(group.prim_func)
    typed = _typed(func)
    testing.assert_close(out, evaluate(typed, inputs), 2 * TF32_RTOL)
    truncated = [mma.truncate_tf32_array(a) if a.ndim > 1 else a for a in inputs]
    testing.assert_close(out, evaluate(typed, truncated), 1e-5)
    rounded = [_tf32(a).astype("float32") if a.ndim > 1 else a for a in inputs]
    with pytest.raises(AssertionError):
        testing.assert_close(out, evaluate(typed, rounded), 1e-5)
    code = cuda_module([group.prim_func], target=FAST).code
    assert mma.INSTRUCTION in code and "cvt.rna" not in code and "opf_tf32" not in code
    if NO_NVRTC is None:
        assert "mma.sync.aligned.m16n8k8" in compile_cuda(code, "compute_90").decode()



@pytest.mark.parametrize("double_buffer", [False, True])
@pytest.mark.parametrize("target", [TF32, FAST], ids=["tf32", "fast"])
def test_operand_tiles_are_copied_in_16_byte_vectors(double_buffer, target):
    """Each thread copies 4 consecutive steps of a row at a time (``copy_vector``): one
    float4 load from the operand (or into the next step's registers), then the tile's
    elements one by one (its rows padded to an odd stride off the banks), rounded there
    with -tf32=1; the interpreter runs the same loops, so the numbers are checked."""
    func = _dense_relu(64, 32, 64)
    _, space, _ = schedule_space(_typed(func), get_backend(target))
    config = space.config(warps_m=2, warps_n=2, tiles_m=1, tiles_n=2, k_step=16, shared=True,
                          double_buffer=double_buffer, async_stages=0)
    group, inputs, out = _run_group(func, {"rule": "gpu_mma", "knobs": dict(config)}, target)
    testing.assert_close(out, evaluate(_typed(func), inputs), 2 * TF32_RTOL)
    code = cuda_module([group.prim_func], target=target).code
    # x's and w's: the first step's and the next ones' (into registers, whole), then the
    # tile's elements one by one from a float4
    operands = sum(code.count(f"reinterpret_cast<const float4*>({p} + ") for p in ("p0", "p1"))
    assert operands == (4 if double_buffer else 2)
    assert code.count("const float4 v") == (4 if double_buffer else 2)
    assert ("opf_tf32(v" in code) == (target is TF32)
    if NO_NVRTC is None:
        assert "mma.sync.aligned.m16n8k8" in compile_cuda(code, "compute_90").decode()


@pytest.mark.parametrize("case, vectors", [
    ((16, 16, 32, 8, 1, 1, 0), 2),  # pointwise: the input's 4 pixels and the weights' steps
    ((16, 16, 32, 4, 3, 1, 1), 0),  # 3x3, padded: windows that start off a vector
    ((16, 16, 32, 8, 1, 2, 0), 1),  # strided 1x1: the weights; the input every other pixel
])
def test_convolution_tiles_are_copied_in_vectors_where_aligned(case, vectors):
    """A 1x1 convolution's weights are copied 4 input channels at a time, and its input 4
    pixels at a time where it is unpadded, unstrided and a block's pixels are whole vectors
    of a row that whole vectors make; other windows are copied element by element."""
    func = _conv_relu(*case)
    _, space, _ = schedule_space(_typed(func), get_backend(FAST))
    config = space.config(warps_m=1, warps_n=1, tiles_m=1, tiles_n=2, pixels=4, k_step=16,
                          row_steps=False, shared=True, double_buffer=False,
                          staged_store=True, async_stages=0)
    group, inputs, out = _run_group(func, {"rule": "gpu_conv2d_mma", "knobs": dict(config)},
                                    FAST)
    testing.assert_close(out, evaluate(_typed(func), inputs), 2 * TF32_RTOL)
    code = cuda_module([group.prim_func], target=FAST).code
    assert code.count("const float4 v") == vectors


def test_the_shared_memory_a_block_may_opt_in_to():
    assert Target("cuda -arch=sm_90").max_dynamic_shared_memory_per_block == 227 * 1024
    assert Target("cuda -arch=sm_90a").max_dynamic_shared_memory_per_block == 227 * 1024
    assert Target("cuda -arch=sm_80").max_dynamic_shared_memory_per_block == 163 * 1024
    assert Target("cuda -arch=sm_86").max_dynamic_shared_memory_per_block == 99 * 1024
    assert Target("cuda -arch=sm_60").max_dynamic_shared_memory_per_block == 48 * 1024


class _Driver:
    """The driver calls a CUDADevice makes to load a module and launch, recorded."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUfunction_attribute:
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

    def __init__(self):
        self.calls = []

    def cuModuleLoadData(self, image):
        return 0, "module"

    def cuModuleGetFunction(self, module, symbol):
        return 0, symbol.decode()

    def cuFuncSetAttribute(self, fn, attribute, value):
        self.calls.append(("attribute", fn, attribute, value))
        return (0,)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.calls.append(("launch", fn, shared))
        return (0,)


@needs_nvrtc
def test_tiles_past_48_kib_take_dynamic_shared_memory(monkeypatch):
    """A 128 x 128 block with 32 steps double-buffered (66 KiB of tiles): the space admits
    it on sm_90 (not the heuristic); its CUDA takes the tiles at offsets into dynamic
    shared memory, ptxas accepts it, the interpreter computes the reference with it, and
    the device opts the function in to those bytes when it loads the module and launches
    it with them."""
    from opfusion.backend.cuda import runtime
    from opfusion.backend.cuda.emitter import STATIC_SHARED_BYTES

    func = _dense_relu(128, 64, 128)
    _, space, default = schedule_space(_typed(func), get_backend(FAST))
    config = space.config(warps_m=2, warps_n=2, tiles_m=4, tiles_n=8, k_step=32, shared=True,
                          double_buffer=True, async_stages=0)
    assert dict(config) != dict(default)
    group, inputs, out = _run_group(func, {"rule": "gpu_mma", "knobs": dict(config)}, FAST)
    truncated = [mma.truncate_tf32_array(a) if a.ndim > 1 else a for a in inputs]
    testing.assert_close(out, evaluate(_typed(func), truncated), 1e-5)
    source = cuda_module([group.prim_func], target=FAST)
    (launch,) = source.groups[0].launches
    assert STATIC_SHARED_BYTES < launch.shared_bytes <= FAST.max_dynamic_shared_memory_per_block
    assert "extern __shared__ __align__(16) unsigned char opf_dynamic_shared[];" in source.code
    assert "__shared__ float" not in source.code
    assert compile_cuda(source.code, "sm_90").startswith(b"\x7fELF")  # ptxas took it
    device = runtime.CUDADevice.__new__(runtime.CUDADevice)
    device.cu, device.arch, device.module, device._stream = _Driver(), "sm_90", None, 0
    device.functions, device.shared_bytes, device._params = {}, {}, {}
    device.pointer, device._generation = 0, 0
    monkeypatch.setattr("opfusion.backend.cuda.nvrtc.compile_cuda_cached",
                        lambda code, arch: b"cubin")
    device.load(source, {})
    device.prepare(group.name, 0, launch.symbol, launch.grid, launch.block, [])()
    assert device.cu.calls == [
        ("attribute", launch.symbol, 8, launch.shared_bytes),
        ("launch", launch.symbol, launch.shared_bytes)]
