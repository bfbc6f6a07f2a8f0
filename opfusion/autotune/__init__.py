"""Schedule auto-tuning: search each fused group's schedule knobs, measure the candidates
safely, keep the records, and compile with the best (see :mod:`.tuner`)::

    result = opf.tune(mod, params, trials=800, records="tune.json")
    print(result.render())
    exe = opf.compile(mod, params=params, records="tune.json")

- :mod:`.task`: the tasks (distinct fused groups with knobs, weighted by their calls);
- :mod:`.search` with :mod:`.features` and :mod:`.cost_model`: the per-task search;
- :mod:`.measure`, :mod:`.runner`, :mod:`.worker`: building and safe measurement
  (:mod:`.ray_runner` for a Ray cluster, :mod:`.gpu_runner` on a GPU for CUDA targets);
- :mod:`.records`: the JSON-lines records ``opf.compile(..., records=...)`` reads."""

from .gpu_runner import GPURunner
from .measure import Candidate, MeasureOptions, MeasureResult, build_candidates
from .records import Record, RecordsError, TuningRecords
from .runner import LocalRunner, Runner
from .task import Task, extract_tasks, task_key
from .tuner import TuneProgress, TuneResult, tune

__all__ = ["Candidate", "GPURunner", "LocalRunner", "MeasureOptions", "MeasureResult", "Record",
           "RecordsError", "Runner", "Task", "TuneProgress", "TuneResult", "TuningRecords",
           "build_candidates", "extract_tasks", "task_key", "tune"]
