"""opf.compile end to end: fused and unfused executors match the reference interpreter on
real workloads; inputs are checked; kernels can be verified, profiled, exported and loaded."""

import subprocess
import sys

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.compiler.compile import random_inputs
from opfusion.compiler.executor import InputError, KernelMismatchError
from opfusion.compiler.memory_plan import PlannedStep, plan_memory, resolve_aliases
from opfusion.ir import evaluate
from opfusion.testing import assert_close
from opfusion.testing.examples import seed_example
from opfusion.testing.targets import OTHER_TARGETS
from opfusion.testing.workloads import SMALL_WORKLOAD_ARGS, WORKLOADS, workload_input

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

SEED_X = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
SEED_W = np.random.default_rng(1).standard_normal((3, 3, 3, 3)).astype(np.float32)


@pytest.mark.parametrize("fusion", ["tvm", "cinn", "none"])
def test_the_seed_example_compiles_under_every_strategy(fusion):
    mod = seed_example()
    exe = opf.compile(mod, fusion=fusion)
    want = opf.ir.evaluate(mod, [SEED_X, SEED_W])
    assert_close(exe(SEED_X, SEED_W), want, rtol=1e-5)
    assert exe.num_kernels == (5 if fusion == "none" else 1)


@pytest.mark.parametrize("name", ["mlp", "resnet18", "mobilenet_v2", "squeezenet",
                                  "shufflenet_v2", "transformer_encoder"])
def test_workloads_compile_fused_and_unfused_to_the_reference_numbers(name):
    mod, params = WORKLOADS[name](**SMALL_WORKLOAD_ARGS.get(name, {}))
    inputs = workload_input(mod, params, seed=3)
    want = opf.ir.evaluate(mod, {**inputs, **params})
    fused = opf.compile(mod, params=params)
    unfused = opf.compile(mod, params=params, fusion="none")
    assert fused.num_kernels < unfused.num_kernels
    assert_close(fused(**inputs), want, rtol=1e-4)
    assert_close(unfused(**inputs), want, rtol=1e-4)
    for target in OTHER_TARGETS:  # the host target above; an older ISA on the same machine
        assert_close(opf.compile(mod, params=params, target=target)(**inputs), want,
                     rtol=1e-4)


def test_run_returns_a_list_and_call_returns_the_array():
    exe = opf.compile(seed_example())
    outs = exe.run({"x": SEED_X, "weight": SEED_W})
    assert isinstance(outs, list) and len(outs) == 1
    np.testing.assert_array_equal(outs[0], exe(x=SEED_X, weight=SEED_W))
    np.testing.assert_array_equal(outs[0], exe(SEED_X, weight=SEED_W))


def test_several_outputs_come_back_as_a_tuple():
    x = opf.var("x", (4, 8))
    mod = opf.IRModule.from_expr(opf.Function([x], opf.Tuple([opf.op.exp(x),
                                                              opf.op.sum(x, axis=1)])))
    xv = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    got = opf.compile(mod)(xv)
    assert isinstance(got, tuple) and len(got) == 2
    assert_close(got, opf.ir.evaluate(mod, [xv]))


def test_inputs_are_checked_with_clear_errors():
    exe = opf.compile(seed_example())
    with pytest.raises(InputError, match="input 'weight' is missing"):
        exe.run({"x": SEED_X})
    with pytest.raises(InputError, match="unknown input 'y'"):
        exe.run({"x": SEED_X, "weight": SEED_W, "y": SEED_X})
    with pytest.raises(InputError, match=r"'x' must have shape \(1, 3, 16, 16\)"):
        exe(SEED_X[:, :2], SEED_W)
    with pytest.raises(InputError, match="must be float32, got float64"):
        exe(SEED_X.astype(np.float64), SEED_W)
    with pytest.raises(InputError, match="takes 2 input"):
        exe(SEED_X)


def test_bad_strategy_and_target_are_errors():
    with pytest.raises(opf.OpfusionError, match="unknown fusion strategy 'fast'.*tvm, cinn"):
        opf.compile(seed_example(), fusion="fast")
    if not _has_gpu():
        with pytest.raises(opf.OpfusionError, match="CUDA driver"):
            opf.compile(seed_example(), target="cuda")


