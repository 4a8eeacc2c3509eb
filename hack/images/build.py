"""The three images and their layers, each layer cached under $PDFLEET_CACHE/images by a key of its inputs.

    layer            holds                                                     in
    debian-python    Debian 12 essential + python3, ca-certificates            operator, engine-cpu
    pdfleet          /opt/pdfleet: a venv with pdfleet[operator] from the lock  operator
    busybox          Debian's busybox-static and the applets the installer uses runtime
    pdfleet-runtime  /opt/pdfleet-runtime/lib + /usr/local/bin/pdfleet-install-runtime  runtime
    sglang           /opt/sglang: hack/install-sglang.sh's venv (CPU, CUDA stubs)  engine-cpu

A layer's key covers the source of the function that builds it, oci.py and debian.py, the key of the layer it
is built on, and its own inputs (package lists, lock files, the pdfleet files that go in). When every layer is
cached and the archive recorded in index.json is there, nothing is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from hack.images import debian, inputs, oci

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("PDFLEET_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
             / "pdfleet") / "images"
REGISTRY = os.environ.get("PDFLEET_IMAGE_REGISTRY", "ghcr.io/pdfleet")
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
OPERATOR_LOCK = ROOT / "requirements" / "operator.lock"
BUILD_LOCK = ROOT / "requirements" / "images-build.lock"  # pip itself, run from its wheel inside the build root
SGLANG_REQUIREMENTS = ROOT / "requirements" / "sglang-cpu.txt"
INSTALLER_SCRIPT = HERE / "pdfleet-install-runtime.sh"
# What `pip install .` builds pdfleet from (setup.py maps these folders into the pdfleet namespace).
PDFLEET_SOURCES = ("pyproject.toml", "setup.py", "README.md", "operator", "runtime", "kernels", "podrunner")
# libstdc++6: torch's, numpy's and most other native wheels of the engine image link it (found by running the
# image: `import numpy` failed without it). 2.6 MB in the operator image too, so that both share this layer.
BASE_PACKAGES = ("python3", "ca-certificates", "libstdc++6")
# The engine's build root also compiles the CUDA stubs (gcc, binutils) and makes a venv with pip (python3-venv);
# none of it reaches the image: only /opt/sglang does.
SGLANG_BUILD_PACKAGES = (*BASE_PACKAGES, "python3-venv", "gcc", "libc6-dev", "binutils")
BUSYBOX_APPLETS = ("sh", "cp", "mv", "rm", "mkdir", "echo", "ls", "cat", "env", "id", "true", "test", "[")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# gzip level per layer: on the SGLang layer level 1 compresses 1.5-3x faster than 6 for 5-10% more bytes (about
# 40 s of a cold build on 2 cores; docs/images.md has the numbers); small layers get 6.
GZIP_SMALL = 6
GZIP_LARGE = 1
LABELS = {"org.opencontainers.image.source": "https://github.com/pdfleet/pdfleet",
          "org.opencontainers.image.licenses": "Apache-2.0", "org.opencontainers.image.version": VERSION}


def say(message: str) -> None:
    print(f"images: {message}", flush=True)


@dataclasses.dataclass
class Built:
    """A layer in the blob store, with what its build recorded (Debian package versions)."""

    name: str
    key: str
    layer: oci.Layer
    extra: dict[str, Any]
    fresh: bool  # built in this run


class Builder:
    def __init__(self, cache: Path = CACHE) -> None:
        self.cache = cache
        self.blobs = cache / "blobs"
        self.records = cache / "layers"
        self.work = cache / "work"
        self.logs = cache / "logs"
        self.epoch = oci.epoch()
        self.layers: dict[str, Built] = {}
        self.timings: dict[str, float] = {}
        for d in (self.blobs, self.records, self.logs):
            d.mkdir(parents=True, exist_ok=True)

    # --- the cache -----------------------------------------------------------------------------------------

    def key(self, build: Callable[..., Any], *, parent: str | None = None, paths: Sequence[str] = (),
            values: Mapping[str, object] | None = None) -> str:
        return inputs.key(ROOT, ["hack/images/oci.py", "hack/images/debian.py", *paths], {
            "recipe": inspect.getsource(build), "parent": parent, "epoch": self.epoch, **(values or {})})

    def layer(self, name: str, key: str, build: Callable[[Path, Path], tuple[Path, Sequence[str], int,
                                                                                dict[str, Any]]]) -> Built:
        """The layer `name` of inputs `key`: from the cache, or built by `build(work, log)`, which returns the
        root to pack, the paths in it to pack, the gzip level and what to record."""
        record = self.records / f"{name}-{key[:24]}.json"
        if record.exists():
            data = json.loads(record.read_text())
            layer = oci.Layer.of(data["layer"])
            blob = oci.blob_path(self.blobs, layer.descriptor.digest)
            if blob.exists() and blob.stat().st_size == layer.descriptor.size:
                built = Built(name, key, layer, data["extra"], fresh=False)
                self.layers[name] = built
                return built
        start = time.monotonic()
        say(f"layer {name}: building (log: {self.logs / name}.log)")
        work = self.work / name
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        log = self.logs / f"{name}.log"
        log.write_text("")
        try:
            root, paths, level, extra = build(work, log)
            out = work / "layer.tar"
            layer = oci.write_layer(root, out, paths=paths, gzip_level=level, mtime=self.epoch)
            blob = oci.blob_path(self.blobs, layer.descriptor.digest)
            blob.parent.mkdir(parents=True, exist_ok=True)
            out.rename(blob)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        record.write_text(json.dumps({"name": name, "key": key, "layer": layer.json(), "extra": extra}, indent=1,
                                     sort_keys=True) + "\n")
        self.timings[name] = time.monotonic() - start
        say(f"layer {name}: {layer.descriptor.size / 1e6:.1f} MB ({layer.unpacked_size / 1e6:.1f} MB unpacked) "
            f"in {self.timings[name]:.0f} s")
        built = Built(name, key, layer, extra, fresh=True)
        self.layers[name] = built
        return built

    def unpack(self, built: Built, target: Path) -> Path:
        """A root filesystem from a cached layer (to build the next layer on)."""
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "-x", "--numeric-owner", "-p", "-f",
                        str(oci.blob_path(self.blobs, built.layer.descriptor.digest)), "-C", str(target)], check=True)
        return target

    # --- layers --------------------------------------------------------------------------------------------

    def base(self) -> Built:
        def build(work: Path, log: Path) -> tuple[Path, Sequence[str], int, dict[str, Any]]:
            root = work / "rootfs"
            debian.mmdebstrap(root, BASE_PACKAGES, log, epoch=self.epoch)
            debian.recompile(root, ["/usr/lib/python3.11", "/usr/lib/python3/dist-packages"], log)
            debian.clean(root)
            return root, ["."], GZIP_SMALL, {"debianPackages": debian.installed_packages(root)}

        key = self.key(build, values={"packages": BASE_PACKAGES, "sources": debian.SOURCES,
                                      "dpkg": debian.DPKG_OPTIONS})
        return self.layer("debian-python", key, build)

    def operator(self, base: Built) -> Built:
        def build(work: Path, log: Path) -> tuple[Path, Sequence[str], int, dict[str, Any]]:
            root = self.unpack(base, work / "rootfs")
            stage = work / "stage"
            wheels, pip_wheel = self.operator_wheels(log)
            stage.mkdir()
            wheel = build_pdfleet_wheel(stage, log)
            requirements = stage / "requirements.txt"
            requirements.write_text(OPERATOR_LOCK.read_text() + f"\npdfleet[operator] @ file:///tmp/build/stage/"
                                    f"{wheel.name} --hash=sha256:{sha256(wheel)}\n")
            binds = [(wheels, "/tmp/build/wheels"), (stage, "/tmp/build/stage"), (pip_wheel.parent, "/tmp/build/pip")]
            debian.chroot(root, ["/usr/bin/python3", "-m", "venv", "--without-pip", "/opt/pdfleet"], log,
                          what="python3 -m venv")
            debian.chroot(root, ["/opt/pdfleet/bin/python", f"/tmp/build/pip/{pip_wheel.name}/pip", "install",
                                 "--no-index", "--find-links", "/tmp/build/wheels", "--require-hashes",
                                 "--no-compile", "--no-cache-dir", "--disable-pip-version-check",
                                 "-r", "/tmp/build/stage/requirements.txt"], log, binds=binds,
                          what="pip install pdfleet[operator] from the lock")
            for name in ("activate", "activate.csh", "activate.fish", "Activate.ps1"):
                (root / "opt/pdfleet/bin" / name).unlink(missing_ok=True)
            debian.recompile(root, ["/opt/pdfleet"], log, python="/opt/pdfleet/bin/python")
            return root, ["opt/pdfleet"], GZIP_SMALL, {}

        key = self.key(build, parent=base.key, paths=[*PDFLEET_SOURCES, "requirements/operator.lock",
                                                       "requirements/images-build.lock"])
        return self.layer("pdfleet", key, build)

    def operator_wheels(self, log: Path) -> tuple[Path, Path]:
        """The locked wheels (and pip's own), downloaded with their hashes checked into a cache of their own."""
        wheels = self.cache / "wheels"
        tools = self.cache / "build-tools"
        for lock, target in ((OPERATOR_LOCK, wheels), (BUILD_LOCK, tools)):
            debian.run_logged([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--require-hashes", "--disable-pip-version-check", "-d", str(target), "-r", str(lock)],
                              log, env=without_pip_settings(), what=f"pip download -r {lock.name}")
        (pip_wheel,) = sorted(tools.glob("pip-*.whl"))
        return wheels, pip_wheel

    def busybox(self) -> Built:
        def build(work: Path, log: Path) -> tuple[Path, Sequence[str], int, dict[str, Any]]:
            extracted = work / "extracted"
            debian.mmdebstrap(extracted, ["busybox-static"], log, variant="extract", epoch=self.epoch)
            banner = subprocess.run([str(extracted / "bin/busybox")], capture_output=True, text=True).stdout
            version = banner.split("(Debian ", 1)[1].split(")", 1)[0]
            root = work / "rootfs"
            for d in ("bin", "etc", "tmp", "dev", "proc", "sys", "usr/local/bin", "usr/share/doc/busybox-static"):
                (root / d).mkdir(parents=True, exist_ok=True)
            (root / "tmp").chmod(0o1777)
            shutil.copy2(extracted / "bin/busybox", root / "bin/busybox")
            shutil.copy2(extracted / "usr/share/doc/busybox-static/copyright",
                         root / "usr/share/doc/busybox-static/copyright")
            for applet in BUSYBOX_APPLETS:
                (root / "bin" / applet).symlink_to("busybox")
            (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
            (root / "etc/group").write_text("root:x:0:\n")
            debian.add_user(root)
            return root, ["."], GZIP_SMALL, {"debianPackages": {"busybox-static": version}}

        key = self.key(build, values={"applets": BUSYBOX_APPLETS, "sources": debian.SOURCES})
        return self.layer("busybox", key, build)

    def runtime(self, busybox: Built) -> Built:
        def build(work: Path, log: Path) -> tuple[Path, Sequence[str], int, dict[str, Any]]:
            src = work / "src"
            for name in ("runtime", "kernels"):
                oci.copy_tree(ROOT / name, src / "pdfleet" / name)
            root = work / "rootfs"
            lib = root / "opt/pdfleet-runtime"
            env = {"PATH": os.environ.get("PATH", PATH), "PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": "1"}
            debian.run_logged([sys.executable, "-S", "-m", "pdfleet.runtime.install", str(lib)], log, env=env,
                              what="python -m pdfleet.runtime.install")
            debian.run_logged([sys.executable, "-S", "-m", "pdfleet.runtime.launcher", "patches"], log,
                              env={**env, "PYTHONPATH": str(lib / "lib")}, what="the installed launcher")
            if (lib / "lib/pdfleet/__init__.py").exists():
                raise debian.BuildError("the runtime's pdfleet must stay a namespace package")
            script = root / "usr/local/bin/pdfleet-install-runtime"
            script.parent.mkdir(parents=True)
            shutil.copyfile(INSTALLER_SCRIPT, script)
            script.chmod(0o755)
            for path in [root, *root.rglob("*")]:
                if not path.is_symlink():
                    path.chmod(0o755 if path.is_dir() or path == script else 0o644)
            return root, ["opt/pdfleet-runtime", "usr/local/bin/pdfleet-install-runtime"], GZIP_SMALL, {}

        key = self.key(build, parent=busybox.key,
                       paths=["runtime", "kernels", "hack/images/pdfleet-install-runtime.sh"])
        return self.layer("pdfleet-runtime", key, build)

    def sglang(self, base: Built) -> Built:
        def build(work: Path, log: Path) -> tuple[Path, Sequence[str], int, dict[str, Any]]:
            root = work / "rootfs"
            debian.mmdebstrap(root, SGLANG_BUILD_PACKAGES, log, epoch=self.epoch)
            if debian.installed_packages(root)["python3.11"] != base.extra["debianPackages"]["python3.11"]:
                raise debian.BuildError("the build root's python3.11 is not the base layer's: rebuild the base "
                                        f"(rm {self.records}/debian-python-*.json)")
            for name in ("hack/install-sglang.sh", "requirements/sglang-cpu.txt"):
                (root / "tmp/build" / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, root / "tmp/build" / name)
            pip_cache = self.cache / "pip-cache"
            pip_cache.mkdir(exist_ok=True)
            # The machine's own trust store (and PIP_CERT, where it names one): a network that inspects TLS
            # signs PyPI's certificate with a root Debian's bundle does not hold. Only the build root sees it.
            shutil.copyfile(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt",
                            root / "tmp/build/ca.crt")
            env = {"PIP_CACHE_DIR": "/tmp/pip-cache", "PIP_NO_COMPILE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                   "PIP_DEFAULT_TIMEOUT": "180", "PIP_CERT": "/tmp/build/ca.crt"}
            debian.chroot(root, ["/usr/bin/python3", "-m", "venv", "/opt/sglang"], log, what="python3 -m venv")
            debian.chroot(root, ["/bin/bash", "/tmp/build/hack/install-sglang.sh", "/opt/sglang/bin/python"], log,
                          env=env, binds=[(pip_cache, "/tmp/pip-cache")], network=True, what="hack/install-sglang.sh")
            debian.chroot(root, ["/opt/sglang/bin/python", "-m", "pip", "uninstall", "--quiet", "--yes", "pip"], log,
                          env=env, what="pip uninstall pip")
            for name in ("activate", "activate.csh", "activate.fish", "Activate.ps1"):
                (root / "opt/sglang/bin" / name).unlink(missing_ok=True)
            debian.recompile(root, ["/opt/sglang"], log, python="/opt/sglang/bin/python")
            return root, ["opt/sglang"], GZIP_LARGE, {"buildPackages": debian.installed_packages(root)}

        key = self.key(build, parent=base.key, paths=["hack/install-sglang.sh", "requirements/sglang-cpu.txt"],
                       values={"packages": SGLANG_BUILD_PACKAGES})
        return self.layer("sglang", key, build)


# --- images --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Image:
    name: str
    layers: Sequence[str]
    config: oci.ImageConfig

    @property
    def reference(self) -> str:
        return f"{REGISTRY}/{self.name}:{VERSION}"


def images() -> list[Image]:
    common = ("HOME=/tmp", "PYTHONUNBUFFERED=1")
    return [
        Image("pdfleet-operator", ("debian-python", "pdfleet"), oci.ImageConfig(
            env=(f"PATH=/opt/pdfleet/bin:{PATH}", *common, "PYTHONDONTWRITEBYTECODE=1"),
            entrypoint=("pdfleet-operator",), exposed_ports=(8080, 9090),
            labels={**LABELS, "org.opencontainers.image.title": "pdfleet-operator",
                    "org.opencontainers.image.description":
                        "Kubernetes operator for SGLang prefill/decode disaggregated fleets"})),
        Image("pdfleet-runtime", ("busybox", "pdfleet-runtime"), oci.ImageConfig(
            env=(f"PATH={PATH}",), entrypoint=("pdfleet-install-runtime",), cmd=("/opt/pdfleet",),
            labels={**LABELS, "org.opencontainers.image.title": "pdfleet-runtime",
                    "org.opencontainers.image.description":
                        "pdfleet's engine-pod runtime, copied into SGLang pods by an init container"})),
        Image("pdfleet-engine-cpu", ("debian-python", "sglang"), oci.ImageConfig(
            # Simulated engines and their router never need the Hugging Face hub, and must not try: with a hub id
            # as the model, the engine's /generate waited on the hub's retries (a real container on the local
            # cluster's real node, which has no route out) and the router's requests with it.
            env=(f"PATH=/opt/sglang/bin:{PATH}", *common, "PDFLEET_ENGINE_MODE=simulate", "HF_HUB_OFFLINE=1"),
            cmd=("python3",),
            labels={**LABELS, "org.opencontainers.image.title": "pdfleet-engine-cpu",
                    "org.opencontainers.image.description":
                        "SGLang (CPU install, CUDA stubs) for local use: pdfleet's engine simulator and the router"})),
    ]


def image_config(image: Image, layers: Sequence[Built]) -> dict[str, Any]:
    packages: dict[str, str] = {}
    for built in layers:
        packages.update(built.extra.get("debianPackages", {}))
    labels = {**image.config.labels,
              "dev.pdfleet.debian-packages": " ".join(f"{n}={v}" for n, v in sorted(packages.items()))}
    config = dataclasses.replace(image.config, labels=labels)
    return oci.config_document(config, [b.layer for b in layers], [f"pdfleet hack/images: layer {b.name}"
                                                                    for b in layers])


@contextlib.contextmanager
def locked(cache: Path) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def build(names: Sequence[str] = (), cache: Path = CACHE) -> dict[str, Any]:
    """Build (or find cached) the images named (all by default); write and return the index."""
    wanted = [i for i in images() if not names or i.name in names]
    unknown = set(names) - {i.name for i in images()}
    if unknown:
        raise SystemExit(f"images: no image named {', '.join(sorted(unknown))}")
    start = time.monotonic()
    with locked(cache):
        builder = Builder(cache)
        needs = {n for i in wanted for n in i.layers}
        recipes: dict[str, Callable[[], Built]] = {
            "debian-python": builder.base,
            "pdfleet": lambda: builder.operator(builder.layers["debian-python"]),
            "busybox": builder.busybox,
            "pdfleet-runtime": lambda: builder.runtime(builder.layers["busybox"]),
            "sglang": lambda: builder.sglang(builder.layers["debian-python"]),
        }
        for name in ("debian-python", "busybox", "pdfleet", "pdfleet-runtime", "sglang"):
            if name in needs:
                recipes[name]()
        index_path = cache / "index.json"
        index = json.loads(index_path.read_text()) if index_path.exists() else {"schemaVersion": 1, "images": {}}
        for image in wanted:
            layers = [builder.layers[n] for n in image.layers]
            entry = write_image(builder, image, layers, index["images"].get(image.name))
            index["images"][image.name] = entry
        index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    fresh = [n for n, b in builder.layers.items() if b.fresh]
    archives = [i.name for i in wanted if index["images"][i.name].pop("_written", False)]
    if not fresh and not archives:
        say(f"all {len(wanted)} images cached: nothing built ({time.monotonic() - start:.1f} s)")
    else:
        say(f"built layers {', '.join(fresh) or '(none)'} and archives {', '.join(archives) or '(none)'} "
            f"in {time.monotonic() - start:.0f} s")
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    print_table(index, [i.name for i in wanted])
    return index


def write_image(builder: Builder, image: Image, layers: Sequence[Built], previous: Mapping[str, Any] | None
                ) -> dict[str, Any]:
    config = image_config(image, layers)
    config_bytes = oci.canonical(config)
    config_desc = oci.Descriptor(oci.CONFIG, "sha256:" + inputs.hashlib.sha256(config_bytes).hexdigest(),
                                 len(config_bytes))
    manifest_bytes = oci.canonical(oci.manifest_document(config_desc, [b.layer for b in layers]))
    digest = "sha256:" + inputs.hashlib.sha256(manifest_bytes).hexdigest()
    archive = builder.cache / f"{image.name}.oci.tar"
    written = False
    if not (previous and previous.get("digest") == digest and previous.get("reference") == image.reference
            and archive.exists() and archive.stat().st_size == previous.get("archiveSize")):
        say(f"{image.name}: writing {archive}")
        manifest = oci.write_archive(archive, builder.blobs, image.reference, config, [b.layer for b in layers],
                                     mtime=builder.epoch)
        assert manifest.digest == digest
        written = True
    packages: dict[str, str] = {}
    for built in layers:
        packages.update(built.extra.get("debianPackages", {}))
    return {
        "reference": image.reference,
        "digest": digest,
        "archive": str(archive),
        "archiveSize": archive.stat().st_size,
        "size": sum(b.layer.descriptor.size for b in layers) + len(config_bytes) + len(manifest_bytes),
        "unpackedSize": sum(b.layer.unpacked_size for b in layers),
        "layers": [{"name": b.name, "key": b.key, **b.layer.json()} for b in layers],
        "debianPackages": packages,
        "user": image.config.user,
        "_written": written,
    }


def print_table(index: Mapping[str, Any], names: Sequence[str]) -> None:
    print(f"{'IMAGE':<20} {'REFERENCE':<44} {'DIGEST':<20} {'SIZE':>10} {'UNPACKED':>10}")
    for name in names:
        e = index["images"][name]
        print(f"{name:<20} {e['reference']:<44} {e['digest'][:19]:<20} {e['size'] / 1e6:>7.1f} MB "
              f"{e['unpackedSize'] / 1e6:>7.1f} MB")
    print(f"index: {CACHE / 'index.json'}  (full digests there; archives: {CACHE}/<image>.oci.tar)")


# --- pdfleet's wheel, and the lock -------------------------------------------------------------------------

def sha256(path: Path) -> str:
    return inputs.hashlib.sha256(path.read_bytes()).hexdigest()


def without_pip_settings() -> dict[str, str]:
    """The environment less the machine's own pip settings (a find-links folder would bypass the lock)."""
    return {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_INDEX_URL",
                                                             "PIP_EXTRA_INDEX_URL", "PIP_REQUIRE_VIRTUALENV")}


def pdfleet_source(target: Path) -> Path:
    """A copy of just the files pdfleet is built from (the checkout holds others' work and build leftovers)."""
    target.mkdir(parents=True)
    for name in PDFLEET_SOURCES:
        source = ROOT / name
        if source.is_dir():
            oci.copy_tree(source, target / name, ignore=("__pycache__", "*.pyc", "*.pyo", "*.egg-info"))
        else:
            shutil.copy2(source, target / name)
    return target


def build_pdfleet_wheel(out: Path, log: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        src = pdfleet_source(Path(tmp) / "src")
        debian.run_logged([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-cache-dir",
                           "--disable-pip-version-check", "-w", str(out), str(src)], log,
                          env={**without_pip_settings(), "SOURCE_DATE_EPOCH": str(oci.epoch())},
                          what="pip wheel pdfleet")
    (wheel,) = out.glob("pdfleet-*.whl")
    return wheel


def lock() -> None:
    """Write requirements/operator.lock: every distribution `pdfleet[operator]` needs, at an exact version, with
    the sha256 of the wheel pip chose for Linux x86_64, CPython 3.11 (this machine; the image's platform)."""
    if sys.version_info[:2] != (3, 11):
        raise SystemExit("images lock: run with Python 3.11, the image's Python")
    with tempfile.TemporaryDirectory() as tmp:
        src = pdfleet_source(Path(tmp) / "src")
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                        "--only-binary=:all:", "--no-binary=pdfleet", "--disable-pip-version-check",
                        "--report", str(report), f"{src}[operator]"], check=True, env=without_pip_settings())
        installs = json.loads(report.read_text())["install"]
    lines = ["# pdfleet[operator]'s dependencies for the operator image (hack/images), exact versions and hashes.",
             "# Generated by `python -m hack.images lock` (CPython 3.11, Linux x86_64): do not edit by hand.", ""]
    for item in sorted(installs, key=lambda i: i["metadata"]["name"].lower()):
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if name == "pdfleet":
            continue
        digest = item["download_info"]["archive_info"]["hashes"]["sha256"]
        lines.append(f"{name.lower()}=={version} --hash=sha256:{digest}")
    OPERATOR_LOCK.write_text("\n".join(lines) + "\n")
    say(f"wrote {OPERATOR_LOCK.relative_to(ROOT)} ({len(lines) - 3} distributions)")
