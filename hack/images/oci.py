"""OCI image pieces written directly, without a daemon: layer tarballs, blobs, config, manifest, and the
oci-archive (a tar of an OCI image layout) that `skopeo copy oci-archive:...` and `ctr images import` read.

Everything here is deterministic: tar entries sorted, every mtime the same (SOURCE_DATE_EPOCH), owners by
number only, gzip without a timestamp or name, JSON with sorted keys. Same input tree, same digest.
"""

from __future__ import annotations

import dataclasses
import datetime
import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"  # what `ctr images import` names the image by
# 2025-01-01T00:00:00Z: every file's mtime and the config's `created`, unless SOURCE_DATE_EPOCH says otherwise.
DEFAULT_EPOCH = 1735689600
# Inside a layer, these directories are kept but never their contents (the runtime mounts them).
EMPTIED = ("dev", "proc", "sys", "run", "tmp")
_CHUNK = 1 << 20


def epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))


def iso(seconds: int) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def canonical(value: Any) -> bytes:
    """The bytes a JSON document is stored as: sorted keys, no spaces, so equal documents hash equal."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


@dataclasses.dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str  # sha256:<hex>
    size: int

    def json(self, **extra: Any) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size, **extra}


@dataclasses.dataclass(frozen=True)
class Layer:
    descriptor: Descriptor
    diff_id: str  # sha256 of the uncompressed tar: what the config's rootfs lists
    unpacked_size: int

    def json(self) -> dict[str, Any]:
        return {**self.descriptor.json(), "diffId": self.diff_id, "unpackedSize": self.unpacked_size}

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Layer:
        return cls(Descriptor(data["mediaType"], data["digest"], data["size"]), data["diffId"], data["unpackedSize"])


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to `sink`."""

    def __init__(self, sink: IO[bytes]) -> None:
        self.sink = sink
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.size += len(view)
        self.sink.write(view)
        return len(view)

    @property
    def digest(self) -> str:
        return "sha256:" + self.sha.hexdigest()


def walk(root: Path, paths: Sequence[str] = (".",)) -> Iterator[tuple[str, Path]]:
    """(name in the layer, file) for everything under root/paths, sorted, parents first; the parents of each
    path are included so that the layer can be applied on its own. EMPTIED directories keep only themselves."""
    seen: set[str] = set()
    for top in sorted(paths):
        parts = Path(top).parts if top != "." else ()
        for i in range(1, len(parts)):
            name = "/".join(parts[:i])
            if name not in seen:
                seen.add(name)
                yield name, root / name
        yield from _walk(root, "/".join(parts), seen)


def _walk(root: Path, name: str, seen: set[str]) -> Iterator[tuple[str, Path]]:
    path = root / name if name else root
    if name and name not in seen:
        seen.add(name)
        yield name, path
    if path.is_dir() and not path.is_symlink() and name not in EMPTIED:
        for child in sorted(os.listdir(path)):
            yield from _walk(root, f"{name}/{child}" if name else child, seen)


def write_layer(root: Path, out: Path, *, paths: Sequence[str] = (".",), gzip_level: int | None = 6,
                mtime: int | None = None) -> Layer:
    """Write root's `paths` as one layer tarball at `out`; gzip_level None writes it uncompressed."""
    mtime = epoch() if mtime is None else mtime
    with out.open("wb") as raw:
        blob = _Hashing(raw)
        zipped = gzip.GzipFile(fileobj=blob, mode="wb", compresslevel=gzip_level, mtime=0, filename="") \
            if gzip_level is not None else None
        tar_stream = _Hashing(zipped if zipped is not None else blob)  # type: ignore[arg-type]
        with tarfile.open(fileobj=tar_stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            links: dict[tuple[int, int], str] = {}
            for name, path in walk(root, paths):
                _add(tar, name, path, mtime, links)
        if zipped is not None:
            zipped.close()
    media = LAYER_GZIP if gzip_level is not None else LAYER_TAR
    return Layer(Descriptor(media, blob.digest, blob.size), tar_stream.digest, tar_stream.size)


def _add(tar: tarfile.TarFile, name: str, path: Path, mtime: int, links: dict[tuple[int, int], str]) -> None:
    st = path.lstat()
    info = tarfile.TarInfo(name)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.uname = info.gname = ""
    info.mtime = mtime
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in links:
            info.type, info.linkname = tarfile.LNKTYPE, links[key]
        else:
            links[key] = name
            info.size = st.st_size
            with path.open("rb") as f:
                tar.addfile(info, f)
            return
    else:
        return  # devices, fifos, sockets: never part of an image
    tar.addfile(info)


def store_blob(blobs: Path, data: bytes, media_type: str) -> Descriptor:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    target = blobs / "sha256" / digest.split(":", 1)[1]
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.rename(target)
    return Descriptor(media_type, digest, len(data))


def blob_path(blobs: Path, digest: str) -> Path:
    return blobs / "sha256" / digest.split(":", 1)[1]


@dataclasses.dataclass(frozen=True)
class ImageConfig:
    """The parts of an image's config a recipe sets (the OCI config's `config` object)."""

    user: str = "65532:65532"
    env: Sequence[str] = ()
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    working_dir: str = "/"
    exposed_ports: Sequence[int] = ()
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"User": self.user, "Env": list(self.env), "WorkingDir": self.working_dir,
                                "Labels": dict(self.labels)}
        if self.entrypoint:
            body["Entrypoint"] = list(self.entrypoint)
        if self.cmd:
            body["Cmd"] = list(self.cmd)
        if self.exposed_ports:
            body["ExposedPorts"] = {f"{p}/tcp": {} for p in self.exposed_ports}
        return body