def _has_gpu() -> bool:
    from opfusion.backend.cuda.runtime import cuda_device

    try:
        cuda_device()
    except opf.errors.DeviceError:
        return False
    return True


def test_strategy_and_level_come_from_the_pass_context():
    with opf.transform.PassContext(opt_level=3, config={"fusion.strategy": "none"}):
        assert opf.compile(seed_example()).num_kernels == 5
    with opf.transform.PassContext(opt_level=0):
        assert opf.compile(seed_example()).num_kernels == 5
    assert opf.compile(seed_example()).num_kernels == 1


def test_a_registered_fusion_strategy_is_what_compile_runs():
    from opfusion.transform import (
        FuseOps,
        fusion_strategies,
        register_fusion_strategy,
        unregister_fusion_strategy,
    )

    assert list(fusion_strategies()) == ["tvm", "cinn", "none"]
    register_fusion_strategy("unfused", lambda mod, level: FuseOps(fuse_opt_level=0)(mod),
                             "every operator alone, under another name")
    try:
        exe = opf.compile(seed_example(), fusion="unfused")
        assert exe.num_kernels == 5
        assert_close(exe(SEED_X, SEED_W), evaluate(seed_example(), [SEED_X, SEED_W]))
        with opf.transform.PassContext(config={"fusion.strategy": "unfused"}):
            assert opf.compile(seed_example()).num_kernels == 5
        with pytest.raises(opf.OpfusionError, match="'unfused' is already registered"):
            register_fusion_strategy("unfused", lambda mod, level: mod, "again")
    finally:
        unregister_fusion_strategy("unfused")
    with pytest.raises(opf.OpfusionError, match="unknown fusion strategy 'unfused'; choose "
                                                "one of tvm, cinn, none"):
        opf.transform.PassContext(config={"fusion.strategy": "unfused"})


def test_memory_plan_reuses_blocks_of_dead_tensors():
    mod, params = WORKLOADS["resnet18"](**SMALL_WORKLOAD_ARGS["resnet18"])
    exe = opf.compile(mod, params=params, fusion="none")
    assert exe.plan.total_bytes < exe.plan.naive_bytes / 3


def test_memory_plan_never_gives_a_step_its_input_block():
    steps = [PlannedStep((0,), (1,)), PlannedStep((1,), (2,)), PlannedStep((2,), (3,))]
    plan = plan_memory(steps, {1: 400, 2: 400, 3: 400}, keep=[3])
    assert plan.block_of[1] != plan.block_of[2] and plan.block_of[2] != plan.block_of[3]
    assert plan.block_of[3] == plan.block_of[1]  # 1 is dead once step 1 has run
    assert plan.total_bytes == 2 * 448 - 0 or plan.total_bytes == 2 * 400 + 2 * 48


def test_verify_names_a_kernel_that_computes_wrong_numbers():
    exe = opf.compile(seed_example(), fusion="none")
    assert all(line.endswith(": ok") for line in exe.verify(random_inputs(exe)))
    relu = next(step for step in exe.steps if step.group.op_names == ["nn.relu"])
    relu.group.function = opf.Function(relu.group.function.params,
                                       opf.op.negative(relu.group.function.params[0]),
                                       attrs={"Primitive": 1})
    with pytest.raises(KernelMismatchError, match=r"kernel fused_nn_relu_\d+ \(nn.relu\)"):
        exe.verify(random_inputs(exe))


def test_profile_names_the_fused_operators():
    exe = opf.compile(seed_example())
    report = exe.profile([SEED_X, SEED_W], repeat=3)
    text = str(report)
    assert "nn.conv2d, add, nn.relu, multiply, add" in text
    assert report.total_seconds > 0
    assert "int32_t fused_nn_conv2d" in exe.source()


