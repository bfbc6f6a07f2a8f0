"""Measuring on a Ray cluster: ``opf.tune(..., runner="ray")`` or ``RayRunner(address=...)``.

Ray (``pip install opfusion[tune]``) is optional and imported only here. The runner

- builds each candidate's library as a Ray task (``num_cpus=1``, anywhere in the cluster),
  which leaves it in that node's kernel cache;
- measures on **one actor per node**: each measurement actor holds the exclusive custom
  resource ``opfusion_measure`` (one unit per node), so two measurements never share a
  machine; the actor measures as :class:`~opfusion.autotune.runner.LocalRunner` does, in a
  worker process of its own, so a candidate that crashes or hangs costs one trial, never the
  actor; a node whose cache lacks the library (it was built elsewhere) compiles it before
  timing; the candidates of a round are dealt out to the actors, each share timed
  interleaved with the round's reference on its node;
- streams results back as they finish (``ray.wait``) and returns them in candidate order,
  the same :class:`MeasureResult`\\ s as :class:`~opfusion.autotune.runner.LocalRunner`'s, so the
  records are the same whichever runner wrote them.

``RayRunner()`` with Ray not yet initialised calls ``ray.init()`` on this machine, giving it
one ``opfusion_measure`` unit; ``address="auto"`` joins the cluster this machine belongs to
and ``"ray://host:10001"`` a remote one. On a cluster, start each node with
``ray start ... --resources='{"opfusion_measure": 1}'``."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from ..errors import OpfusionError
from .measure import Candidate, MeasureOptions, MeasureResult, TaskData
from .runner import LocalRunner, Runner

logger = logging.getLogger("opfusion.autotune")

#: The custom resource that admits one measurement actor per node.
MEASURE_RESOURCE = "opfusion_measure"


class RayUnavailableError(OpfusionError):
    """Ray is not installed, or the cluster offers no node to measure on."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailableError("the Ray runner needs Ray: pip install 'opfusion[tune]' "
                                  "(or pip install ray)") from None
    return ray


class MeasureActor:
    """The body of a measurement actor: a :class:`LocalRunner` on its node (a worker process
    of its own; a Ray actor runs its calls one at a time)."""

    def __init__(self) -> None:
        self.runner = LocalRunner()

    def run(self, data: TaskData, candidates: list[Candidate], options: MeasureOptions,
            reference: Candidate | None) -> list[MeasureResult]:
        return self.runner.run(data, candidates, options, reference)

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def close(self) -> None:
        self.runner.close()


def _portable(candidate: Candidate) -> Candidate:
    """``candidate`` without its loop IR (the actor needs only the C and the flags)."""
    return dataclasses.replace(candidate, prim_func=None)


def _build_library(source: str, flags: tuple[str, ...]) -> str | None:
    """A Ray task: compile ``source`` into this node's kernel cache; an error's text or None."""
    from ..backend.cpu.toolchain import compile_source

    try:
        compile_source(source, flags=flags)
    except OpfusionError as err:
        return f"build: {err}"
    return None


class RayRunner(Runner):
    """Builds as Ray tasks and measures on one actor per node (see the module docstring).

    ``address``: None (an existing ``ray.init`` of this process, else a new local one),
    ``"auto"`` or ``"ray://host:port"``. ``workers``: how many measurement actors (default:
    one per ``opfusion_measure`` unit of the cluster)."""

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        ray = _ray()
        if not ray.is_initialized():
            if address is None:
                ray.init(resources={MEASURE_RESOURCE: 1}, include_dashboard=False,
                         log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        units = int(ray.cluster_resources().get(MEASURE_RESOURCE, 0))
        count = units if workers is None else min(workers, units)
        if count < 1:
            raise RayUnavailableError(
                f"the Ray cluster has no {MEASURE_RESOURCE!r} resource to measure on; start "
                f"each node with ray start --resources='{{\"{MEASURE_RESOURCE}\": 1}}'")
        actor = ray.remote(num_cpus=0, resources={MEASURE_RESOURCE: 1})(MeasureActor)
        self._actors = [actor.remote() for _ in range(count)]
        self._build = ray.remote(num_cpus=1)(_build_library)
        self._ray = ray

    @property
    def nodes(self) -> list[str]:
        """The Ray node id of each measurement actor's node."""
        return self._ray.get([a.node.remote() for a in self._actors])

    def build(self, candidates: Sequence[Candidate], workers: int | None = None) -> None:
        """Compile the candidates' libraries as Ray tasks (errors are set on them)."""
        pending = [c for c in candidates if c.error is None]
        errors = self._ray.get([self._build.remote(c.source, c.flags) for c in pending])
        for candidate, error in zip(pending, errors):
            if error is not None:
                candidate.error = error

    def run(self, data: TaskData, candidates: Sequence[Candidate], options: MeasureOptions,
            reference: Candidate | None = None) -> list[MeasureResult]:
        """The candidates dealt out to the actors in turn, each actor's share measured (with
        the reference, when given) on its node; results in candidate order."""
        ray = self._ray
        shared = ray.put(data)
        shares = [list(range(k, len(candidates), len(self._actors)))
                  for k in range(len(self._actors))]
        futures = {}
        for actor, share in zip(self._actors, shares):
            if share:
                batch = [_portable(candidates[i]) for i in share]
                ref = _portable(reference) if reference is not None else None
                futures[actor.run.remote(shared, batch, options, ref)] = share
        results: list[MeasureResult | None] = [None] * len(candidates)
        waiting = list(futures)
        while waiting:  # streamed back as each node finishes its share
            done, waiting = ray.wait(waiting, num_returns=1)
            for future in done:
                for index, result in zip(futures[future], ray.get(future)):
                    results[index] = result
        return [r for r in results if r is not None]

    def close(self) -> None:
        ray = self._ray
        for actor in self._actors:
            try:
                ray.get(actor.close.remote())
                ray.kill(actor)
            except Exception as err:  # noqa: BLE001 - a dead actor has nothing to release
                logger.debug("closing a measurement actor: %s", err)
        self._actors = []