def config_document(config: ImageConfig, layers: Sequence[Layer], history: Sequence[str],
                    created: int | None = None) -> dict[str, Any]:
    when = iso(epoch() if created is None else created)
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": when,
        "config": config.json(),
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": when, "created_by": step} for step in history],
    }


def manifest_document(config: Descriptor, layers: Sequence[Layer]) -> dict[str, Any]:
    return {"schemaVersion": 2, "mediaType": MANIFEST, "config": config.json(),
            "layers": [layer.descriptor.json() for layer in layers]}


def index_document(manifest: Descriptor, reference: str) -> dict[str, Any]:
    tag = reference.rsplit(":", 1)[1] if ":" in reference.rsplit("/", 1)[-1] else "latest"
    return {"schemaVersion": 2, "mediaType": INDEX,
            "manifests": [manifest.json(annotations={REF_NAME: tag, CONTAINERD_NAME: reference})]}


def write_archive(out: Path, blobs: Path, reference: str, config: dict[str, Any], layers: Sequence[Layer],
                  mtime: int | None = None) -> Descriptor:
    """Write the oci-archive: an OCI image layout (oci-layout, index.json, blobs/sha256/...) as one tar, its
    entries sorted. Config and manifest are stored in `blobs` too; the layers must already be there. Returns
    the manifest's descriptor (its digest is the image's)."""
    mtime = epoch() if mtime is None else mtime
    config_desc = store_blob(blobs, canonical(config), CONFIG)
    manifest = manifest_document(config_desc, layers)
    manifest_desc = store_blob(blobs, canonical(manifest), MANIFEST)
    entries: list[tuple[str, Path | bytes]] = [
        ("blobs", b""), ("blobs/sha256", b""),
        ("index.json", canonical(index_document(manifest_desc, reference))),
        ("oci-layout", canonical({"imageLayoutVersion": "1.0.0"})),
    ]
    digests = sorted({config_desc.digest, manifest_desc.digest, *(la.descriptor.digest for la in layers)})
    entries += [(f"blobs/sha256/{d.split(':', 1)[1]}", blob_path(blobs, d)) for d in digests]
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in sorted(entries):
            info = tarfile.TarInfo(name)
            info.mtime, info.uname, info.gname = mtime, "", ""
            if content == b"" and not name.endswith((".json", "layout")):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(content, bytes):
                info.mode, info.size = 0o644, len(content)
                tar.addfile(info, io.BytesIO(content))
            else:
                info.mode, info.size = 0o644, content.stat().st_size
                with content.open("rb") as f:
                    tar.addfile(info, f)
    tmp.rename(out)
    return manifest_desc


def read_archive(archive: Path) -> dict[str, Any]:
    """The index, manifest and config of an oci-archive, checking every blob's digest and size against its
    descriptor (what a registry or containerd would refuse)."""
    with tarfile.open(archive) as tar:
        def read(name: str) -> bytes:
            member = tar.extractfile(name)
            if member is None:
                raise ValueError(f"{archive}: {name} is not a file")
            return member.read()

        def blob(desc: Mapping[str, Any]) -> bytes:
            data = read("blobs/sha256/" + desc["digest"].split(":", 1)[1])
            if "sha256:" + hashlib.sha256(data).hexdigest() != desc["digest"] or len(data) != desc["size"]:
                raise ValueError(f"{archive}: blob {desc['digest']} does not match its descriptor")
            return data

        layout = json.loads(read("oci-layout"))
        index = json.loads(read("index.json"))
        (entry,) = index["manifests"]
        manifest = json.loads(blob(entry))
        config = json.loads(blob(manifest["config"]))
        for layer in manifest["layers"]:
            member = tar.getmember("blobs/sha256/" + layer["digest"].split(":", 1)[1])
            if member.size != layer["size"]:
                raise ValueError(f"{archive}: layer {layer['digest']} has {member.size} bytes, not {layer['size']}")
    return {"layout": layout, "index": index, "manifest": manifest, "config": config}


def copy_tree(source: Path, target: Path, ignore: Iterable[str] = ("__pycache__", "*.pyc", "*.pyo")) -> None:
    shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns(*ignore))
