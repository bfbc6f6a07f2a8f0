"""opf.load trusts an artifact no further than its own library: kernels come from the
library's kernel table, every manifest field is checked against that table and against the
rest of the manifest, and damaged, truncated, foreign or over-expanding files are
ArtifactErrors (never a call into libc, an out-of-bounds access or a KeyError)."""

import json
import os
import struct
import zipfile

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.compiler.artifact import ArtifactError, write_archive

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

X = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """exp -> add constant -> relu -> argsort (a reference step): kernels, a constant, planned
    intermediates and a NumPy step, exported once."""
    directory = tmp_path_factory.mktemp("trust")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPFUSION_CACHE_DIR", str(directory / "cache"))
        x, w = opf.var("x", (4, 8)), opf.var("w", (8,))
        relu = opf.op.nn.relu(opf.op.add(opf.op.exp(x), w))
        mod = opf.IRModule.from_expr(opf.Function([x, w], opf.Tuple(
            [relu, opf.op.argsort(relu, axis=1)])))
        exe = opf.compile(mod, params={"w": np.arange(8, dtype="float32")}, fusion="none")
        path = directory / "model.opf"
        exe.export(path)
        yield path, exe(X)


@pytest.fixture(autouse=True)
def _private_cache(artifact, monkeypatch):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(artifact[0].parent / "cache"))


def _rewrite(src, dst, manifest=None, members=None):
    """Copy artifact ``src`` to ``dst`` with the manifest edited by ``manifest(dict)`` and
    members replaced by ``members`` (name -> bytes), written as export writes them (the
    weights stored and aligned)."""
    contents = {}
    with zipfile.ZipFile(src) as source:
        for name in source.namelist():
            data = source.read(name)
            if name == "manifest.json" and manifest is not None:
                edited = json.loads(data)
                manifest(edited)
                data = json.dumps(edited).encode()
            if members and name in members:
                data = members[name]
            contents[name] = data
    weights = contents.pop("weights.bin")
    write_archive(dst, contents, [weights])
    return dst


def test_export_and_load_round_trip_gives_identical_outputs(artifact, tmp_path):
    path, want = artifact
    got = opf.load(path)(X)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_an_entry_naming_a_libc_function_is_refused_and_never_called(artifact, tmp_path):
    path, _ = artifact
    marker = tmp_path / "pwned"

    def to_system(manifest):
        manifest["steps"][0]["entry"] = "system"

    forged = _rewrite(path, tmp_path / "forged.opf", to_system)
    command = f"touch {marker}".encode() + b"\0"
    x = np.zeros(32, np.float32)
    x.view(np.uint8)[:len(command)] = np.frombuffer(command, np.uint8)
    with pytest.raises(ArtifactError, match="no kernel 'system'"):
        opf.load(forged).run([x.reshape(4, 8)])
    assert not marker.exists()


def _shrink_input_and_its_params(manifest):
    manifest["values"][0]["shape"] = [1, 8]
    manifest["steps"][0]["params"][0][1] = [1, 8]


def _shrink_output_and_its_params(manifest):
    manifest["values"][4]["shape"] = [1, 2]
    manifest["steps"][2]["params"][1][1] = [1, 2]
    manifest["steps"][2]["output_types"][0][0] = [1, 2]
    manifest["steps"][3]["reference"] = manifest["steps"][3]["reference"].replace(
        "%p0: Tensor[(4, 8)", "%p0: Tensor[(1, 2)")


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def edit(manifest):
        target = manifest
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return edit


