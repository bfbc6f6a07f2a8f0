"""The CPU schedule rules as a tuner sees them: every rule computes the reference's numbers
with *any* config of its space (the default, samples, the smallest and the largest tiles),
on an AVX2 target and on the host; configs are JSON and a config outside the space is a
ScheduleError naming the knob; and the defaults on AVX2 are the measured choices."""

import json
import shutil

import numpy as np
import pytest

import opfusion as opf
from opfusion import te
from opfusion.backend import get_backend
from opfusion.backend.cpu.schedules import RULES
from opfusion.backend.schedule_rule import Config, ConfigSpace, Knob, ScheduleError
from opfusion.compiler.lower_group import lower_primitive_function
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function
from opfusion.ir.module import IRModule
from opfusion.opdefs import _winograd as winograd
from opfusion.opdefs.nn import group_window_weight
from opfusion.target import Target
from opfusion.te.lower import lower
from opfusion.testing import assert_close
from opfusion.tir.work import kernel_work
from opfusion.topi import get_compute
from opfusion.topi.testing import call_over_arrays

pytestmark = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")),
                                reason="no C compiler")

nn = opf.op.nn
AVX2 = "c -mattr=+avx2,+fma"
#: The AVX2 target with the caches the default sizes were measured with (Zen 3: 32 KiB of
#: L1, 1 MiB of L2), whatever the host has.
AVX2_MEASURED = "c -mattr=+avx2,+fma -l1-cache=32K -l2-cache=1M -num-cores=2"
TARGETS = [AVX2, "c"]


@pytest.fixture(autouse=True)
def private_kernel_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


#: A rule's kernel over the same stages unscheduled, in innermost statement executions: tiles
#: round extents up and LRN's squares cover their window's padding (1.78x on these small
#: shapes); a stage recomputed at every iteration of a loop it does not map onto is many
#: times more (see tests/compiler/test_kernel_work.py).
MAX_WORK = 2.0


class Group:
    """One call's kernel, optionally with a ``relu(result + bias)`` epilogue (the add inlined
    as the group lowering does), built from the computes under the current target."""

    def __init__(self, builder, arrays, epilogue=False, **attrs):
        call, params, values = call_over_arrays(builder, arrays, attrs)
        self.op_name = call.op.name
        want = evaluate(IRModule.from_expr(Function(params, call)), values)
        holders = [te.placeholder(p.type_annotation.shape, p.type_annotation.dtype,
                                  name=p.name_hint) for p in params]
        inputs = list(holders)
        self._make = lambda: get_compute(call.op.name)(inputs, call.attrs, call.checked_type)
        self.anchor = self._make()
        self.epilogue = epilogue
        if epilogue:
            axis = 1 if len(self.anchor.shape) >= 2 else 0
            b = normal(self.anchor.shape[axis], seed=9)
            shape = [1] * len(self.anchor.shape)
            shape[axis] = -1
            want = np.maximum(want + b.reshape(shape), 0).astype(want.dtype)
            holders = [*holders, te.placeholder((self.anchor.shape[axis],), "float32",
                                                name="bias")]
            values = [*values, b]
        self.holders, self.values, self.want = holders, values, want

    def schedule(self):
        """A fresh TE graph and schedule: (schedule, anchor, output)."""
        anchor = self._make()
        output, added = anchor, None
        if self.epilogue:
            bias = self.holders[-1]
            axis = 1 if len(anchor.shape) >= 2 else 0
            added = te.compute(anchor.shape, lambda *i: anchor[i] + bias[i[axis]], name="add")
            output = te.compute(anchor.shape, lambda *i: te.max(added[i], 0.0), name="relu")
        s = te.create_schedule(output.op)
        if added is not None:
            s[added].compute_inline()
        return s, anchor, output

    def work(self, s, output):
        """Innermost statement executions of schedule ``s`` lowered."""
        return kernel_work(lower(s, [*self.holders, output], name="work").body)

    def check(self, target, config):
        """Build with ``config`` and compare with the reference; returns the config used.
        The kernel runs at most MAX_WORK times the statements of the unscheduled stages."""
        s, anchor, output = self.schedule()
        used = get_backend(target).schedule(s, anchor, output, self.op_name, config)
        plain, _, plain_output = self.schedule()
        assert self.work(s, output) <= MAX_WORK * self.work(plain, plain_output), used
        kernel = opf.build(s, [*self.holders, output], target=target, name="ruled")
        got = np.empty(self.want.shape, self.want.dtype)
        kernel(*self.values, got)
        assert_close(got, self.want, 1e-4)
        return used


def configs_to_try(space, default):
    """The default, four samples, and the first and last points (smallest, largest tiles)."""
    points = list(space)
    chosen = [default, *space.sample(4, seed=0), points[0], points[-1]]
    return list(dict.fromkeys(chosen))


