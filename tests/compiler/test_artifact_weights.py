"""An artifact's weights are stored uncompressed and aligned, and loading maps them: the
constants are read-only views of the file, equal to the compiled model's, and a truncated or
edited weight region is an ArtifactError at load. Loading needs no C compiler and no writable
kernel cache."""

import json
import mmap
import os
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.compiler.artifact import WEIGHTS_ALIGNMENT, ArtifactError, write_archive

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

X = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
# Odd sizes, so that the arrays after the first need padding to be aligned.
PARAMS = {"a": np.arange(5, dtype="float32") / 7, "b": np.linspace(-1, 1, 15, dtype="float32")
          .reshape(3, 5), "c": np.full((3, 1), 0.5, dtype="float32")}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """x * a + b - c (three constants of 5, 15 and 3 floats), compiled and exported."""
    directory = tmp_path_factory.mktemp("weights")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPFUSION_CACHE_DIR", str(directory / "cache"))
        x = opf.var("x", (3, 5))
        a, b, c = opf.var("a", (5,)), opf.var("b", (3, 5)), opf.var("c", (3, 1))
        out = opf.op.subtract(opf.op.add(opf.op.multiply(x, a), b), c)
        mod = opf.IRModule.from_expr(opf.Function([x, a, b, c], out))
        exe = opf.compile(mod, params=PARAMS, fusion="none")
        path = directory / "model.opf"
        exe.export(path)
        yield path, exe, exe(X)


@pytest.fixture(autouse=True)
def _private_cache(artifact, monkeypatch):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(artifact[0].parent / "cache"))


def _constants(exe):
    return [info.constant for info in exe.values if info.constant is not None]


def test_weights_are_stored_uncompressed_at_aligned_offsets(artifact):
    with zipfile.ZipFile(artifact[0]) as archive:
        info = archive.getinfo("weights.bin")
        index = json.loads(archive.read("weights.json"))["arrays"]
        assert info.compress_type == zipfile.ZIP_STORED
        assert archive.getinfo("kernels.c").compress_type == zipfile.ZIP_DEFLATED
    assert len(index) == 3
    assert all(entry["offset"] % WEIGHTS_ALIGNMENT == 0 for entry in index.values())


def test_loaded_constants_are_read_only_aligned_views_of_the_file(artifact):
    path, exe, want = artifact
    loaded = opf.load(path)
    got, original = _constants(loaded), _constants(exe)
    assert len(got) == len(original) == 3
    for array, expected in zip(got, original):
        np.testing.assert_array_equal(array, expected)
        assert array.dtype == expected.dtype
        assert not array.flags.writeable
        with pytest.raises(ValueError):
            array.flags.writeable = True
        with pytest.raises(ValueError):
            array[...] = 0
        assert array.ctypes.data % WEIGHTS_ALIGNMENT == 0
        base = array
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base.obj, mmap.mmap)  # a view of the mapped file, not a copy
    np.testing.assert_array_equal(loaded(X), want)
    np.testing.assert_array_equal(opf.load(path, verify_weights=False)(X), want)