@pytest.mark.parametrize("edit", [
    _shrink_input_and_its_params,
    _shrink_output_and_its_params,
    _set("values", 0, "shape", [2, 8]),                     # value smaller than the kernel's
    _set("values", 1, "dtype", "float64"),
    _set("values", 1, "dtype", "object"),
    _set("values", 2, "shape", [16]),                        # constant vs its array
    _set("values", 2, "constant", "v99"),
    _set("values", 0, "input_index", 3),
    _set("values", 1, "input_index", 0),                     # input twice
    _set("steps", 0, "reads", [7]),
    _set("steps", 0, "reads", [1]),                          # read before it is made
    _set("steps", 1, "writes", [1]),                         # written twice
    _set("steps", 0, "writes", [2]),                         # writes a constant
    _set("steps", 1, "reads", [1]),                          # too few operands for the kernel
    _set("steps", 1, "params", 2, 3, False),                 # written flag vs the table
    _set("steps", 0, "params", 1, 3, "yes"),
    _set("steps", 0, "entry", "fused_add_1"),                # another kernel's entry
    _set("steps", 3, "reference", "def @main(%p0: Tensor[(4, 8), float32]) { %p0 }"),
    _set("steps", 3, "reference", "not ir at all"),
    _set("steps", 3, "reference", None),
    _set("outputs", [9]),
    _set("outputs", [1]),                                    # an intermediate of the plan
    _set("tuple_output", False),
    _set("plan", "block_sizes", [64, 128]),                  # a block smaller than its value
    _set("plan", "block_sizes", [1 << 40, 128]),             # or absurdly large
    _set("plan", {"block_of": {"1": 0, "3": 0}, "block_sizes": [128, 0],  # two live values
                  "naive_bytes": 256}),                      # share a block
    _set("plan", "block_of", {"1": 0}),
    _set("plan", "block_of", {"1": 5, "3": 1}),
    _set("plan", "block_of", {"x": 0, "3": 1}),
    _set("input_names", ["x", "x"]),
    _set("values", "all"),
    _set("steps", 0, "reads", "0"),
    _set("plan", None),
])
def test_an_inconsistent_manifest_is_an_artifact_error(artifact, tmp_path, edit):
    forged = _rewrite(artifact[0], tmp_path / "forged.opf", edit)
    with pytest.raises(ArtifactError):
        opf.load(forged)


def _index(**entry):
    """A weights.json whose only array v2 is ``entry`` over the real one (float32[8] at 0)."""
    return json.dumps({"arrays": {"v2": {"dtype": "float32", "shape": [8], "offset": 0,
                                         "nbytes": 32, **entry}}}).encode()


@pytest.mark.parametrize("members", [
    {"weights.json": _index(shape=[16], nbytes=64)},        # shape vs the manifest
    {"weights.json": _index(dtype="float64", nbytes=64)},   # dtype vs the manifest
    {"weights.json": _index(dtype="object")},
    {"weights.json": _index(nbytes=16)},                     # bytes vs its shape
    {"weights.json": _index(offset=64)},                     # beyond weights.bin
    {"weights.json": _index(offset=4)},                      # not aligned
    {"weights.json": _index(offset=-64)},
    {"weights.json": _index(shape=[8.0])},
    {"weights.json": b'{"arrays": {"../v2": {}}}'},
    {"weights.json": b"[]"},
    {"weights.json": b"not json"},
    {"weights.bin": b"\0" * 16},                             # shorter than its index says
    {"manifest.json": b"{not json"},
    {"manifest.json": b"[]"},
    {"kernels.c": b"\xff\xfe\xfa"},
])
def test_damaged_members_are_artifact_errors(artifact, tmp_path, members):
    forged = _rewrite(artifact[0], tmp_path / "forged.opf", members=members)
    with pytest.raises(ArtifactError):
        opf.load(forged)


def test_an_index_claiming_a_huge_array_is_refused_without_allocating(artifact, tmp_path):
    forged = _rewrite(artifact[0], tmp_path / "forged.opf",
                      members={"weights.json": _index(shape=[1 << 40], nbytes=4 << 40)})
    with pytest.raises(ArtifactError, match="lies beyond"):
        opf.load(forged)


