"""The CUDA backend without a GPU: every GPU schedule (the default one and the products'
shared-memory tiles, any config of their spaces) checked against the reference in the
loop-IR interpreter, which runs blocks and threads as a GPU does; the executor on the
interpreter device; the CUDA C it emits; NVRTC builds of every light model's and transformer
block's kernels for sm_80 and sm_90 (PTX), when NVRTC is installed; and, on a machine with
an NVIDIA GPU only, those models run on it against the reference."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import opfusion as opf
from opfusion import op, testing
from opfusion.backend import get_backend
from opfusion.backend.cuda.nvrtc import compile_cuda, nvrtc_available
from opfusion.backend.cuda.runtime import InterpretedDevice, cuda_device, gpu_unavailable
from opfusion.backend.cuda.schedules import RULES
from opfusion.compiler.gpu import GPUExecutor, build_gpu_model, interpret_inputs
from opfusion.compiler.lower_group import lower_primitive_function
from opfusion.errors import BuildError, CompileError, DeviceError
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function, Tuple, Var
from opfusion.ir.types import TensorType
from opfusion.target import Target
from opfusion.target.target import TargetError
from opfusion.tir.interp import run

CUDA = Target("cuda -arch=sm_90")
NO_NVRTC = nvrtc_available()
needs_nvrtc = pytest.mark.skipif(NO_NVRTC is not None, reason=f"NVRTC: {NO_NVRTC}")


def _check_group(func: Function, config=None):
    """Lower ``func`` (one fused group) for CUDA with ``config``, run it in the interpreter
    as a GPU would, and compare with the reference."""
    mod = opf.transform.InferType()(opf.IRModule.from_expr(func))
    func = mod["main"]
    group = lower_primitive_function(func, "group", get_backend(CUDA), config)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(tuple(p.type_annotation.shape)).astype("float32")
              for p in func.params]
    out = np.zeros(tuple(func.body.checked_type.shape), "float32")
    run(group.prim_func, *inputs, *[np.array(c) for c in group.constants], out)
    testing.assert_close(out, evaluate(func, inputs), 1e-5)
    return group


def _dense_relu(m, k, n):
    x, w, b = (Var("x", TensorType((m, k), "float32")), Var("w", TensorType((n, k), "float32")),
               Var("b", TensorType((n,), "float32")))
    return Function([x, w, b], op.nn.relu(op.nn.bias_add(op.nn.dense(x, w), b)))


def _batch_matmul(batch, m, k, n):
    a, b = Var("a", TensorType((batch, m, k), "float32")), Var("b", TensorType((batch, k, n),
                                                                               "float32"))
    return Function([a, b], op.nn.batch_matmul(a, b, transpose_b=False))


def _space(func):
    mod = opf.transform.InferType()(opf.IRModule.from_expr(func))
    from opfusion.compiler.lower_group import schedule_space

    found = schedule_space(mod["main"], get_backend(CUDA))
    assert found is not None
    return found


@pytest.mark.parametrize("shape", [(5, 24, 16), (37, 70, 45), (1, 300, 100), (64, 32, 128)])
def test_product_tiles_with_the_default_config(shape):
    group = _check_group(_dense_relu(*shape))
    assert group.schedule_config["rule"] == "gpu_matmul"
    assert "bind[threadIdx.x]" in str(group.prim_func)


def test_every_sampled_config_of_the_product_space_computes_the_reference():
    func = _dense_relu(19, 21, 23)
    rule, space, default = _space(func)
    assert rule is RULES.get("gpu_matmul")
    configs = [default, *space.sample(10, seed=1)]
    assert any(not c["shared"] for c in configs) and any(c["shared"] for c in configs)
    for config in configs:
        _check_group(func, config)


def test_batched_products_use_the_grid_z_axis():
    group = _check_group(_batch_matmul(3, 17, 9, 20))
    assert "bind[blockIdx.z]" in str(group.prim_func)
    assert "sync_threads()" in str(group.prim_func)


def _conv(batch, channels, out_channels, size, kernel, stride, pad, groups):
    x = Var("x", TensorType((batch, channels, size, size), "float32"))
    w = Var("w", TensorType((out_channels, channels // groups, kernel, kernel), "float32"))
    b = Var("b", TensorType((out_channels,), "float32"))
    conv = op.nn.conv2d(x, w, padding=(pad, pad), strides=(stride, stride), groups=groups)
    return Function([x, w, b], op.nn.relu(op.nn.bias_add(conv, b)))


@pytest.mark.parametrize("case, shared", [
    ((1, 5, 6, 9, 3, 2, 1, 1), True),     # stride 2, channels short of a block
    ((1, 4, 4, 8, 3, 1, 1, 4), True),     # depthwise
    ((2, 6, 4, 7, 1, 1, 0, 2), True),     # grouped 1x1, two images
    ((1, 3, 40, 11, 7, 2, 3, 1), True),   # a 7x7 stem
    ((1, 24, 36, 10, 3, 1, 2, 1), True),  # padding 2, the wide-window tile
    ((1, 24, 36, 10, 1, 1, 0, 1), False),  # pointwise: tall register tiles
    ((1, 24, 36, 20, 3, 2, 1, 1), True),  # strided 3x3: narrow blocks, weights shared
    ((1, 24, 36, 20, 1, 2, 0, 1), False),  # strided 1x1: one-warp blocks
    ((2, 24, 64, 7, 1, 1, 0, 1), True),  # 1x1 of 49 pixels: 64 x 128 blocks, weights shared
])
def test_convolution_tiles_with_the_default_config(case, shared):
    group = _check_group(_conv(*case))
    assert group.schedule_config["rule"] == "gpu_conv2d"
    assert group.schedule_config["knobs"]["shared"] == shared
    assert ("shared" in str(group.prim_func)) == shared


def test_every_sampled_config_of_the_convolution_space_computes_the_reference():
    func = _conv(1, 9, 10, 7, 3, 1, 1, 1)
    rule, space, default = _space(func)
    assert rule.name == "gpu_conv2d"
    for config in [default, *space.sample(8, seed=2)]:
        _check_group(func, config)


@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 300), (4, 1000)])
@pytest.mark.parametrize("rows_op", ["softmax", "log_softmax", "layer_norm"])
def test_rows_one_block_per_row(shape, rows_op):
    x = Var("x", TensorType(shape, "float32"))
    gamma, beta = (Var(n, TensorType(shape[-1:], "float32")) for n in ("g", "b"))
    if rows_op == "layer_norm":
        func = Function([x, gamma, beta], op.nn.layer_norm(x, gamma, beta, axis=-1))
    else:
        func = Function([x], getattr(op.nn, rows_op)(x, axis=-1))
    group = _check_group(func)
    assert group.schedule_config["rule"] == "gpu_rows"
    text = str(group.prim_func)
    assert "bind[blockIdx.x]" in text
    if shape[-1] >= 300 and rows_op != "layer_norm":
        assert "shared" in text and "sync_threads()" in text  # partial maxima per thread


@pytest.mark.parametrize("case", [
    (1, 2, 5, 7, 8, None),                # no bias, rows and keys short of a warp
    (2, 3, 9, 40, 16, (1, 1, 9, 40)),     # a bias per query and key (a causal mask's form)
    (1, 2, 3, 300, 8, (1, 1, 1, 300)),    # a padding mask; long rows split by rfactor
])
def test_attention_one_block_per_query_row(case):
    batch, heads, queries, keys, depth, bias_shape = case
    q = Var("q", TensorType((batch, heads, queries, depth), "float32"))
    k = Var("k", TensorType((batch, heads, depth, keys), "float32"))
    v = Var("v", TensorType((batch, heads, keys, depth), "float32"))
    params = [q, k, v]
    if bias_shape is None:
        bias = opf.const(np.float32(0))
    else:
        bias = Var("bias", TensorType(bias_shape, "float32"))
        params.append(bias)
    group = _check_group(Function(params, op.nn.attention(q, k, v, bias, scale=0.3)))
    assert group.schedule_config["rule"] == "gpu_rows"
    assert len(get_backend(CUDA).generate([group.prim_func]).groups[0].launches) == 1


def test_every_rows_config_computes_the_reference():
    x = Var("x", TensorType((3, 130), "float32"))
    func = Function([x], op.nn.softmax(x, axis=-1))
    rule, space, _ = _space(func)
    assert rule.name == "gpu_rows"
    for config in space:
        _check_group(func, config)


@pytest.mark.parametrize("threads", [64, 1024])
@pytest.mark.parametrize("elements", [0, 1, 8])
@pytest.mark.parametrize("vector", [1, 4])
def test_default_schedule_elements_per_thread(threads, elements, vector):
    x = Var("x", TensorType((3, 50, 7), "float32"))
    func = Function([x], op.sum(op.sigmoid(x), axis=[1]))  # a reduction: never vectors
    knobs = {"threads": threads, "elements": elements, "vector": vector}
    group = _check_group(func, knobs)
    assert group.schedule_config == {"rule": "gpu_default", "knobs": knobs}
    y = Var("y", TensorType((3, 1001), "float32"))  # blocks of 64 x 8 and a tail
    _check_group(Function([y], op.nn.relu(op.add(y, op.sigmoid(y)))), knobs)
    z = Var("z", TensorType((3, 1000), "float32"))  # rows of whole vectors
    bias = Var("bias", TensorType((1000,), "float32"))  # broadcast: read in place
    group = _check_group(Function([z, bias], op.multiply(op.add(z, bias), op.sigmoid(z))),
                         knobs)
    code = get_backend(CUDA).generate([group.prim_func]).code
    assert code.count("reinterpret_cast<const float4*>") == (2 if vector == 4 else 0)
    # A reduction and an elementwise result in one group, both reading the input.
    u = Var("u", TensorType((4, 64), "float32"))
    _check_group(Function([u], op.subtract(u, op.mean(u, axis=[1], keepdims=True))), knobs)


@needs_nvrtc
def test_vector_steps_are_16_byte_accesses():
    z = Var("z", TensorType((64, 96), "float32"))
    func = Function([z], op.nn.relu(op.sigmoid(z)))
    mod = opf.transform.InferType()(opf.IRModule.from_expr(func))
    group = lower_primitive_function(mod["main"], "vectors", get_backend(CUDA),
                                     {"threads": 128, "elements": 2, "vector": 4})
    ptx = get_backend(CUDA).generate([group.prim_func]).code
    from opfusion.backend.cuda.nvrtc import compile_cuda

    text = compile_cuda(ptx, "compute_90").decode()
    assert "ld.global.nc.v4.f32" in text and "st.global.v4.f32" in text


def test_large_elementwise_stages_take_several_elements_per_thread():
    from opfusion.backend.cuda.schedules.default import (
        DEFAULT_VECTOR,
        LARGE_ELEMENTS,
        LARGE_EXTENT,
    )

    for extent, vector in ((LARGE_EXTENT + 300, DEFAULT_VECTOR), (LARGE_EXTENT + 301, 1)):
        # the default moves whole 16-byte vectors where the innermost axis holds them
        x = Var("x", TensorType((extent,), "float32"))
        func = Function([x], op.sigmoid(x))
        mod = opf.transform.InferType()(opf.IRModule.from_expr(func))
        group = lower_primitive_function(mod["main"], "sigmoid", get_backend(CUDA))
        source = get_backend(CUDA).generate([group.prim_func])
        (code,) = source.groups
        (launch,) = code.launches
        per_block = 256 * LARGE_ELEMENTS  # elements per thread, single or in vectors
        assert launch.block == (256, 1, 1)
        assert launch.grid == (-(-extent // per_block), 1, 1)
        assert "#pragma unroll" in source.code
        assert ("reinterpret_cast<const float4*>" in source.code) == (vector > 1)


def test_cuda_source_has_a_kernel_per_launch():
    func = _dense_relu(37, 70, 45)
    mod = opf.transform.InferType()(opf.IRModule.from_expr(func))
    small = Target("cuda -sms=4")  # a GPU of 4 multiprocessors: 4 blocks of 32 x 32 fill it
    group = lower_primitive_function(mod["main"], "dense_relu", get_backend(small))
    source = get_backend(small).generate([group.prim_func])
    text = source.code
    assert 'extern "C" __global__ void __launch_bounds__(256) dense_relu(' in text
    assert "__shared__ float" in text and "__syncthreads();" in text
    assert "#include" not in text  # NVRTC has no C library headers
    (code,) = source.groups
    (launch,) = code.launches
    assert launch.grid == (2, 2, 1) and launch.block == (16, 16, 1)  # 32 x 32 tiles of 2 x 2


def test_opf_compile_for_cuda_needs_a_driver():
    try:
        cuda_device()
    except DeviceError:
        with pytest.raises(DeviceError, match="CUDA driver"):
            opf.compile(_dense_relu(4, 4, 4), target="cuda")
    with pytest.raises(DeviceError):
        get_backend(CUDA).load("", [])
    if NO_GPU is not None:
        with pytest.raises(DeviceError, match="CUDA driver"):
            opf.tune(_dense_relu(4, 4, 4), target="cuda", trials=1)
    with pytest.raises(DeviceError, match="runner='local'"):
        opf.tune(_dense_relu(4, 4, 4), target="cuda", trials=1, runner="ray")


def _reference(mod, params, inputs):
    names = [p.name_hint for p in mod["main"].params if p.name_hint not in params]
    return evaluate(mod, {**dict(zip(names, inputs)), **params})


@pytest.mark.parametrize("name, extra, runs_again", [
    ("mlp", {}, True), ("transformer_encoder", {}, True),
    ("shufflenet_v2", {"image_shape": (3, 16, 16)}, True),
    # depthwise and 1x1, residual adds; 13 s a run in the interpreter, so run once
    ("mobilenet_v2", {"image_shape": (3, 16, 16)}, False),
])
def test_small_workloads_run_on_the_interpreted_device(name, extra, runs_again):
    mod, params = testing.WORKLOADS[name](**{**testing.SMALL_WORKLOAD_ARGS[name], **extra})
    model = build_gpu_model(mod, params, CUDA)
    device = InterpretedDevice()
    exe = GPUExecutor(model, device)
    inputs = interpret_inputs(model)
    got = exe.run(*inputs)
    testing.assert_close(got[0], _reference(mod, params, inputs), 1e-4)
    launches = {g.name: len(g.launches) for g in model.source.groups}
    assert device.launches == sum(launches.get(s.group.name, 0) for s in model.steps)
    assert exe.workspace_bytes <= exe.naive_bytes  # intermediates share planned blocks
    if runs_again:
        assert [name for name, _ in exe.profile(*inputs)] == [s.group.name for s in model.steps]
        feeds = dict(zip(model.input_names, inputs))  # the same executor again, by input name
        testing.assert_close(exe.run(feeds)[0], got[0], 0)
        with pytest.raises(opf.errors.OpfusionError, match="must be float32"):
            exe.run(*[np.asarray(a, "float64") for a in inputs])
    exe.close()


def test_groups_of_several_launches_and_tuple_results_on_the_interpreted_device():
    # The mean is four launches (blocked partial sums, tail, total, quotient) sharing three
    # global temporaries, which the executor's plan places; the model returns two results.
    x = Var("x", TensorType((3, 50), "float32"))
    centred = op.subtract(x, op.mean(x, axis=[1], keepdims=True))
    func = Function([x], Tuple([op.nn.relu(centred), op.max(x, axis=[1])]))
    model = build_gpu_model(func, target=CUDA)
    assert max(len(g.launches) for g in model.source.groups) > 1
    assert any(g.temporaries for g in model.source.groups)
    data = np.random.default_rng(4).standard_normal((3, 50)).astype("float32")
    got = GPUExecutor(model, InterpretedDevice()).run(data)
    for result, want in zip(got, evaluate(func, [data])):
        testing.assert_close(result, want, 1e-5)


def test_host_steps_run_between_the_launches():
    x = Var("x", TensorType((3, 9), "float32"))
    order = op.cast(op.argsort(op.nn.relu(x), axis=-1), dtype="float32")
    func = Function([x], op.multiply(order, op.sigmoid(x)))
    model = build_gpu_model(func, target=CUDA)
    assert model.reference_steps  # argsort has no TE compute
    data = np.random.default_rng(3).standard_normal((3, 9)).astype("float32")
    got = GPUExecutor(model, InterpretedDevice()).run(data)
    testing.assert_close(got[0], evaluate(func, [data]), 1e-6)


@needs_nvrtc
def test_nvrtc_compiles_and_reports_errors():
    func = _dense_relu(8, 8, 8)
    model = build_gpu_model(func, target=CUDA)
    ptx = model.compile("compute_80")
    assert b".entry" in ptx
    assert len(model.compile("sm_90")) > 0  # a cubin
    with pytest.raises(CompileError, match="NVRTC rejected"):
        compile_cuda('extern "C" __global__ void k() { undefined_name = 1; }', "compute_80")
    with pytest.raises(BuildError, match="architecture"):
        compile_cuda("", "sm_90; rm -rf /")
    with pytest.raises(BuildError, match="not a GPU architecture"):
        assert Target("cuda -arch=sm_90;rm").cuda_arch


def _onnx_model(name):
    """A light model or a transformer block (BERT layer, GPT block) as an IRModule."""
    onnx = pytest.importorskip("onnx")
    from opfusion.frontend import from_onnx

    path = (testing.transformer_model(name) if name in testing.TRANSFORMER_MODEL_NAMES
            else testing.light_model(name))
    return from_onnx(onnx.load(str(path)))


MODELS = [*testing.LIGHT_MODEL_NAMES, *testing.TRANSFORMER_MODEL_NAMES]


@needs_nvrtc
@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_model_kernels_compile_with_nvrtc(name):
    mod, params = _onnx_model(name)
    model = build_gpu_model(mod, params, CUDA)
    assert not model.reference_steps
    # NVRTC runs outside the GIL: the two builds side by side take half the time
    with ThreadPoolExecutor(max_workers=2) as pool:
        for ptx in pool.map(model.compile, ("compute_80", "compute_90")):
            assert ptx.count(b".entry") == sum(len(g.launches) for g in model.source.groups)


@needs_nvrtc
def test_cubins_are_cached_with_their_digest(tmp_path, monkeypatch):
    from opfusion.backend.cuda.nvrtc import compile_cuda_cached

    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))
    source = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }'
    first = compile_cuda_cached(source, "sm_80")
    (entry,) = (tmp_path / "kernels" / "cuda").glob("*.cubin")
    assert compile_cuda_cached(source, "sm_80") == first  # a hit
    entry.write_bytes(b"not a cubin")  # damaged: its digest no longer matches
    assert compile_cuda_cached(source, "sm_80") == first  # compiled again, not loaded
    assert entry.read_bytes() == first
    from opfusion.backend.cpu.toolchain import cache_info

    assert cache_info(tmp_path / "kernels").entries >= 1  # counted against the limit


NO_GPU = gpu_unavailable()


@pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))
@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_models_on_the_gpu_match_the_reference(name):
    mod, params = _onnx_model(name)
    exe = opf.compile(mod, params=params, target="cuda")
    inputs = interpret_inputs(exe.model)
    got = exe.run(*inputs)
    rtol = testing.light_model_tolerance(name)  # deep random networks: see its docstring
    testing.assert_close(got[0], _reference(mod, params, inputs), rtol)
    assert [group for group, _ in exe.profile(*inputs)] == [s.group.name
                                                             for s in exe.model.steps]
    exe.close()


def test_product_tiles_shrink_until_every_multiprocessor_has_a_block():
    func = _dense_relu(37, 70, 45)
    mod = opf.transform.InferType()(opf.IRModule.from_expr(func))
    for spec, tile in (("cuda -sms=1", 64), ("cuda -sms=4", 32), ("cuda -arch=sm_90", 16)):
        target = Target(spec)
        group = lower_primitive_function(mod["main"], "dense_relu", get_backend(target))
        assert group.schedule_config["knobs"]["block_rows"] == tile, spec
    assert Target("cuda -arch=sm_90").multiprocessors == 132
    assert Target("cuda -arch=sm_90a").multiprocessors == 132
    assert Target("cuda").multiprocessors == 108
    with pytest.raises(TargetError, match="-sms=0"):
        assert Target("cuda -sms=0").multiprocessors


@pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))
def test_torch_tensors_on_the_gpu_are_inputs():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    func = _dense_relu(37, 70, 45)
    exe = opf.compile(func, target="cuda")
    inputs = interpret_inputs(exe.model)
    on_gpu = [torch.from_numpy(a).cuda() for a in inputs]
    testing.assert_close(exe.run(*on_gpu)[0], exe.run(*inputs)[0], 0.0)
    exe.close()


def test_launches_beyond_the_gpus_limits_are_refused():
    from opfusion.backend.cuda.emitter import check_launch
    from opfusion.tir import expr as E
    from opfusion.tir import stmt as S
    from opfusion.tir.launch import Launch

    store = S.Evaluate(E.IntImm(0))
    check_launch("ok", Launch(store, (2**31 - 1, 65535, 65535), (1024, 1, 1)), CUDA)
    with pytest.raises(BuildError, match="grid of 70000 along y"):
        check_launch("k", Launch(store, (1, 70000, 1), (32, 1, 1)), CUDA)
    with pytest.raises(BuildError, match="2048 threads per block"):
        check_launch("k", Launch(store, (1, 1, 1), (1024, 2, 1)), CUDA)
    tile = E.Buffer("tile", (20000,), "float32", "shared")  # past 48 KiB: dynamic
    check_launch("k", Launch(S.Allocate(tile, store), (1, 1, 1), (32, 1, 1)),
                 Target("cuda -arch=sm_90"))
    with pytest.raises(BuildError, match="80000 bytes of shared memory; .* allows 65536"):
        check_launch("k", Launch(S.Allocate(tile, store), (1, 1, 1), (32, 1, 1)),
                     Target("cuda -arch=sm_75"))
    tile = E.Buffer("tile", (60000,), "float32", "shared")
    with pytest.raises(BuildError, match="240000 bytes of shared memory"):
        check_launch("k", Launch(S.Allocate(tile, store), (1, 1, 1), (32, 1, 1)), CUDA)
