"""opf.Target: parsing, round trips, features and what code generation reads from it."""

import json
import threading
import zipfile

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend import get_backend
from opfusion.backend.cpu.toolchain import have_c_compiler, target_flags
from opfusion.errors import BuildError
from opfusion.target import Target, TargetError, host_arch, host_features
from opfusion.testing import assert_close
from opfusion.testing.examples import seed_example

needs_cc = pytest.mark.skipif(not have_c_compiler(), reason="needs a C compiler")
x86 = pytest.mark.skipif(host_arch() != "x86_64", reason="x86 feature sets")

SPECS = ["c", "llvm", "llvm -mcpu=znver4", "c -mattr=+avx2,+fma", "c -mattr=+avx512f",
         "c -mcpu=native -mattr=-avx512f", "c -mcpu=skylake -mattr=-fma",
         "c -num-cores=4 -l1-cache=48K -l2-cache=2M -l3-cache=32M", "cuda -arch=sm_90"]


@pytest.mark.parametrize("spec", SPECS)
def test_str_round_trips(spec):
    target = Target(spec)
    assert str(target) == spec
    assert Target(str(target)) == target
    assert Target(target) == target
    assert hash(Target(spec)) == hash(target)


@x86
def test_features_are_closed_under_implication():
    avx512 = Target("c -mattr=+avx512f")
    assert {"avx2", "fma", "avx", "sse4.2", "sse2"} <= avx512.features
    assert avx512.vector_bits == 512 and avx512.vector_registers == 32
    assert avx512.vector_lanes("float32") == 16 and avx512.vector_lanes("float64") == 8
    avx2 = Target("c -mattr=+avx2,+fma")
    assert "avx512f" not in avx2.features and avx2.isa == "avx2"
    assert avx2.vector_bytes == 32 and avx2.vector_registers == 16
    assert avx2.vector_lanes("int8") == 32
    # removing a feature removes what needs it
    assert Target("llvm -mcpu=znver4 -mattr=-avx2").features.isdisjoint(
        {"avx2", "avx512f", "avx512bw", "avx512vnni"})
    assert Target("c -mcpu=generic").features == {"sse", "sse2"}


@x86
def test_avx_vnni_is_vnni_on_avx2_vectors():
    """AVX-VNNI (Intel's client cores since Alder Lake): /proc/cpuinfo's avx_vnni, implying
    AVX2, enabled by -mavxvnni; its byte products take words of 4 bytes on 32-byte vectors."""
    from opfusion.target.isa import features_from_cpuinfo
    from opfusion.transform.int8_products import has_vnni, word_values

    assert "avxvnni" in features_from_cpuinfo("x86_64", ("avx", "avx2", "avx_vnni"))
    alderlake = Target("c -mcpu=alderlake")
    assert "avxvnni" in alderlake.features and "avx512f" not in alderlake.features
    assert alderlake.vector_registers == 16 and has_vnni(alderlake)
    assert word_values(alderlake) == 4 and word_values(Target("c -mattr=+avx2,+fma")) == 2
    assert "-mavxvnni" in alderlake.compiler_flags()
    assert "avxvnni" not in Target("c -mcpu=alderlake -mattr=-avx2").features
    for cpu in ("raptorlake", "meteorlake", "znver5", "sapphirerapids"):
        assert "avxvnni" in Target(f"c -mcpu={cpu}").features


@x86
@needs_cc
@pytest.mark.parametrize("refused, lost", [("avxvnni", {"avxvnni"}),
                                           ("avx512f", {"avx512f", "avx512vnni", "avx512bw"})])