CASES = {
    "conv2d+bias+relu": (nn.conv2d, (normal(1, 8, 10, 12), normal(8, 8, 3, 3, seed=1) * .2),
                         True, {"padding": 1}),
    "conv2d_strided_grouped": (nn.conv2d, (normal(1, 4, 11, 9), normal(6, 2, 3, 3, seed=1)),
                               False, {"padding": (1, 0, 2, 1), "strides": 2, "groups": 2}),
    "conv2d_depthwise": (nn.conv2d, (normal(1, 4, 8, 16), normal(4, 1, 3, 3, seed=1)), True,
                         {"padding": 1, "groups": 4}),
    "conv2d_nchwc+bias+relu": (nn.conv2d_nchwc, (normal(1, 2, 10, 12, 4),
                                                 normal(3, 2, 3, 3, 4, 8, seed=1) * .2), True,
                               {"padding": 1, "data_layout": "NCHW4c",
                                "kernel_layout": "OIHW4i8o", "out_layout": "NCHW8c"}),
    "conv2d_nchwc_strided_rgb": (nn.conv2d_nchwc, (normal(1, 1, 13, 19, 3),
                                                   normal(2, 1, 5, 5, 3, 8, seed=1)), False,
                                 {"padding": 2, "strides": 2, "data_layout": "NCHW3c",
                                  "kernel_layout": "OIHW3i8o", "out_layout": "NCHW8c"}),
    "conv2d_nchwc_grouped": (nn.conv2d_nchwc, (normal(1, 4, 7, 9, 4),
                                               normal(4, 2, 3, 3, 4, 4, seed=1)), True,
                             {"padding": 1, "groups": 2, "data_layout": "NCHW4c",
                              "kernel_layout": "OIHW4i4o", "out_layout": "NCHW4c"}),
    "conv2d_nchwc_depthwise": (nn.conv2d_nchwc, (normal(1, 2, 9, 13, 8),
                                                 normal(2, 1, 3, 3, 1, 8, seed=1)), True,
                               {"padding": 1, "strides": 2, "groups": 16,
                                "data_layout": "NCHW8c", "kernel_layout": "OIHW1i8o",
                                "out_layout": "NCHW8c"}),
    # its padded rows built at each task: uneven padding, wider than the window on one side
    "conv2d_nchwc_depthwise_padded": (nn.conv2d_nchwc, (normal(1, 3, 7, 10, 8),
                                                        normal(3, 1, 3, 3, 1, 8, seed=1)), True,
                                      {"padding": (2, 0, 4, 3), "groups": 24,
                                       "data_layout": "NCHW8c", "kernel_layout": "OIHW1i8o",
                                       "out_layout": "NCHW8c"}),
    # 37 output blocks computed as 40 (whole tiles of 4) and cropped; K-blocked by default
    "conv2d_nchwc_padded_blocks": (nn.conv2d_nchwc, (normal(1, 4, 5, 6, 8),
                                                     normal(37, 4, 3, 3, 8, 8, seed=1) * .1),
                                   True, {"padding": 1, "data_layout": "NCHW8c",
                                          "kernel_layout": "OIHW8i8o", "out_layout": "NCHW8c"}),
    # 1x1 over 7 x 7 pixels: with AVX2 one line of 17 units of 3 (the last cropped)
    "conv2d_nchwc_pixels": (nn.conv2d_nchwc, (normal(1, 4, 7, 7, 8),
                                              normal(8, 4, 1, 1, 8, 8, seed=1) * .2), True,
                            {"data_layout": "NCHW8c", "kernel_layout": "OIHW8i8o",
                             "out_layout": "NCHW8c"}),
    "conv2d_nchwc_pixels_strided": (nn.conv2d_nchwc, (normal(1, 2, 13, 14, 8),
                                                      normal(4, 2, 1, 1, 8, 8, seed=1)), False,
                                    {"strides": 2, "padding": (0, 1, 0, 0),
                                     "data_layout": "NCHW8c", "kernel_layout": "OIHW8i8o",
                                     "out_layout": "NCHW8c"}),
    "conv2d_nchwc_group_window": (nn.conv2d_nchwc, (
        normal(1, 17, 4, 6, 8), group_window_weight(normal(136, 34, 1, 1, seed=1), 4, 8)), True,
        {"groups": 4, "group_window": True, "channels": 136, "data_layout": "NCHW8c",
         "kernel_layout": "OIHW34i8o", "out_layout": "NCHW8c"}),
    # AVX2: 5 of a group's blocks x 2 columns
    "conv2d_nchwc_group_window_wide": (nn.conv2d_nchwc, (
        normal(1, 17, 3, 28, 8), group_window_weight(normal(136, 34, 1, 1, seed=1), 4, 8)),
        True, {"groups": 4, "group_window": True, "channels": 136, "data_layout": "NCHW8c",
               "kernel_layout": "OIHW34i8o", "out_layout": "NCHW8c"}),
    # AVX2: 1x1 rows of 8 units of 3 columns, tiles of 4 blocks x 3 columns
    "conv2d_nchwc_pointwise_rows": (nn.conv2d_nchwc, (normal(1, 3, 2, 24, 8),
                                                      normal(8, 3, 1, 1, 8, 8, seed=1) * .2),
                                    True, {"data_layout": "NCHW8c", "kernel_layout": "OIHW8i8o",
                                           "out_layout": "NCHW8c"}),
    "conv2d_winograd_f2": (nn.conv2d_winograd_nchwc, (
        normal(1, 2, 9, 11, 4), winograd.transform_weight(normal(2, 2, 3, 3, 4, 4, seed=1),
                                                          2).astype("float32")), True,
        {"padding": 1, "tile_size": 2, "data_layout": "NCHW4c", "out_layout": "NCHW4c"}),
    "conv2d_winograd_f4": (nn.conv2d_winograd_nchwc, (
        normal(1, 1, 10, 9, 8), winograd.transform_weight(normal(2, 1, 3, 3, 8, 8, seed=1),
                                                          4).astype("float32")), False,
        {"padding": (1, 0, 1, 2), "tile_size": 4, "data_layout": "NCHW8c",
         "out_layout": "NCHW8c"}),
    "conv2d_transpose": (nn.conv2d_transpose, (normal(1, 4, 5, 5),
                                               normal(4, 2, 3, 3, seed=1)), False,
                         {"strides": 2, "padding": 1, "output_padding": 1}),
    "dense_dot+bias+relu": (nn.dense, (normal(4, 128), normal(24, 128, seed=1)), True, {}),
    "dense_plain_packed": (nn.dense, (normal(16, 32), normal(32, 32, seed=1)), True, {}),
    "matmul_plain": (nn.matmul, (normal(6, 20), normal(20, 12, seed=1)), False, {}),
    "matmul_dot_transposed": (nn.matmul, (normal(4, 160), normal(12, 160, seed=1)), False,
                              {"transpose_b": True}),
    "batch_matmul_dot": (nn.batch_matmul, (normal(2, 4, 128), normal(2, 8, 128, seed=1)),
                         False, {}),
    "batch_matmul_plain": (nn.batch_matmul, (normal(2, 8, 16), normal(2, 16, 32, seed=1)),
                           True, {"transpose_b": False}),
    "max_pool": (nn.max_pool2d, (normal(1, 4, 17, 17),), True,
                 {"pool_size": 3, "strides": 2, "padding": 1}),
    "avg_pool": (nn.avg_pool2d, (normal(1, 4, 16, 16),), False,
                 {"pool_size": 3, "padding": 1, "count_include_pad": True}),
    "global_avg_pool": (nn.global_avg_pool2d, (normal(2, 4, 9, 9),), True, {}),
    "global_avg_pool_blocked": (nn.global_avg_pool2d, (normal(1, 3, 9, 11, 8),), False,
                                {"layout": "NCHW8c"}),
    # 15 rows: summed row by row first, rows in parallel, tiles of 3 or 5 rows
    "global_avg_pool_blocked_rows": (nn.global_avg_pool2d, (normal(2, 3, 15, 11, 8) + 3,),
                                     True, {"layout": "NCHW8c"}),
    "max_pool_blocked": (nn.max_pool2d, (normal(1, 2, 15, 15, 8),), True,
                         {"pool_size": 3, "strides": 2, "padding": 1, "layout": "NCHW8c"}),
    "avg_pool_blocked": (nn.avg_pool2d, (normal(1, 2, 12, 12, 16),), False,
                         {"pool_size": 3, "padding": 1, "layout": "NCHW16c"}),
    "layout_to_blocked": (opf.op.layout_transform, (normal(1, 16, 5, 7),), False,
                          {"src_layout": "NCHW", "dst_layout": "NCHW8c"}),
    "layout_to_rgb_block": (opf.op.layout_transform, (normal(1, 3, 5, 7),), False,
                            {"src_layout": "NCHW", "dst_layout": "NCHW3c"}),
    "layout_to_nchw": (opf.op.layout_transform, (normal(1, 2, 5, 7, 8),), False,
                       {"src_layout": "NCHW8c", "dst_layout": "NCHW"}),
    "channel_shuffle_blocked": (opf.op.channel_shuffle, (normal(1, 3, 4, 5, 8),), False,
                                {"groups": 3, "layout": "NCHW8c"}),
    "softmax": (nn.softmax, (normal(4, 48) * 3,), False, {}),
    "lrn": (nn.lrn, (normal(1, 7, 3, 21) * 4,), False,
            {"size": 5, "alpha": 1e-2, "beta": 0.75, "bias": 2.0}),
    "lrn_pow": (nn.lrn, (normal(1, 5, 2, 9),), False,
                {"size": 3, "alpha": 1e-1, "beta": 0.6, "bias": 1.0}),
    "attention_padded+bias+relu": (nn.attention, (normal(2, 7, 5), normal(2, 5, 11, seed=1),
                                                  normal(2, 11, 12, seed=2),
                                                  normal(7, 11, seed=3)), True, {"scale": 0.5}),
    "attention_whole": (nn.attention, (normal(1, 2, 8, 8), normal(1, 2, 8, 32, seed=1),
                                       normal(1, 2, 32, 32, seed=2), np.float32(0)), False,
                        {"scale": 0.35}),
    "layer_norm": (nn.layer_norm, (normal(6, 64) + 1.0, normal(64, seed=1),
                                   normal(64, seed=2)), False, {"axis": -1}),
}


