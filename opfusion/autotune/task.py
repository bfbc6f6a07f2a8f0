"""Tuning tasks: the distinct fused groups of a model whose schedule has knobs.

A :class:`Task` is one primitive function (a fused group, as ``opf.compile`` would lower it)
on one target, with the schedule rule that arranges it, that rule's
:class:`~opfusion.backend.schedule_rule.ConfigSpace` for the group and the heuristic's
config. Groups that are structurally the same (ResNet's repeated bottlenecks) are one task,
``weight`` times as important: the model calls its kernel that often.

Task keys are content hashes, the same in every process and on every run: the group's text
(operators, attributes, shapes, dtypes; weights are parameters of the group, so their values
do not enter) and the target's explicit features and core count. They key the tuning records
(:mod:`.records`) that ``opf.compile(..., records=...)`` reads."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import Backend, get_backend
from ..backend.schedule_rule import Config, ConfigSpace
from ..compiler.compile import fused_module, random_array
from ..compiler.lower_group import schedule_space
from ..ir.expr import Call, Function
from ..ir.module import IRModule
from ..ir.op import Op
from ..ir.printer import astext
from ..ir.types import TensorType
from ..ir.visitor import post_order
from ..target import Target, as_target


@dataclass
class Task:
    """One fused group to tune on one target.

    ``key`` identifies it in the records (:func:`task_key`), ``func`` is the primitive
    function, ``weight`` how many times the model calls it, ``rule`` the name of its schedule
    rule, ``space`` the knobs it may choose and ``default`` the heuristic's choice."""

    key: str
    func: Function
    target: Target
    weight: int
    rule: str
    space: ConfigSpace
    default: Config
    op_names: tuple[str, ...]

    @property
    def name(self) -> str:
        """A short readable label: the fused operators and the key's start."""
        return f"{'+'.join(self.op_names[:3])}#{self.key[:8]}"

    def __repr__(self) -> str:
        return (f"Task({self.name}, weight={self.weight}, rule={self.rule}, "
                f"{len(self.space)} configs)")


def target_key(target: Target) -> str:
    """The records' name for ``target``: its explicit features (``c -mcpu=... -mattr=...``,
    the same text on any machine) and, for a CPU, its core count, which the schedules' task
    counts depend on. A GPU target's schedules do not depend on the host's cores, so records
    tuned on one machine apply on any other with the same GPU target (``cuda -arch=sm_90``)."""
    if target.device != "cpu":
        return str(target.explicit())
    return f"{target.explicit()} cores={target.num_cores}"


def task_key(func: Function, target: Target) -> str:
    """The content hash of primitive function ``func`` on ``target`` (see the module
    docstring): 32 hex digits, stable across processes and runs."""
    text = astext(func, show_meta_data=False)
    digest = hashlib.sha256()
    digest.update(text.encode())
    digest.update(b"\0")
    digest.update(target_key(target).encode())
    return digest.hexdigest()[:32]


def group_functions(mod: IRModule) -> list[tuple[Function, int]]:
    """The distinct primitive functions ``@main`` of a fused module calls, each with how
    many times it calls one structurally like it, in first-call order."""
    found: dict[str, list[Any]] = {}
    for node in post_order(mod["main"].body, into_functions=False):
        if isinstance(node, Call) and isinstance(node.op, Function) and node.op.is_primitive:
            text = astext(node.op, show_meta_data=False)
            found.setdefault(text, [node.op, 0])[1] += 1
    return [(func, count) for func, count in found.values()]


def extract_tasks(mod: IRModule | Function, params: Mapping[str, Any] | None = None,
                  target: str | Target | None = None, opt_level: int | None = None,
                  fusion: str | None = None) -> list[Task]:
    """The tuning tasks of ``mod`` as ``opf.compile`` with the same arguments would build it:
    every distinct fused group whose schedule rule has more than one config, heaviest
    first (by weight, then first call)."""
    resolved = as_target(target)
    backend = get_backend(resolved)
    if isinstance(mod, Function):
        mod = IRModule.from_expr(mod)
    fused = fused_module(mod, params, resolved, opt_level, fusion)
    tasks = []
    for func, count in group_functions(fused):
        task = make_task(func, resolved, count, backend)
        if task is not None:
            tasks.append(task)
    order = sorted(range(len(tasks)), key=lambda i: (-tasks[i].weight, i))
    return [tasks[i] for i in order]


def make_task(func: Function, target: Target, weight: int = 1,
              backend: Backend | None = None) -> Task | None:
    """The task of one primitive function, or None when its schedule has nothing to choose
    (no rule with knobs takes it, or its space has a single point)."""
    if any(not isinstance(p.type_annotation, TensorType) for p in func.params):
        return None  # a tuple parameter (an unfused concatenation's): no rule takes it
    found = schedule_space(func, backend or get_backend(target))
    if found is None:
        return None
    rule, space, default = found
    if len(space) < 2:
        return None
    ops = tuple(n.op.name for n in post_order(func.body, into_functions=False)
                if isinstance(n, Call) and isinstance(n.op, Op))
    return Task(task_key(func, target), func, target, weight, rule.name, space, default, ops)


def task_inputs(task: Task, seed: int = 0) -> list[np.ndarray]:
    """Standard-normal arrays for the task's parameters (small non-negative integers for
    integer ones), the same for the same seed."""
    rng = np.random.default_rng(seed)
    types = [p.type_annotation for p in task.func.params]  # tensors: make_task checks
    return [random_array(rng, ty.shape, ty.dtype) for ty in types]