def test_export_then_load_in_a_fresh_process_gives_identical_outputs(tmp_path):
    mod, params = WORKLOADS["mlp"](**SMALL_WORKLOAD_ARGS.get("mlp", {}))
    inputs = workload_input(mod, params, seed=5)
    exe = opf.compile(mod, params=params)
    path = tmp_path / "mlp.opf"
    exe.export(path)
    name, array = next(iter(inputs.items()))
    np.save(tmp_path / "x.npy", array)
    np.save(tmp_path / "y.npy", exe(**inputs))
    code = ("import numpy as np, opfusion as opf, sys\n"
            f"exe = opf.load({str(path)!r})\n"
            f"y = exe({name}=np.load({str(tmp_path / 'x.npy')!r}))\n"
            f"sys.exit(0 if np.array_equal(y, np.load({str(tmp_path / 'y.npy')!r})) else 3)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_loading_a_foreign_or_corrupt_file_is_a_clear_error(tmp_path):
    from opfusion.compiler.artifact import ArtifactError

    bogus = tmp_path / "model.opf"
    bogus.write_bytes(b"not a zip at all")
    with pytest.raises(ArtifactError, match="is not an opfusion artifact"):
        opf.load(bogus)
    with pytest.raises(ArtifactError, match="no such file"):
        opf.load(tmp_path / "missing.opf")


def test_an_artifact_for_a_cpu_with_other_features_is_refused_before_loading(tmp_path):
    import json
    import zipfile

    from opfusion.compiler.artifact import ArtifactError

    path = tmp_path / "seed.opf"
    opf.compile(seed_example()).export(path)
    forged = tmp_path / "forged.opf"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(forged, "w") as dst:
        for item in src.namelist():
            data = src.read(item)
            if item == "manifest.json":
                manifest = json.loads(data)
                manifest["isa_features"].append("avx512_imaginary")
                data = json.dumps(manifest).encode()
            dst.writestr(item, data)
    with pytest.raises(ArtifactError, match="features this one lacks \\(avx512_imaginary\\)"):
        opf.load(forged)


def test_inputs_a_kernel_never_reads_are_accepted():
    # layer_norm without centering ignores its beta; the kernel still takes it.
    x, g, b = opf.var("x", (4, 8)), opf.var("g", (8,)), opf.var("b", (8,))
    mod = opf.IRModule.from_expr(opf.Function(
        [x, g, b], opf.op.nn.layer_norm(x, g, b, center=False)))
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(4, 8), (8,), (8,)]]
    assert_close(opf.compile(mod)(*arrays), opf.ir.evaluate(mod, arrays))


def test_memory_plan_places_aliased_values_inside_their_holder():
    # 1 and 2 are the pieces of 3 (a concatenation done in place), which step 2 reads
    steps = [PlannedStep((0,), (1,)), PlannedStep((0,), (2,)), PlannedStep((3,), (4,))]
    plan = plan_memory(steps, {1: 448, 2: 448, 3: 896, 4: 896}, keep=[],
                       aliases={1: (3, 0), 2: (3, 448)})
    assert plan.block_of[1] == plan.block_of[2] == plan.block_of[3] != plan.block_of[4]
    assert (plan.byte_offset(1), plan.byte_offset(2), plan.byte_offset(3)) == (0, 448, 0)
    assert plan.block_sizes[plan.block_of[3]] == 896


def test_aliases_nest_and_resolve_to_the_outermost_holder():
    # DenseNet: each concatenation's result is the first piece of the next one's
    aliases = {1: (3, 0), 2: (3, 64), 3: (5, 0), 4: (5, 128), 5: (7, 0), 6: (7, 192)}
    assert resolve_aliases(aliases) == {1: (7, 0), 2: (7, 64), 3: (7, 0), 4: (7, 128),
                                        5: (7, 0), 6: (7, 192)}
    with pytest.raises(ValueError, match="cycle"):
        resolve_aliases({1: (2, 0), 2: (1, 0)})