def _weights_region(path):
    """(start, size) of weights.bin's data in the file."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("weights.bin")
    data = path.read_bytes()
    name_length, extra_length = struct.unpack_from("<HH", data, info.header_offset + 26)
    return info.header_offset + 30 + name_length + extra_length, info.file_size


def test_an_edited_weight_is_refused_by_its_checksum(artifact, tmp_path):
    path, _, want = artifact
    start, size = _weights_region(path)
    data = bytearray(path.read_bytes())
    data[start + size - 2] ^= 0x40  # inside c, the last array
    edited = tmp_path / "edited.opf"
    edited.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="CRC-32"):
        opf.load(edited)
    # Unverified, the edit is what the model computes with (and nothing else changes).
    assert not np.array_equal(opf.load(edited, verify_weights=False)(X), want)


def _claim_weights_size(path, size):
    """Patch the central directory so that weights.bin claims ``size`` bytes (stored), as if
    the file had been truncated inside it and the directory kept."""
    data = bytearray(path.read_bytes())
    position = data.find(b"PK\x01\x02")
    while position != -1:
        name_length = struct.unpack_from("<H", data, position + 28)[0]
        if bytes(data[position + 46:position + 46 + name_length]) == b"weights.bin":
            struct.pack_into("<II", data, position + 20, size, size)
        position = data.find(b"PK\x01\x02", position + 4)
    path.write_bytes(bytes(data))


def test_a_weight_region_beyond_the_end_of_the_file_is_refused(artifact, tmp_path):
    forged = tmp_path / "long.opf"
    forged.write_bytes(artifact[0].read_bytes())
    _claim_weights_size(forged, forged.stat().st_size)
    with pytest.raises(ArtifactError, match="truncated"):
        opf.load(forged)


def test_a_file_cut_inside_the_weights_is_refused(artifact, tmp_path):
    data = artifact[0].read_bytes()
    start, size = _weights_region(artifact[0])
    for cut in (start + 1, start + size // 2, start + size - 1):
        truncated = tmp_path / f"cut{cut}.opf"
        truncated.write_bytes(data[:cut])
        with pytest.raises(ArtifactError):
            opf.load(truncated)


def test_weights_rewritten_compressed_or_unaligned_are_refused(artifact, tmp_path):
    with zipfile.ZipFile(artifact[0]) as source:
        contents = {name: source.read(name) for name in source.namelist()}
    deflated = tmp_path / "deflated.opf"
    with zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as out:
        for name, data in contents.items():
            out.writestr(name, data)
    with pytest.raises(ArtifactError, match="compressed"):
        opf.load(deflated)
    # Stored but shifted in the file: another zip tool, not export. Where the weights land
    # depends on how well the other members compress, so the padding member's name grows
    # until they land unaligned.
    shifted = tmp_path / "shifted.opf"
    for length in range(1, WEIGHTS_ALIGNMENT + 1):
        with zipfile.ZipFile(shifted, "w", zipfile.ZIP_DEFLATED) as out:
            out.writestr("p" * length, b"")
            for name, data in contents.items():
                out.writestr(name, data, zipfile.ZIP_STORED if name == "weights.bin" else None)
        start, _ = _weights_region(shifted)
        if start % WEIGHTS_ALIGNMENT:
            break
    assert start % WEIGHTS_ALIGNMENT
    with pytest.raises(ArtifactError, match="aligned"):
        opf.load(shifted)


def test_an_older_format_is_refused_with_advice_to_export_again(artifact, tmp_path):
    with zipfile.ZipFile(artifact[0]) as source:
        contents = {name: source.read(name) for name in source.namelist()}
    manifest = json.loads(contents["manifest.json"])
    manifest["format"] = "opfusion-artifact-3"
    old = tmp_path / "old.opf"
    with zipfile.ZipFile(old, "w", zipfile.ZIP_DEFLATED) as out:  # as version 3 wrote them
        out.writestr("manifest.json", json.dumps(manifest))
        for name in ("kernels.so", "kernels.c"):
            out.writestr(name, contents[name])
        out.writestr("constants.npz", b"")
    with pytest.raises(ArtifactError, match="older opfusion.*export the model again"):
        opf.load(old)


def test_write_archive_aligns_the_weights_after_members_of_any_size(tmp_path):
    for length in range(0, 70, 7):
        path = tmp_path / f"a{length}.zip"
        write_archive(path, {"manifest.json": b"m" * length}, [b"w" * 10, b"x" * 3])
        start, size = _weights_region(path)
        assert start % WEIGHTS_ALIGNMENT == 0 and size == 13
        with zipfile.ZipFile(path) as archive:  # still a zip any tool reads
            assert archive.read("weights.bin") == b"w" * 10 + b"x" * 3
            assert archive.testzip() is None


_LOAD_AND_RUN = """
import sys, numpy as np, opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
assert not have_c_compiler()
np.save(sys.argv[3], opf.load(sys.argv[1])(np.load(sys.argv[2])))
"""


def test_loading_needs_no_compiler_and_no_writable_cache(artifact, tmp_path):
    """A fresh process with CC naming no program, a PATH without a compiler, and a cache
    directory that cannot be created (under a regular file) loads and runs the artifact."""
    path, _, want = artifact
    empty = tmp_path / "bin"
    empty.mkdir()
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    np.save(tmp_path / "x.npy", X)
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc"), "PATH": str(empty),
           "OPFUSION_CACHE_DIR": str(blocker / "cache"),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    subprocess.run([sys.executable, "-c", _LOAD_AND_RUN, str(path), str(tmp_path / "x.npy"),
                    str(tmp_path / "y.npy")], env=env, check=True, timeout=120)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)


def test_a_loaded_model_exports_again(artifact, tmp_path):
    path, _, want = artifact
    again = tmp_path / "again.opf"
    opf.load(path).export(again)
    np.testing.assert_array_equal(opf.load(again)(X), want)