def test_the_host_target_leaves_out_what_its_compiler_does_not_know(tmp_path, monkeypatch,
                                                                     refused, lost):
    """A CPU newer than its compiler (GCC 10 and -mavxvnni on an Alder Lake): the host target
    drops the features whose flags the compiler refuses, and what needs them, so that its
    kernels build; the CPU's own features (what an artifact may use here) stay."""
    from opfusion.backend.cpu.toolchain import find_compiler
    from opfusion.target import host_target

    host_target()  # (made once per process: with the real compiler, for the other tests)
    real = " ".join(find_compiler())
    wrapper = tmp_path / "oldcc"
    wrapper.write_text("#!/bin/sh\n"
                       f'for a in "$@"; do [ "$a" = "-m{refused}" ] && exit 1; done\n'
                       f'exec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    host = Target("c")
    assert not host.features & {refused, *lost}
    assert host.features <= host_features()
    assert host_features() - host.features <= {refused, *lost, *(
        f for f in host_features() if f.startswith("avx512"))}
    assert f"-m{refused}" not in host.compiler_flags()
    x = opf.var("x", shape=(4, 37))
    mod = opf.IRModule.from_expr(opf.Function([x], opf.op.exp(opf.op.add(x, x))))
    data = np.linspace(-3, 3, 4 * 37, dtype=np.float32).reshape(4, 37)
    assert_close(opf.compile(mod, target=host)(data), np.exp(data + data))


@x86
def test_compiler_flags_name_exactly_the_features():
    flags = Target("c -mattr=+avx2,+fma").compiler_flags()
    assert flags[0] == "-march=x86-64" and "-mavx2" in flags and "-mfma" in flags
    assert not any("avx512" in f or "native" in f for f in flags)
    assert "-mavx512f" in Target("c -mattr=+avx512f").compiler_flags()
    assert "-march=native" not in target_flags(Target("c"))


def test_host_target_is_the_machine():
    host = Target("c")
    assert host.is_host and host.features == host_features()
    assert host.num_cores >= 1 and host.cache_bytes(1) > 0 and host.cache_bytes(2) > 0
    assert host.missing_on_host() == []
    assert Target("c -num-cores=3 -l2-cache=1536K").num_cores == 3
    assert Target("c -l2-cache=1536K").cache_bytes(2) == 1536 * 1024


@pytest.mark.parametrize("spec, message", [
    ("", "empty target"),
    ("vulkan", "unknown target kind 'vulkan'"),
    ("c -mcpu=pentium9", "unknown CPU"),
    ("c -mattr=avx2", "needs a \\+ or - sign"),
    ("c -mattr=+avx1024", "unknown x86_64 feature 'avx1024'"),
    ("c -opt=3", "unknown option -opt"),
    ("c mcpu=znver4", "not of the form -name=value"),
    ("c -num-cores=0", "must be a positive number"),
    ("c -l2-cache=lots", "must be a positive number"),
    ("c -mcpu=znver4 -mcpu=znver3", "given twice"),
])
def test_bad_targets_are_clear_errors(spec, message):
    if "x86_64" in message and host_arch() != "x86_64":
        pytest.skip("x86 feature names")
    with pytest.raises(TargetError, match=message):
        Target(spec)


def test_target_error_is_a_build_error():
    assert issubclass(TargetError, BuildError)
    assert get_backend("cuda -arch=sm_90").device == "cuda"
    with pytest.raises(TargetError):
        Target(3)  # type: ignore[arg-type]


def test_with_target_makes_it_current_per_thread():
    avx2 = Target("c -mattr=+avx2,+fma")
    assert Target.current() == Target("c")
    seen = []
    with avx2:
        assert Target.current() is avx2
        worker = threading.Thread(target=lambda: seen.append(Target.current()))
        worker.start()
        worker.join()
        with Target("c -num-cores=1") as inner:
            assert Target.current() is inner
        assert Target.current() is avx2
    assert Target.current() == Target("c")
    assert seen == [Target("c")]  # another thread does not see this thread's target
    assert Target.current(allow_none=True) is None


@x86
def test_explicit_spells_the_features_out():
    host = Target("c")
    explicit = host.explicit()
    assert not explicit.is_host and explicit.features == host.features
    assert Target(str(explicit)) == explicit
    assert Target("c -mattr=+avx2,+fma").explicit().features == Target(
        "c -mattr=+avx2,+fma").features


@needs_cc
@x86
def test_an_avx2_artifact_needs_only_avx2_level_features(tmp_path):
    if not Target("c").has("avx2"):
        pytest.skip("the host lacks AVX2")
    mod = seed_example()
    exe = opf.compile(mod, target="c -mattr=+avx2,+fma")
    assert exe.target == Target("c -mattr=+avx2,+fma")
    path = tmp_path / "m.opf"
    exe.export(path)
    with zipfile.ZipFile(path) as archive:
        manifest = json.loads(archive.read("manifest.json"))
    assert "avx2" in manifest["isa_features"] and "fma" in manifest["isa_features"]
    assert not any(f.startswith("avx512") or f == "hypervisor"
                   for f in manifest["isa_features"])
    loaded = opf.load(path)
    assert loaded.target.features == exe.target.features
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal([int(d) for d in p.checked_type.shape]).astype("float32")
             for p in mod["main"].params]
    assert_close(loaded(*feeds), opf.ir.evaluate(mod, feeds))