def _concat_model(batch=1, channels=(8, 16), axis=1, chain=False):
    """Convolutions of x concatenated along ``axis`` (and, with ``chain``, that result
    concatenated again with a third convolution of it, as DenseNet grows), then a relu."""
    rng = np.random.default_rng(3)
    x = opf.var("x", shape=(batch, 4, 6, 6))

    def conv(data, out):
        w = rng.standard_normal((out, int(data.checked_type.shape[1]) if hasattr(
            data, "checked_type") and data.checked_type else 4, 3, 3)).astype("float32")
        return opf.op.nn.conv2d(data, opf.const(w), padding=1)

    cat = opf.op.concatenate([conv(x, c) for c in channels], axis=axis)
    if chain:
        w = rng.standard_normal((8, sum(channels), 1, 1)).astype("float32")
        grown = opf.op.nn.conv2d(cat, opf.const(w))
        cat = opf.op.concatenate([cat, grown], axis=1)
    return opf.IRModule.from_expr(opf.Function([x], opf.op.nn.relu(cat)))


def _concat_steps(exe):
    return [s for s in exe.steps if s.group.op_names == ["concatenate"]]


@pytest.mark.parametrize("chain", [False, True], ids=["one", "nested"])
def test_a_channel_concatenation_at_batch_1_runs_in_place(chain):
    mod = _concat_model(chain=chain)
    x = np.random.default_rng(0).standard_normal((1, 4, 6, 6)).astype("float32")
    want = evaluate(mod, [x])
    for fusion in ("tvm", "none"):
        exe = opf.compile(mod, fusion=fusion)
        assert_close(exe.run([x])[0], want, 1e-5)
        if fusion == "none":  # (fused, the relu after the concatenation joins it)
            assert not _concat_steps(exe) and exe.plan.aliases
            with opf.transform.PassContext(config={"compile.inplace_concatenate": False}):
                assert _concat_steps(opf.compile(mod, fusion=fusion))


@pytest.mark.parametrize("case", ["batch 2", "not the outer axis", "a model output",
                                  "an operand in two concatenations"])
def test_concatenations_that_cannot_run_in_place_stay_copies(case):
    x = opf.var("x", shape=(1, 8, 4, 4))
    a, b = opf.op.exp(x), opf.op.negative(x)
    if case == "batch 2":
        x = opf.var("x", shape=(2, 8, 4, 4))
        a, b = opf.op.exp(x), opf.op.negative(x)
        out = opf.op.nn.relu(opf.op.concatenate([a, b], axis=1))
    elif case == "not the outer axis":
        out = opf.op.nn.relu(opf.op.concatenate([a, b], axis=2))
    elif case == "a model output":
        out = opf.op.concatenate([a, b], axis=1)
    else:
        out = opf.op.add(opf.op.concatenate([a, b], axis=1), opf.op.concatenate([a, a], axis=1))
    mod = opf.IRModule.from_expr(opf.Function([x], out))
    exe = opf.compile(mod, fusion="none")
    value = np.random.default_rng(0).standard_normal(x.type_annotation.shape).astype("float32")
    assert_close(exe.run([value])[0], evaluate(mod, [value]), 1e-5)
    steps = _concat_steps(exe)
    if case == "an operand in two concatenations":
        assert len(steps) == 1 and len(exe.plan.aliases) == 2  # the first is in place
    else:
        assert len(steps) == 1 and not exe.plan.aliases



def _reshape_steps(exe):
    return [s for s in exe.steps if s.group.op_names and set(s.group.op_names) <= {"reshape"}]


def _reshaped_model():
    """exp(x) reshaped for a product, and read again after it (a concatenation with the
    product's result, reshaped back)."""
    x = opf.var("x", shape=(6, 8))
    w = np.random.default_rng(1).standard_normal((4, 5)).astype("float32")
    e = opf.op.exp(x)
    product = opf.op.nn.matmul(opf.op.reshape(e, newshape=[12, 4]), opf.const(w))
    out = opf.op.concatenate([opf.op.reshape(product, newshape=[6, 10]), e], axis=1)
    return opf.IRModule.from_expr(opf.Function([x], opf.op.nn.relu(out)))


