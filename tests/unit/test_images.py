"""hack/images without building anything: the cache keys, the deterministic layer writer, the OCI archive, and the
images' configs against what the chart and the operator's renders ask of them."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from hack.images import build, debian, inputs, oci
from pdfleet.operator.render import engine_group, router_objects

ROOT = Path(__file__).resolve().parents[2]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# --- cache keys ----------------------------------------------------------------------------------------------

@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("a = 1\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("b = 2\n")
    (tmp_path / "lock.txt").write_text("x==1\n")
    return tmp_path


def test_the_key_changes_with_a_file_s_content_name_or_presence_and_a_value(tree: Path) -> None:
    def key(**values: object) -> str:
        return inputs.key(tree, ["pkg", "lock.txt"], values or {"packages": ("python3",)})

    first = key()
    assert key() == first
    (tree / "pkg" / "a.py").write_text("a = 2\n")
    changed = key()
    assert changed != first
    (tree / "pkg" / "new.py").write_text("")
    added = key()
    assert added != changed
    (tree / "pkg" / "new.py").rename(tree / "pkg" / "renamed.py")
    assert key() != added
    (tree / "pkg" / "renamed.py").unlink()
    assert key() == changed
    assert key(packages=("python3", "gcc")) != changed
    (tree / "lock.txt").write_text("x==2\n")
    assert key() != changed


def test_the_key_ignores_mtimes_byte_code_and_build_leftovers(tree: Path) -> None:
    first = inputs.key(tree, ["pkg"])
    os.utime(tree / "pkg" / "a.py", (0, 0))
    (tree / "pkg" / "__pycache__").mkdir()
    (tree / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tree / "pkg" / "stray.pyc").write_bytes(b"\0")
    (tree / "pkg" / "x.egg-info").mkdir()
    (tree / "pkg" / "x.egg-info" / "PKG-INFO").write_text("")
    assert inputs.key(tree, ["pkg"]) == first


def test_a_missing_input_is_an_error_not_an_empty_key(tree: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing"):
        inputs.key(tree, ["nope"])


def test_the_key_covers_the_recipe_and_the_layer_below(tmp_path: Path) -> None:
    builder = build.Builder(tmp_path)

    def one() -> int:
        return 1

    def two() -> int:
        return 2

    assert builder.key(one) == builder.key(one)
    assert builder.key(one) != builder.key(two)
    assert builder.key(one, parent="a") != builder.key(one, parent="b")


# --- layers --------------------------------------------------------------------------------------------------

@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "opt" / "app" / "bin").mkdir(parents=True)
    (root / "opt" / "app" / "bin" / "tool").write_text("#!/bin/sh\n")
    (root / "opt" / "app" / "bin" / "tool").chmod(0o755)
    (root / "opt" / "app" / "z.txt").write_text("z")
    os.link(root / "opt" / "app" / "z.txt", root / "opt" / "app" / "a-link.txt")
    (root / "opt" / "app" / "current").symlink_to("bin")
    (root / "dev").mkdir()
    (root / "dev" / "junk").write_text("never packed")
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    return root


def members(layer: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(layer) as tar:
        return tar.getmembers()


def test_a_layer_is_the_same_bytes_whatever_the_files_mtimes(rootfs: Path, tmp_path: Path) -> None:
    first = oci.write_layer(rootfs, tmp_path / "1.tar.gz", mtime=1000)
    for path in rootfs.rglob("*"):
        os.utime(path, (12345, 12345), follow_symlinks=False)
    second = oci.write_layer(rootfs, tmp_path / "2.tar.gz", mtime=1000)
    assert first == second
    assert (tmp_path / "1.tar.gz").read_bytes() == (tmp_path / "2.tar.gz").read_bytes()


def test_a_layer_s_digests_sizes_and_entries(rootfs: Path, tmp_path: Path) -> None:
    out = tmp_path / "layer.tar.gz"
    layer = oci.write_layer(rootfs, out, mtime=1000)
    data = out.read_bytes()
    assert layer.descriptor.media_type == oci.LAYER_GZIP
    assert layer.descriptor.digest == sha(data) and layer.descriptor.size == len(data)
    raw = gzip.decompress(data)
    assert layer.diff_id == sha(raw) and layer.unpacked_size == len(raw)
    assert data[4:8] == b"\0\0\0\0", "no timestamp in the gzip header"
    entries = members(out)
    names = [m.name for m in entries]
    assert names == sorted(names, key=lambda n: n.split("/")), "sorted, each directory before its contents"
    assert "dev" in names and "dev/junk" not in names
    assert {m.mtime for m in entries} == {1000}
    assert {(m.uname, m.gname) for m in entries} == {("", "")}
    by_name = {m.name: m for m in entries}
    assert by_name["opt/app/current"].issym() and by_name["opt/app/current"].linkname == "bin"
    assert by_name["opt/app/z.txt"].islnk() and by_name["opt/app/z.txt"].linkname == "opt/app/a-link.txt"
    assert by_name["opt/app/bin/tool"].mode == 0o755


def test_an_uncompressed_layer_has_its_diff_id_as_digest(rootfs: Path, tmp_path: Path) -> None:
    layer = oci.write_layer(rootfs, tmp_path / "layer.tar", gzip_level=None, mtime=1)
    assert layer.descriptor.media_type == oci.LAYER_TAR
    assert layer.descriptor.digest == layer.diff_id == sha((tmp_path / "layer.tar").read_bytes())


def test_a_layer_of_some_paths_carries_their_parents_and_nothing_else(rootfs: Path, tmp_path: Path) -> None:
    oci.write_layer(rootfs, tmp_path / "layer.tar", paths=["opt/app/bin"], gzip_level=None, mtime=1)
    assert [m.name for m in members(tmp_path / "layer.tar")] == ["opt", "opt/app", "opt/app/bin",
                                                                  "opt/app/bin/tool"]


# --- the archive ---------------------------------------------------------------------------------------------

@pytest.fixture
def archive(rootfs: Path, tmp_path: Path) -> tuple[Path, oci.Descriptor, oci.Layer]:
    blobs = tmp_path / "blobs"
    out = tmp_path / "layer.tmp"
    layer = oci.write_layer(rootfs, out, mtime=1)
    oci.blob_path(blobs, layer.descriptor.digest).parent.mkdir(parents=True)
    out.rename(oci.blob_path(blobs, layer.descriptor.digest))
    config = oci.config_document(oci.ImageConfig(entrypoint=("tool",), exposed_ports=(8080,)), [layer], ["x"], 1)
    path = tmp_path / "image.oci.tar"
    manifest = oci.write_archive(path, blobs, "example.test/team/tool:1.2.3", config, [layer], mtime=1)
    return path, manifest, layer


def test_the_archive_is_an_oci_layout_whose_blobs_match_their_descriptors(
        archive: tuple[Path, oci.Descriptor, oci.Layer]) -> None:
    path, manifest, layer = archive
    read = oci.read_archive(path)
    assert read["layout"] == {"imageLayoutVersion": "1.0.0"}
    (entry,) = read["index"]["manifests"]
    assert entry["digest"] == manifest.digest and entry["mediaType"] == oci.MANIFEST
    assert entry["annotations"] == {oci.REF_NAME: "1.2.3", oci.CONTAINERD_NAME: "example.test/team/tool:1.2.3"}
    assert read["manifest"]["layers"] == [layer.descriptor.json()]
    assert read["manifest"]["config"]["mediaType"] == oci.CONFIG
    assert read["config"]["rootfs"] == {"type": "layers", "diff_ids": [layer.diff_id]}
    assert read["config"]["config"]["User"] == "65532:65532"
    assert read["config"]["config"]["ExposedPorts"] == {"8080/tcp": {}}
    assert read["config"]["created"] == "1970-01-01T00:00:01Z"
    with tarfile.open(path) as tar:
        names = tar.getnames()
        assert names == sorted(names)
        data = tar.extractfile("blobs/sha256/" + layer.descriptor.digest.split(":")[1]).read()  # type: ignore[union-attr]
    assert sha(data) == layer.descriptor.digest


def test_a_tampered_blob_is_refused(archive: tuple[Path, oci.Descriptor, oci.Layer], tmp_path: Path) -> None:
    path, manifest, _ = archive
    bad = tmp_path / "bad.tar"
    with tarfile.open(path) as src, tarfile.open(bad, "w") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
            if member.name.endswith(manifest.digest.split(":")[1]):
                data = data.replace(b"schemaVersion", b"schemaVersioN")  # type: ignore[union-attr]
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    with pytest.raises(ValueError, match="does not match"):
        oci.read_archive(bad)


def test_the_same_inputs_write_the_same_archive(archive: tuple[Path, oci.Descriptor, oci.Layer],
                                                tmp_path: Path) -> None:
    path, _, layer = archive
    config = oci.config_document(oci.ImageConfig(entrypoint=("tool",), exposed_ports=(8080,)), [layer], ["x"], 1)
    again = tmp_path / "again.tar"
    oci.write_archive(again, tmp_path / "blobs", "example.test/team/tool:1.2.3", config, [layer], mtime=1)
    assert again.read_bytes() == path.read_bytes()


# --- the images' configs -------------------------------------------------------------------------------------

def image(name: str) -> build.Image:
    return next(i for i in build.images() if i.name == name)


def env(i: build.Image) -> dict[str, str]:
    return dict(e.split("=", 1) for e in i.config.env)


def test_every_image_runs_as_the_chart_s_non_root_user() -> None:
    assert {i.name for i in build.images()} == {"pdfleet-operator", "pdfleet-runtime", "pdfleet-engine-cpu"}
    for i in build.images():
        assert i.config.user == f"{debian.NONROOT}:{debian.NONROOT}"
        assert i.reference == f"{build.REGISTRY}/{i.name}:{build.VERSION}"


def test_the_operator_image_serves_its_ports_from_its_venv() -> None:
    operator = image("pdfleet-operator")
    assert operator.config.entrypoint == ("pdfleet-operator",)
    assert tuple(operator.config.exposed_ports) == (8080, 9090)
    assert env(operator)["PATH"].startswith("/opt/pdfleet/bin:")
    assert env(operator)["HOME"] == "/tmp" and env(operator)["PYTHONUNBUFFERED"] == "1"


def test_the_runtime_image_answers_the_init_container_the_operator_renders() -> None:
    runtime = image("pdfleet-runtime")
    assert runtime.config.entrypoint == ("pdfleet-install-runtime",)
    assert runtime.config.cmd == (engine_group.RUNTIME_MOUNT,)
    source = (ROOT / "operator" / "render" / "engine_group.py").read_text()
    assert '"command": ["pdfleet-install-runtime", RUNTIME_MOUNT]' in source
    assert "/usr/local/bin" in env(runtime)["PATH"].split(":")
    assert {"sh", "cp", "mv", "rm", "mkdir"} <= set(build.BUSYBOX_APPLETS)


def test_the_engine_image_runs_the_launcher_s_simulator_and_the_router_with_its_python() -> None:
    engine = image("pdfleet-engine-cpu")
    assert env(engine)["PDFLEET_ENGINE_MODE"] == "simulate"
    assert env(engine)["PATH"].startswith("/opt/sglang/bin:"), "python3 is the venv's, where sglang is"
    for module in (engine_group, router_objects):
        assert '"command": ["python3", "-m",' in (ROOT / "operator" / "render" / f"{module.__name__.split('.')[-1]}.py"
                                                   ).read_text()


def test_the_installer_script_lays_out_the_same_tree_as_the_python_installer(tmp_path: Path) -> None:
    from pdfleet.runtime import install

    installed = tmp_path / "installed"
    install.install(installed)
    body = build.INSTALLER_SCRIPT.read_text().replace("/opt/pdfleet-runtime/lib", str(installed / "lib"))
    (tmp_path / "dest").mkdir()
    for _ in range(2):  # a restarted init container runs it again
        result = subprocess.run(["sh", "-c", body, "sh", str(tmp_path / "dest")], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr

    def files(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}

    assert files(tmp_path / "dest") == files(installed)


def test_kopf_is_pinned_exactly_in_pyproject_and_the_lock() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert '"kopf==1.45.2"' in text
    lock = build.OPERATOR_LOCK.read_text().splitlines()
    pins = [line for line in lock if line and not line.startswith("#")]
    assert any(line.startswith("kopf==1.45.2 --hash=sha256:") for line in pins)
    assert all("==" in line and "--hash=sha256:" in line for line in pins), "every line exact and hashed"


def test_the_index_format_is_what_other_code_reads(tmp_path: Path) -> None:
    entry = {"reference": "r", "digest": "sha256:x"}
    (tmp_path / "index.json").write_text(json.dumps({"schemaVersion": 1, "images": {"pdfleet-operator": entry}}))
    assert json.loads((tmp_path / "index.json").read_text())["images"]["pdfleet-operator"]["reference"] == "r"