def test_flipped_bytes_in_the_library_are_refused_before_loading(artifact, tmp_path):
    with zipfile.ZipFile(artifact[0]) as source:
        library = bytearray(source.read("kernels.so"))
    library[len(library) // 2] ^= 0xFF
    forged = _rewrite(artifact[0], tmp_path / "forged.opf", members={"kernels.so": library})
    with pytest.raises(ArtifactError, match="checksum"):
        opf.load(forged)


def test_truncated_files_are_artifact_errors(artifact, tmp_path):
    data = artifact[0].read_bytes()
    for cut in (0, 10, len(data) // 3, len(data) // 2, len(data) - 30, len(data) - 1):
        truncated = tmp_path / f"cut{cut}.opf"
        truncated.write_bytes(data[:cut])
        with pytest.raises(ArtifactError):
            opf.load(truncated)


def test_flipped_bytes_anywhere_are_an_error_or_change_nothing(artifact, tmp_path):
    path, want = artifact
    data = artifact[0].read_bytes()
    for position in range(0, len(data), max(1, len(data) // 40)):
        damaged = bytearray(data)
        damaged[position] ^= 0x5A
        target = tmp_path / f"flip{position}.opf"
        target.write_bytes(damaged)
        try:
            exe = opf.load(target)
        except ArtifactError:
            continue
        for g, w in zip(exe(X), want):  # the flip hit bytes nothing reads (a name, padding)
            np.testing.assert_array_equal(g, w)


def test_a_foreign_zip_is_an_artifact_error(tmp_path):
    foreign = tmp_path / "foreign.opf"
    with zipfile.ZipFile(foreign, "w") as out:
        out.writestr("hello.txt", "hi")
    with pytest.raises(ArtifactError, match="lacks"):
        opf.load(foreign)


def _claim_size(path, member, size):
    """Patch the central directory so that ``member`` claims ``size`` uncompressed bytes."""
    data = bytearray(path.read_bytes())
    position = data.find(b"PK\x01\x02")
    while position != -1:
        name_length = struct.unpack_from("<H", data, position + 28)[0]
        name = bytes(data[position + 46:position + 46 + name_length]).decode()
        if name == member:
            struct.pack_into("<I", data, position + 24, size)
        position = data.find(b"PK\x01\x02", position + 4)
    path.write_bytes(bytes(data))


def test_a_member_claiming_a_huge_expansion_is_refused_unread(artifact, tmp_path):
    forged = _rewrite(artifact[0], tmp_path / "bomb.opf")
    _claim_size(forged, "kernels.c", 0xFFFFFFF0)
    with pytest.raises(ArtifactError, match="zip bomb"):
        opf.load(forged)


def test_a_real_zip_bomb_is_refused_by_the_size_limit(artifact, tmp_path):
    # 64 MiB of zeros deflate to about 64 KiB: an honest ratio, but over the limit given.
    forged = _rewrite(artifact[0], tmp_path / "bomb.opf",
                      members={"kernels.c": b"\0" * (64 << 20)})
    with pytest.raises(ArtifactError, match="limit"):
        opf.load(forged, max_bytes=16 << 20)


def test_the_warning_that_artifacts_run_native_code_is_where_users_look(capsys):
    from opfusion.cli import main

    assert "Only load artifacts you trust" in opf.load.__doc__
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "native code" in " ".join(capsys.readouterr().out.split())


def test_a_damaged_installed_copy_of_the_library_is_written_again(artifact):
    path, want = artifact
    opf.load(path)
    from opfusion.backend.cpu.toolchain import cache_dir, file_sha256

    with zipfile.ZipFile(path) as archive:
        digest = json.loads(archive.read("manifest.json"))["library_sha256"]
    installed = cache_dir() / "artifacts" / f"{digest[:40]}.so"
    # Replaced, not truncated in place: this process has the library mapped, and shrinking
    # a mapped file under it would fault (which is why the cache only ever renames).
    damaged = installed.with_name("damaged.tmp")
    damaged.write_bytes(installed.read_bytes()[:len(installed.read_bytes()) // 2])
    os.replace(damaged, installed)
    got = opf.load(path)(X)
    assert file_sha256(installed) == digest
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_a_manifest_rewired_within_its_own_checks_is_refused_by_the_model_tables(
        artifact, tmp_path):
    """A step edited to read another value of the same type passes every check of the
    manifest against itself; the library's native entry would still run the model it was
    built for. Loading compares the library's model tables with the manifest's layout."""
    def rewire(manifest):
        exp_result = manifest["steps"][0]["writes"][0]
        manifest["steps"][2]["reads"] = [exp_result]  # relu(exp(x)), not relu(exp(x) + w)

    path = _rewrite(artifact[0], tmp_path / "rewired.opf", rewire)
    with pytest.raises(ArtifactError, match="the library's model tables differ from the "
                                            "model's steps in step_args"):
        opf.load(path)


@pytest.fixture(scope="module")
def concatenated(tmp_path_factory):
    """relu(concatenate([exp(x), -x], axis=1)) at batch 1: exp and negative write their
    pieces of the concatenation in place (plan aliases 1 -> [3, 0], 2 -> [3, 512])."""
    directory = tmp_path_factory.mktemp("concat")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPFUSION_CACHE_DIR", str(directory / "cache"))
        x = opf.var("x", (1, 8, 4, 4))
        out = opf.op.nn.relu(opf.op.concatenate([opf.op.exp(x), opf.op.negative(x)], axis=1))
        exe = opf.compile(opf.IRModule.from_expr(opf.Function([x], out)), fusion="none")
        assert exe.plan.aliases == {1: (3, 0), 2: (3, 512)}
        value = np.random.default_rng(1).standard_normal((1, 8, 4, 4)).astype(np.float32)
        path = directory / "concat.opf"
        exe.export(path)
        yield path, value, exe(value)


def test_an_in_place_concatenation_round_trips(concatenated):
    path, value, want = concatenated
    np.testing.assert_array_equal(opf.load(path)(value), want)


def _alias(key, pair):
    def edit(manifest):
        manifest["plan"]["aliases"][key] = pair
    return edit


def _write_holder(manifest):
    manifest["steps"][1]["writes"] = [3]  # the concatenation, which its pieces make


@pytest.mark.parametrize("edit, message", [
    (_alias("2", [3, 768]), "places value 2 at byte 768 of value 3, which does not hold it"),
    (_alias("2", [3, 520]), "places value 2 at byte 520"),  # not aligned
    (_alias("3", [1, 0]), "which does not hold it there"),  # 3 is larger than 1
    (_alias("2", [2, 0]), "which does not hold it there"),  # itself
    (_write_holder, "writes value 3, an input, a constant, a value written before or "
                    "assembled in place"),
], ids=["outside", "misaligned", "larger", "itself", "holder written"])
def test_a_damaged_in_place_concatenation_is_refused(concatenated, tmp_path, edit, message):
    path = _rewrite(concatenated[0], tmp_path / "damaged.opf", edit)
    with pytest.raises(ArtifactError, match=message):
        opf.load(path)


def test_aliases_in_a_cycle_are_refused(concatenated, tmp_path):
    def cycle(manifest):
        manifest["values"][3]["shape"] = manifest["values"][1]["shape"]
        manifest["plan"]["aliases"] = {"1": [3, 0], "3": [1, 0]}

    path = _rewrite(concatenated[0], tmp_path / "cycle.opf", cycle)
    with pytest.raises(ArtifactError):
        opf.load(path)


@pytest.fixture(scope="module")
def sliced(tmp_path_factory):
    """tanh(x[:, :8] as exp) and -exp(x)[:, 8:] concatenated, at batch 1: the two slices of
    exp(x) are read in place (plan views), neither copied."""
    directory = tmp_path_factory.mktemp("slices")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPFUSION_CACHE_DIR", str(directory / "cache"))
        x = opf.var("x", (1, 16, 4, 4))
        e = opf.op.exp(x)
        low, high = (opf.op.strided_slice(e, begin=[b], end=[b + 8], axes=[1]) for b in (0, 8))
        out = opf.op.concatenate([opf.op.tanh(low), opf.op.negative(high)], axis=1)
        exe = opf.compile(opf.IRModule.from_expr(opf.Function([x], out)), fusion="none")
        assert len(exe.plan.views) == 2
        value = np.random.default_rng(1).standard_normal((1, 16, 4, 4)).astype(np.float32)
        path = directory / "slices.opf"
        exe.export(path)
        yield path, value, exe(value), exe.plan


def test_slices_read_in_place_round_trip(sliced):
    path, value, want, plan = sliced
    loaded = opf.load(path)
    assert loaded.plan.views == plan.views
    np.testing.assert_array_equal(loaded(value), want)


def _write_view(manifest):
    view = manifest["plan"]["views"][0]
    step = next(s for s in manifest["steps"] if view in s["reads"])
    step["writes"] = [view]  # a kernel writing what is only a view of another value


@pytest.mark.parametrize("edit, message", [
    (_write_view, "writes value"),
    (lambda m: m["plan"].update(views=[999]), "plan.views"),
    (lambda m: m["plan"].update(views="all"), "plan.views"),
], ids=["view written", "not an alias", "not a list"])
def test_a_damaged_view_is_refused(sliced, tmp_path, edit, message):
    path = _rewrite(sliced[0], tmp_path / "damaged.opf", edit)
    with pytest.raises(ArtifactError, match=message):
        opf.load(path)