@pytest.mark.parametrize("fusion", ["tvm", "none"])
def test_a_reshape_of_an_intermediate_runs_in_place(fusion):
    # the reshape's operand is placed where its result is, and no kernel copies it
    mod = _reshaped_model()
    value = np.random.default_rng(0).standard_normal((6, 8)).astype("float32")
    exe = opf.compile(mod, fusion=fusion)
    assert_close(exe.run([value])[0], evaluate(mod, [value]), 1e-5)
    if fusion == "none":  # (fused, each reshape joins a neighbour's kernel)
        assert not _reshape_steps(exe) and exe.plan.aliases
        with opf.transform.PassContext(config={"compile.inplace_reshape": False}):
            copied = opf.compile(mod, fusion=fusion)
        assert len(_reshape_steps(copied)) == 2
        assert_close(copied.run([value])[0], exe.run([value])[0], 0)


@pytest.mark.parametrize("case", ["a model input", "a model output"])
def test_reshapes_that_cannot_run_in_place_stay_copies(case):
    x = opf.var("x", shape=(6, 8))
    if case == "a model input":
        out = opf.op.exp(opf.op.reshape(x, newshape=[12, 4]))
    else:
        e = opf.op.exp(x)
        out = opf.Tuple([e, opf.op.reshape(e, newshape=[12, 4])])
    mod = opf.IRModule.from_expr(opf.Function([x], out))
    value = np.random.default_rng(0).standard_normal((6, 8)).astype("float32")
    exe = opf.compile(mod, fusion="none")
    got, want = exe.run([value]), evaluate(mod, [value])
    for g, w in zip(got, want if isinstance(want, tuple) else [want]):
        assert_close(g, w, 1e-5)
    assert len(_reshape_steps(exe)) == 1 and not exe.plan.aliases


def _slice_steps(exe):
    return [s for s in exe.steps if s.group.op_names == ["strided_slice"]]


def _split_model(batch=1, axis=1, late=True):
    """exp(x) sliced in two along ``axis``; the first part read only after a product that
    needs memory of its own (so the split's operand must outlive its last direct reader),
    the second at once."""
    x = opf.var("x", shape=(batch, 32, 4, 4))
    e = opf.op.exp(x)
    half = 16 if axis == 1 else 2
    parts = [opf.op.strided_slice(e, begin=[i * half], end=[(i + 1) * half], axes=[axis])
             for i in range(2)]
    w = np.random.default_rng(2).standard_normal((16, 16, 1, 1)).astype("float32")
    first = opf.op.nn.relu(opf.op.nn.conv2d(parts[1], opf.const(w))) if axis == 1 \
        else opf.op.negative(parts[1])
    late_part = opf.op.sigmoid(parts[0]) if late else parts[0]
    return opf.IRModule.from_expr(opf.Function([x], opf.op.concatenate(
        [opf.op.tanh(first), late_part], axis=axis)))


def test_a_contiguous_slice_of_an_intermediate_is_read_in_place():
    mod = _split_model()
    value = np.random.default_rng(0).standard_normal((1, 32, 4, 4)).astype("float32")
    exe = opf.compile(mod, fusion="none")
    assert not _slice_steps(exe) and len(exe.plan.views) == 2
    assert_close(exe.run([value])[0], evaluate(mod, [value]), 1e-5)
    with opf.transform.PassContext(config={"compile.inplace_reshape": False}):
        copied = opf.compile(mod, fusion="none")
    assert len(_slice_steps(copied)) == 2 and not copied.plan.views
    assert_close(copied.run([value])[0], exe.run([value])[0], 0)


@pytest.mark.parametrize("case", ["batch 2", "not the outer axis"])
def test_slices_that_are_not_contiguous_stay_copies(case):
    mod = _split_model(batch=2) if case == "batch 2" else _split_model(axis=2)
    shape = mod["main"].params[0].type_annotation.shape
    value = np.random.default_rng(0).standard_normal(shape).astype("float32")
    exe = opf.compile(mod, fusion="none")
    assert len(_slice_steps(exe)) == 2 and not exe.plan.views
    assert_close(exe.run([value])[0], evaluate(mod, [value]), 1e-5)