@pytest.mark.parametrize("target_spec", TARGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_every_config_computes_the_reference(case, target_spec):
    builder, arrays, epilogue, attrs = CASES[case]
    target = Target(target_spec)
    with target:
        group = Group(builder, arrays, epilogue, **attrs)
        _, anchor, output = group.schedule()
        found = RULES.find(group.op_name, anchor, output, target)
        assert found is not None, f"no rule takes {case}"
        rule, space = found
        default = rule.default_config(anchor, output, target)
        assert default in space
        for config in configs_to_try(space, default):
            assert group.check(target, config) == config


@pytest.mark.parametrize("target_spec", TARGETS)
@pytest.mark.parametrize("case", ["sum_rows", "sum_axis0", "add_relu"])
def test_default_rule_configs_compute_the_reference(case, target_spec):
    target = Target(target_spec)
    x = normal(6, 40)
    with target:
        if case == "add_relu":
            group = Group(nn.relu, (x,))
        else:
            group = Group(opf.op.sum, (x,), axis=1 if case == "sum_rows" else 0)
        rule = RULES.fallback
        space = rule.space(None, None, target)
        assert len(space) == 8
        assert group.check(target, None) is None  # the default config, reported as None
        for config in space:
            assert group.check(target, config) == config


def test_rules_decline_groups_they_do_not_schedule():
    target = Target(AVX2)
    with target:
        dot = Group(nn.dense, (normal(4, 128), normal(24, 128, seed=1)), False)
        plain = Group(nn.dense, (normal(16, 32), normal(32, 32, seed=1)), False)
    dot_rule, plain_rule = RULES.get("matmul_dot"), RULES.get("matmul_plain")
    assert dot_rule.space(dot.anchor, dot.anchor, target) is not None
    assert plain_rule.space(dot.anchor, dot.anchor, target) is None
    assert dot_rule.space(plain.anchor, plain.anchor, target) is None
    assert RULES.get("conv2d").space(dot.anchor, dot.anchor, target) is None


# ---------------------------------------------------------------------------------------------
# configs


def _conv_rule_and_space(target_spec=AVX2):
    target = Target(target_spec)
    with target:
        group = Group(nn.conv2d, (normal(1, 16, 14, 14), normal(32, 16, 3, 3, seed=1)),
                      padding=1)
    rule = RULES.get("conv2d")
    return rule, rule.space(group.anchor, group.anchor, target), group, target


def test_config_round_trips_through_json():
    rule, space, group, target = _conv_rule_and_space()
    for config in [rule.default_config(group.anchor, group.anchor, target),
                   *space.sample(3, seed=1)]:
        text = config.to_json()
        assert json.loads(text)["rule"] == "conv2d"
        back = Config.from_json(text)
        assert back == config and dict(back) == dict(config)
        assert space.check(back) == config


def test_a_config_with_an_unknown_knob_is_an_error_naming_it():
    rule, space, group, target = _conv_rule_and_space()
    values = {**rule.default_config(group.anchor, group.anchor, target), "unroll": 2}
    with pytest.raises(ScheduleError, match="no knob 'unroll'"):
        space.check(values)
    with pytest.raises(ScheduleError, match="no knob 'unroll'"):
        s, anchor, output = group.schedule()
        get_backend(target).schedule(s, anchor, output, "nn.conv2d", values)


def test_an_out_of_space_value_is_an_error_naming_the_knob():
    rule, space, group, target = _conv_rule_and_space()
    default = dict(rule.default_config(group.anchor, group.anchor, target))
    with pytest.raises(ScheduleError, match="knob 'row_block'.*cannot be 5"):
        space.check({**default, "row_block": 5})  # 5 does not divide 14 rows
    with pytest.raises(ScheduleError, match="lacks knob 'channel_pass'"):
        space.check({k: v for k, v in default.items() if k != "channel_pass"})
    with pytest.raises(ScheduleError, match="outside its space"):
        space.check({**default, "channel_block": 16, "col_blocks": 2})  # 32 accumulators
    with pytest.raises(ScheduleError, match="rule 'pool'"):
        space.check(Config(default, "pool"))


def test_a_config_missing_a_knob_is_refused_by_name():
    """A config (a record written before a knob existed) that lacks one: ``in`` says so,
    and the space's check names the knob (Mapping's ``in`` had raised the lookup's
    ScheduleError instead of answering False)."""
    rule, space, group, target = _conv_rule_and_space()
    default = rule.default_config(group.anchor, group.anchor, target)
    short = Config({k: v for k, v in default.items() if k != "channel_pass"}, "conv2d")
    assert "channel_pass" in default and "channel_pass" not in short
    with pytest.raises(ScheduleError, match="lacks knob 'channel_pass'"):
        space.check(short)
    with pytest.raises(ScheduleError, match="not JSON"):
        Config.from_json("{channel_block: 4")


def test_space_enumeration_and_sampling_are_deterministic():
    space = ConfigSpace("toy", [Knob("a", (1, 2, 3)), Knob("b", (True, False))],
                        lambda c: not (c["a"] == 3 and c["b"]))
    assert len(space) == 5
    assert [dict(c) for c in space][:2] == [{"a": 1, "b": True}, {"a": 1, "b": False}]
    assert space.sample(3, seed=4) == space.sample(3, seed=4)
    assert len(set(space.sample(3, seed=4))) == 3
    assert space.sample(10) == list(space)
    assert Config({"a": 1}, "toy") not in space


def test_a_space_is_empty_when_no_point_is_valid_and_finds_that_lazily():
    seen = []

    def valid(c):
        seen.append(dict(c))
        return c["a"] == 2

    space = ConfigSpace("toy", [Knob("a", (1, 2, 3)), Knob("b", (True, False))], valid)
    assert not space.is_empty() and len(seen) == 3  # stopped at the first valid point
    assert ConfigSpace("toy", [Knob("a", (1, 2))], lambda c: False).is_empty()
    assert not ConfigSpace("toy", [Knob("a", (1,))]).is_empty()


def test_lowering_records_and_uses_the_config():
    call, params, _ = call_over_arrays(lambda x, w: nn.relu(nn.conv2d(x, w, padding=1)),
                                       (normal(1, 8, 10, 12), normal(8, 8, 3, 3)), {})
    func = Function(params, call)
    backend = get_backend(AVX2)
    default = lower_primitive_function(func, "k", backend)
    assert default.schedule_config["rule"] == "conv2d"
    json.dumps(default.schedule_config)  # plain JSON
    config = {**default.schedule_config["knobs"], "channel_block": 1, "row_block": 2}
    chosen = lower_primitive_function(func, "k", backend, config=config)
    assert chosen.schedule_config == {"rule": "conv2d", "knobs": config}
    call, params, _ = call_over_arrays(nn.relu, (normal(4, 40),), {})
    elementwise = Function(params, call)
    assert lower_primitive_function(elementwise, "e", backend).schedule_config is None
    with pytest.raises(ScheduleError, match="knob 'row_block'"):
        lower_primitive_function(func, "k", backend, config={**config, "row_block": 3})


# ---------------------------------------------------------------------------------------------
# the default heuristic: the measured choices on AVX2, scaled on AVX-512


def _default(builder, shapes, target_spec, **attrs):
    target = Target(target_spec)
    with target:
        group = Group(builder, tuple(np.zeros(s, "float32") for s in shapes), **attrs)
    rule, _ = RULES.find(group.op_name, group.anchor, group.anchor, target)
    return rule.name, dict(rule.default_config(group.anchor, group.anchor, target))


def conv(channel_block, row_block, col_blocks, channel_pass, task_channels):
    """Knob values in the order of ``conv2d_tiles``' parameters."""
    return {"channel_block": channel_block, "col_blocks": col_blocks,
            "task_channels": task_channels, "row_block": row_block,
            "channel_pass": channel_pass}


@pytest.mark.parametrize("builder, shapes, attrs, want", [
    # (the arguments today's schedules passed to conv2d_tiles / dot_tiles / plain_tiles)
    (nn.conv2d, [(1, 16, 14, 14), (32, 16, 3, 3)], {"padding": 1},
     ("conv2d", conv(4, 1, 2, 16, 32))),
    (nn.conv2d, [(1, 64, 56, 56), (64, 64, 3, 3)], {"padding": 1},
     ("conv2d", conv(8, 7, 1, 32, 32))),
    (nn.conv2d, [(2, 8, 15, 13), (12, 4, 3, 3)],
     {"padding": (1, 0, 2, 1), "strides": 2, "groups": 2}, ("conv2d", conv(6, 1, 1, 4, 12))),
    (nn.conv2d, [(1, 3, 224, 224), (64, 3, 7, 7)], {"padding": 3, "strides": 2},
     ("conv2d", conv(4, 4, 2, 3, 32))),
    (nn.conv2d, [(1, 256, 14, 14), (256, 256, 3, 3)], {"padding": 1},
     ("conv2d", conv(4, 7, 2, 64, 32))),
    # Blocks of column tiles: what L2 holds (48, 96, 204, 48 tiles), cut to a divisor of the
    # tiles a row has, so that no block is partial.
    (nn.dense, [(8, 512), (1000, 512)], {}, ("matmul_dot", {"rows": 4, "cols": 2, "block": 25})),
    (nn.dense, [(16, 32), (64, 32)], {},
     ("matmul_plain", {"rows": 4, "cols": 16, "k_unroll": 4, "block": 4, "prefetch": 0})),
    (nn.matmul, [(37, 24), (24, 50)], {},
     ("matmul_plain", {"rows": 1, "cols": 10, "k_unroll": 4, "block": 5, "prefetch": 0})),
    (nn.matmul, [(128, 64), (64, 96)], {},  # panels of 3 vectors: 4 x 3 tiles, 12 sums
     ("matmul_plain", {"rows": 4, "cols": 24, "k_unroll": 4, "block": 4, "prefetch": 0})),
    (nn.matmul, [(1, 768), (768, 3072)], {},  # one row: 8 vectors of columns
     ("matmul_plain", {"rows": 1, "cols": 64, "k_unroll": 4, "block": 1, "prefetch": 0})),
    (nn.max_pool2d, [(1, 8, 32, 32)], {"pool_size": 2, "strides": 2},
     ("pool", {"vector_width": 8})),
    # blocked: 8 accumulators; 55 columns in tiles of 5, 13 computed as 16 in tiles of 8
    (nn.max_pool2d, [(1, 12, 111, 111, 8)],
     {"pool_size": 3, "strides": 2, "ceil_mode": True, "layout": "NCHW8c"},
     ("pool", {"col_tile": 5})),
    (nn.max_pool2d, [(1, 4, 13, 13, 8)], {"pool_size": 3, "padding": 1, "layout": "NCHW8c"},
     ("pool", {"col_tile": 8})),
    (nn.avg_pool2d, [(1, 4, 13, 13, 16)], {"pool_size": 3, "padding": 1, "layout": "NCHW16c"},
     ("pool", {"col_tile": 4})),  # 16 channels: two vectors per column
    (nn.softmax, [(4, 1000)], {}, ("rows", {"vector_width": 8})),
])
def test_avx2_defaults_are_the_measured_choices(builder, shapes, attrs, want):
    assert _default(builder, shapes, AVX2_MEASURED, **attrs) == want


def _nchwc(data, weight, **attrs):
    return {"data_layout": f"NCHW{data[4]}c", "kernel_layout": f"OIHW{weight[4]}i{weight[5]}o",
            "out_layout": f"NCHW{weight[5]}c", **attrs}


@pytest.mark.parametrize("shapes, attrs, want", [
    # SqueezeNet's last: 125 blocks computed as 128 in tiles of 4 x 2 columns; 13 rows (a
    # prime) in one task rather than 13; the 64 input blocks in reduction blocks of 16 (a
    # tile's weights for them are 16 KiB, half the L1)
    ([(1, 64, 13, 13, 8), (125, 64, 1, 1, 8, 8)], {},
     {"channel_tile": 4, "col_units": 1, "task_blocks": 4, "row_block": 13, "k_blocks": 16,
      "line_chunks": 1, "rows_first": False, "prefetch": 1}),
    # ResNet-50's 2048 -> 512 at 7 x 7: the 49 pixels one line, every row in each task
    ([(1, 256, 7, 7, 8), (64, 256, 1, 1, 8, 8)], {},
     {"channel_tile": 4, "col_units": 1, "task_blocks": 4, "row_block": 7, "k_blocks": 16,
      "line_chunks": 1, "rows_first": False, "prefetch": 1}),
    # a 3x3 stride-2 one: 9 taps, one input block per reduction block
    ([(1, 16, 56, 56, 8), (16, 16, 3, 3, 8, 8)], {"strides": 2, "padding": 1},
     {"channel_tile": 4, "col_units": 1, "task_blocks": 4, "row_block": 1, "k_blocks": 1,
      "line_chunks": 1, "rows_first": False, "prefetch": 1}),
    # SqueezeNet's squeeze (96 -> 16 at 55 x 55): one channel tile, so the line's sums run in
    # 16 parallel chunks of its units and the epilogue over rows (it ran on one thread)
    ([(1, 12, 55, 55, 8), (2, 12, 1, 1, 8, 8)], {},
     {"channel_tile": 2, "col_units": 1, "task_blocks": 2, "row_block": 1, "k_blocks": 12,
      "line_chunks": 16, "rows_first": True, "prefetch": 1}),
])
def test_avx2_blocked_convolution_defaults(shapes, attrs, want):
    got = _default(nn.conv2d_nchwc, shapes, AVX2_MEASURED, **_nchwc(*shapes, **attrs))
    assert got == ("conv2d_nchwc", want)


@pytest.mark.parametrize("kernel, stride", [(7, 2), (3, 2)], ids=["resnet", "squeezenet"])
def test_an_rgb_stem_takes_wide_column_tiles_where_registers_allow(kernel, stride):
    # 1 channel block x 4 units of 7 columns (28 sums of AVX-512's 32 registers), a task
    # every block of one row; AVX2's 16 registers keep the general tiles
    size = 112 * stride + kernel - stride
    shapes = [(1, 1, size, size, 3), (4, 1, kernel, kernel, 3, 16)]
    avx512 = "c -mattr=+avx512f -l2-cache=1M -num-cores=2"
    got = _default(nn.conv2d_nchwc, shapes, avx512, **_nchwc(*shapes, strides=stride))
    assert got == ("conv2d_nchwc", {"channel_tile": 1, "col_units": 4, "task_blocks": 4,
                                    "row_block": 1, "k_blocks": 1, "line_chunks": 1,
                                    "rows_first": False, "prefetch": 0})
    avx2 = [(1, 1, size, size, 3), (8, 1, kernel, kernel, 3, 8)]
    _, knobs = _default(nn.conv2d_nchwc, avx2, AVX2_MEASURED, **_nchwc(*avx2, strides=stride))
    assert knobs["channel_tile"] > 1


@pytest.mark.parametrize("channels, want", [(512, 7), (32, 1)])
def test_a_small_output_takes_every_row_in_a_task_when_its_channel_tiles_are_enough(
        channels, want):
    # ResNet-50's 512-channel 3x3 layer at 7 x 7: 16 channel tiles, 8 a core, each task all 7
    # rows (one-row tasks re-read 0.6 MB of weights for 7 columns); 32 channels are 2 tiles,
    # so the rows are still split
    shapes = [(1, channels // 16, 9, 9, 16), (channels // 16, channels // 16, 3, 3, 16, 16)]
    avx512 = "c -mattr=+avx512f -l2-cache=1M -num-cores=2"
    _, knobs = _default(nn.conv2d_nchwc, shapes, avx512, **_nchwc(*shapes))
    assert knobs["row_block"] == want


@pytest.mark.parametrize("l2, want", [("2M", 4), ("4M", 8), ("512K", 4)])
def test_a_winograd_task_takes_the_output_blocks_whose_weights_fit_half_the_l2(l2, want):
    # ResNet-50's 256-channel 3x3 layers at 14 x 14 by F(2x2): 256 KiB of transformed weights
    # per output block of 16, so 4 blocks a task with a 2 MiB L2 (each core reads its weights
    # once for every row of tiles; 8 blocks re-read them from memory), never fewer than the
    # register tile's 4 (x 7 tiles: 28 sums)
    shapes = [(1, 16, 14, 14, 16),
              winograd.transform_weight(np.zeros((16, 16, 3, 3, 16, 16), "float32"), 2).shape]
    target = f"c -mattr=+avx512f -l2-cache={l2} -num-cores=2"
    _, knobs = _default(nn.conv2d_winograd_nchwc, shapes, target, padding=1, tile_size=2,
                        data_layout="NCHW16c", out_layout="NCHW16c")
    assert (knobs["channel_tile"], knobs["task_blocks"]) == (4, want)


def _avx512_conv_knobs(channels_in: int, channels_out: int, size: int, kernel: int = 1):
    """The default knobs of a stride-1 blocked convolution in blocks of 16 of a square input
    on a 2-core AVX-512 target with a 48 KiB L1 and a 2 MiB L2 (the Xeon of the benchmarks)."""
    shapes = [(1, channels_in // 16, size, size, 16),
              (channels_out // 16, channels_in // 16, kernel, kernel, 16, 16)]
    avx512 = "c -mattr=+avx512f -l1-cache=48K -l2-cache=2M -num-cores=2"
    return _default(nn.conv2d_nchwc, shapes, avx512, **_nchwc(*shapes))[1]


@pytest.mark.parametrize("channels_in, channels_out, size, want", [
    (256, 64, 56, True),     # 64 KiB of weights, 3.2 MB of input: each core its own rows
    (64, 256, 56, True),
    (1024, 256, 14, False),  # 1 MiB of weights against 0.8 MB of input: half the weights each
    (2048, 512, 7, False),
])
def test_tasks_go_rows_first_where_the_weights_are_the_smaller_read(
        channels_in, channels_out, size, want):
    assert _avx512_conv_knobs(channels_in, channels_out, size)["rows_first"] is want


@pytest.mark.parametrize("channels_in, channels_out, size, want", [
    # 1 MiB of weights, K-blocked: tasks of 4 channel blocks x all 14 rows (50 KiB of sums)
    (1024, 256, 14, 14),
    (1024, 512, 14, 14),
    (256, 1024, 14, 14),
    # 256 -> 64 at 56 x 56 goes rows first; 2048 -> 512 at 7 x 7 is one line, all its rows
    (256, 64, 56, None),
    (2048, 512, 7, 7),
    # 512 -> 32 at 14 x 14: 1 channel tile, too few for two cores without splitting rows
    (512, 32, 14, None),
])
def test_a_k_blocked_pointwise_task_takes_every_row_when_its_tiles_make_enough_tasks(
        channels_in, channels_out, size, want):
    knobs = _avx512_conv_knobs(channels_in, channels_out, size)
    if want is None:
        assert knobs["row_block"] < size or knobs["rows_first"]
    else:
        assert knobs["row_block"] == want and knobs["k_blocks"] < channels_in // 16


@pytest.mark.parametrize("kernel", [1, 3])
def test_an_avx512_convolution_tile_is_4_blocks_by_7_columns(kernel):
    # 28 sums, 4 weight vectors and one broadcast at a time of the 32 registers (the tile's
    # updates column by column)
    knobs = _avx512_conv_knobs(256, 512, 28 + kernel - 1, kernel)
    assert (knobs["channel_tile"], knobs["col_units"]) == (4, 1)


def test_a_k_blocked_task_of_every_row_computes_the_reference():
    # the whole-height default of a 1x1 layer whose weights need K-blocking, with a residual
    # epilogue: the sums of every row stay in the task's accumulator across reduction blocks
    target = Target(f"{AVX2} -l1-cache=32K -num-cores=2")
    with target:
        group = Group(nn.conv2d_nchwc, (normal(1, 32, 10, 10, 8),
                                        normal(32, 32, 1, 1, 8, 8, seed=1) * .05), True,
                      data_layout="NCHW8c", kernel_layout="OIHW8i8o", out_layout="NCHW8c")
        _, anchor, output = group.schedule()
        rule, space = RULES.find(group.op_name, anchor, output, target)
        default = dict(rule.default_config(anchor, output, target))
        assert default["row_block"] == 10 and 1 < default["k_blocks"] < 32
        config = space.config(**default)
        assert group.check(target, config) == config


@pytest.mark.parametrize("rows_first", [False, True])
def test_both_task_orders_compute_the_reference(rows_first):
    # several channel tiles and row tasks, padding and a residual epilogue; compiled for
    # AVX2, as the file's other kernels are, so that it runs on any host they run on
    target = Target(f"{AVX2} -num-cores=2")
    with target:
        group = Group(nn.conv2d_nchwc, (normal(1, 2, 9, 14, 16),
                                        normal(4, 2, 3, 3, 16, 16, seed=1) * .1), True,
                      padding=1, data_layout="NCHW16c", kernel_layout="OIHW16i16o",
                      out_layout="NCHW16c")
        _, anchor, output = group.schedule()
        rule, space = RULES.find(group.op_name, anchor, output, target)
        default = dict(rule.default_config(anchor, output, target))
        config = space.config(**{**default, "channel_tile": 2, "task_blocks": 2,
                                 "row_block": 3, "rows_first": rows_first})
        assert group.check(target, config) == config


def test_products_take_tiles_of_3_vectors():
    # AVX-512: 24 sums of 32 registers, the contraction unrolled by 8 (BERT's products
    # 0.88-0.91x the time of 4 x 2; ViT's 0.91-0.96x the time of 8 x 2); AVX2: 4 x 3, 12 sums
    # of 16 registers, unrolled by 4 (BERT 0.875x the time of 4 x 2); panels of 2 vectors
    # where 3 do not divide the columns
    avx512 = "c -mattr=+avx512f -l2-cache=2M -num-cores=2"
    _, knobs = _default(nn.matmul, [(128, 768), (768, 768)], avx512)
    assert (knobs["rows"], knobs["cols"], knobs["k_unroll"]) == (8, 48, 8)
    _, knobs = _default(nn.matmul, [(128, 768), (768, 1024)], avx512)
    assert (knobs["rows"], knobs["cols"], knobs["k_unroll"]) == (8, 32, 8)
    _, knobs = _default(nn.matmul, [(128, 768), (768, 768)], AVX2_MEASURED)
    assert (knobs["rows"], knobs["cols"], knobs["k_unroll"]) == (4, 24, 4)
    _, knobs = _default(nn.matmul, [(128, 768), (768, 1024)], AVX2_MEASURED)
    assert (knobs["rows"], knobs["cols"], knobs["k_unroll"]) == (4, 16, 4)


def test_panels_of_three_vectors_compute_the_reference():
    # packed in the compute: 21 rows (a partial row tile), an epilogue, 24-column panels
    target = Target(f"{AVX2} -num-cores=2")
    with target:
        group = Group(nn.matmul, (normal(21, 40), normal(40, 72, seed=1)), True)
        _, anchor, output = group.schedule()
        rule, space = RULES.find(group.op_name, anchor, output, target)
        default = dict(rule.default_config(anchor, output, target))
        assert default["cols"] == 24
        config = space.config(**default)
        assert group.check(target, config) == config


def test_constant_weights_in_panels_of_three_vectors_compute_the_reference():
    # packed at compile time and prefetched a block ahead, 197 rows as ViT's
    x = opf.var("x", shape=(197, 64))
    weight, bias = normal(64, 96, seed=1), normal(96, seed=2)
    body = opf.op.add(opf.op.nn.matmul(x, opf.const(weight)), opf.const(bias))
    mod = IRModule.from_expr(Function([x], body))
    exe = opf.compile(mod, target=f"{AVX2} -num-cores=2")
    (config,) = [s.group.schedule_config for s in exe.steps if s.group.schedule_config]
    assert config["knobs"]["cols"] == 24 and config["knobs"]["prefetch"] == 1
    data = normal(197, 64, seed=3)
    assert_close(exe(data), data @ weight + bias, 1e-4)


def test_an_image_is_laid_out_in_its_rgb_block_lanes_inside():
    # each pixel's 3 channels written together (lanes outside wrote every third float)
    shapes = [(1, 3, 32, 32)]
    got = _default(opf.op.layout_transform, shapes, "c -mattr=+avx512f",
                   src_layout="NCHW", dst_layout="NCHW3c")
    assert got == ("layout", {"lanes_outside": False})


def test_avx512_defaults_use_its_wider_vectors():
    avx512 = "c -mattr=+avx512f -l2-cache=1M -num-cores=2"
    # 8 accumulators, as on AVX2 (measured best on Zen 4 too), of 16 columns each: 4 channels
    # x 2 vectors.
    assert _default(nn.conv2d, [(1, 64, 56, 56), (64, 64, 3, 3)], avx512, padding=1) == (
        "conv2d", conv(4, 7, 2, 32, 32))
    # A 7-wide row is one vector of 8 lanes, not of 16: 8 channels x 1 vector.
    assert _default(nn.conv2d, [(1, 512, 7, 7), (512, 512, 3, 3)], avx512, padding=1) == (
        "conv2d", conv(8, 7, 1, 64, 32))
    assert _default(nn.dense, [(8, 512), (1000, 512)], avx512) == (
        "matmul_dot", {"rows": 4, "cols": 2, "block": 25})
    assert _default(nn.softmax, [(4, 1024)], avx512) == ("rows", {"vector_width": 16})
    assert dict(RULES.fallback.default_config(None, None, Target(AVX2_MEASURED))) == {
        "vector_width": 16, "parallel": True}
    assert dict(RULES.fallback.default_config(None, None, Target(avx512))) == {
        "vector_width": 32, "parallel": True}


# ---------------------------------------------------------------------------------------------
# the loops of copies and global pools


def _default_source(builder, arrays, target_spec, **attrs):
    """The C source of one group under its rule's default config."""
    target = Target(target_spec)
    with target:
        group = Group(builder, arrays, **attrs)
        s, anchor, output = group.schedule()
        get_backend(target).schedule(s, anchor, output, group.op_name, None)
        return opf.build(s, [*group.holders, output], target=target, name="ruled").get_source()


@pytest.mark.parametrize("target_spec", TARGETS)
def test_a_blocked_padded_copy_moves_whole_channel_blocks(target_spec):
    # one vector load (or zeros) per pixel under the padding test, not one element at a
    # time: the depthwise task's own padded rows, and a padded copy built first
    depthwise = _default_source(nn.conv2d_nchwc, (normal(1, 3, 12, 12, 8),
                                                  normal(3, 1, 5, 5, 1, 8, seed=1)), target_spec,
                                padding=2, strides=2, groups=24, data_layout="NCHW8c",
                                kernel_layout="OIHW1i8o", out_layout="NCHW8c")
    dense = _default_source(nn.conv2d_nchwc, (normal(1, 2, 9, 9, 8),
                                              normal(2, 2, 3, 3, 8, 8, seed=1)), target_spec,
                            padding=1, strides=2, data_layout="NCHW8c",
                            kernel_layout="OIHW8i8o", out_layout="NCHW8c")
    for source in (depthwise, dense):
        assert "opf_store_float32x8(&conv2d_nchwc_pad[" in source


def test_a_global_pool_of_few_channel_blocks_runs_in_parallel():
    # two blocks of output, but 2 x 112 x 112 x 16 terms: worth the threads
    source = _default_source(nn.global_avg_pool2d, (normal(1, 2, 112, 112, 16),), "c",
                             layout="NCHW16c")
    assert "omp parallel" in source


def test_a_one_pixel_convolution_of_many_weights_runs_in_parallel():
    # a squeeze-excite layer: 240 outputs, but 960 x 240 multiply-adds whose weights (0.9 MB)
    # stream from memory; one thread took twice the time of two (MobileNet v3 on a Xeon)
    args = (normal(1, 60, 1, 1, 16), normal(15, 60, 1, 1, 16, 16, seed=1))
    attrs = dict(data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c")
    source = _default_source(nn.conv2d_nchwc, args, "c", **attrs)
    assert "omp parallel" in source
    # and too little work (72 x 24 of them) still runs on the calling thread
    small = _default_source(nn.conv2d_nchwc, (normal(1, 9, 1, 1, 8),
                                               normal(3, 9, 1, 1, 8, 8, seed=1)), "c",
                            data_layout="NCHW8c", kernel_layout="OIHW8i8o",
                            out_layout="NCHW8c")
    assert "omp parallel" not in small


def test_a_one_pixel_convolution_in_parallel_computes_the_reference():
    x, weight = normal(1, 960, 1, 1), normal(240, 960, 1, 1, seed=1)
    data = opf.var("x", shape=x.shape)
    exe = opf.compile(Function([data], nn.relu(nn.conv2d(data, opf.const(weight)))),
                      target="c -num-cores=2")
    assert "omp parallel" in exe.source()
    assert_close(exe(x), np.maximum(np.einsum("oi,ni->no", weight[:, :, 0, 0],
                                              x[:, :, 0, 0])[:, :, None, None], 0), 1e-5)


def test_an_elementwise_stage_of_four_lane_blocks_runs_in_vectors():
    source = _default_source(nn.relu, (normal(1, 29, 7, 7, 4),), AVX2)
    assert "opf_store_float32x4(&" in source


def test_divisors_of_a_hostile_axis_come_quickly():
    """A padding of 2^31 or 2^63 - 1 rows makes an axis whose divisors the spaces list:
    found in pairs up to the square root (or the limit, if smaller), and past 2^40 only
    those from pairs up to 2^20, so the compile limits refuse the kernel in a second."""
    import time

    from opfusion.backend.cpu.schedules.common import divisors

    start = time.perf_counter()
    assert divisors(2**31 + 14, 4) == (1, 2)
    assert divisors(2**63 - 1)[:4] == (1, 7, 49, 73)
    assert divisors(2**62, 64) == (1, 2, 4, 8, 16, 32, 64)
    assert divisors(3136) == tuple(d for d in range(1, 3137) if 3136 % d == 0)
    assert time.perf_counter() - start < 2.0
