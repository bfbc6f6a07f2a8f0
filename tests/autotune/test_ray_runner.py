"""The Ray runner on a local two-node Ray cluster: one measurement actor per node, records of
the same format as the local runner's for the same candidates, and compiling with either's
records gives the same kernels for the same best configs. Skipped without Ray (an optional
extra: pip install opfusion[tune])."""

import json

import pytest

import opfusion as opf
from opfusion.autotune import MeasureOptions, tune
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.testing import resnet

ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install opfusion[tune])")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = [pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed"),
              pytest.mark.slow]

FAST = MeasureOptions(repeat=2, min_repeat_seconds=0.002, timeout=10.0)


@pytest.fixture(scope="module")
def two_nodes():
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"opfusion_measure": 1}})
    cluster.add_node(num_cpus=1, resources={"opfusion_measure": 1})
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_ray_and_local_runners_keep_interchangeable_records(two_nodes, tmp_path):
    from opfusion.autotune.ray_runner import RayRunner

    mod, params = resnet(num_layers=18, image_shape=(3, 32, 32), num_classes=10)
    with RayRunner() as runner:
        nodes = runner.nodes
        assert len(nodes) == 2 and len(set(nodes)) == 2  # one measurement actor per node
        tune(mod, params, trials=8, records=tmp_path / "ray.json", runner=runner, batch=4,
             options=FAST, confirm=0)
    tune(mod, params, trials=8, records=tmp_path / "local.json", batch=4, options=FAST,
         confirm=0)
    remote, local = lines(tmp_path / "ray.json"), lines(tmp_path / "local.json")
    assert [set(r) for r in remote] == [set(r) for r in local]
    assert {r["runner"] for r in remote} == {"ray"} and {r["runner"] for r in local} == {"local"}
    key = [(r["task"], r["knobs"]) for r in remote]
    assert key == [(r["task"], r["knobs"]) for r in local]  # the same candidates, same seed
    assert all(r["seconds"] and not r["error"] for r in remote)
    # the local records with the Ray run's times choose what the Ray records choose
    same = [{**r, "seconds": m["seconds"]} for r, m in zip(local, remote)]
    (tmp_path / "same.json").write_text("".join(json.dumps(r) + "\n" for r in same))
    from_ray = opf.compile(mod, params=params, records=tmp_path / "ray.json")
    from_local = opf.compile(mod, params=params, records=tmp_path / "same.json")
    assert from_ray.source_code == from_local.source_code
