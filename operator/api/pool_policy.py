"""The pool policy: what a pool may ask for that reaches past its own namespace, decided by the cluster admin.

Whoever may write an InferencePool makes the operator create pods. Four fields of a pool would otherwise hand
that person the node: a `hostPath` model source (a read-only mount of `/run/containerd` still lets a process
`connect()` to the container runtime; `/var/lib/kubelet` holds other pods' Secrets), a priority class (a
`system-node-critical` engine preempts the node's own daemons), a toleration (onto control-plane or reserved
nodes; no key at all tolerates every taint) and the image (what runs). The admin, not the pool, says what is
allowed: the chart's `poolPolicy` values, which become the operator's `--allow-*` flags and a
ValidatingAdmissionPolicy that refuses at admission (`admission_policy`). The defaults allow no host path, no
priority class and no toleration beyond the GPU taint every engine already tolerates, and any image; engines may
run as their image's user (root for SGLang's) unless the policy requires a non-root one.

Lists of allowed values, each entry exact or a prefix as its field says; `*` alone allows anything. The
operator checks the same rules on every reconcile, so a pool admitted before the policy was tightened (or on a
cluster without admission policies) is refused there: `Accepted=False`, reason `ForbiddenByPolicy`, one Warning,
and nothing of it is created or changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from pdfleet.operator.api.checks import Problem
from pdfleet.operator.api.role_name import Role
from pdfleet.operator.api.scheduling import Scheduling, Toleration
from pdfleet.operator.api.spec import InferencePoolSpec

ANY = "*"
# Engines ask for GPUs and tolerate the taint clusters commonly put on GPU nodes (render/engine_group.py adds
# it); a pool that writes it itself asks for nothing more.
GPU_TAINT_KEYS = ("nvidia.com/gpu",)


@dataclasses.dataclass(frozen=True)
class PoolPolicy:
    """What pools may ask for. Each tuple lists what is allowed; `*` in it allows anything."""

    # Folders on the node a model may be mounted from: an entry allows itself and everything below it.
    host_path_prefixes: tuple[str, ...] = ()
    # PriorityClass names engine and router pods may use.
    priority_classes: tuple[str, ...] = ()
    # Taint keys pods may tolerate besides GPU_TAINT_KEYS.
    toleration_keys: tuple[str, ...] = ()
    # Images: an entry ending in `/` allows every image under it (a registry, a project); any other entry is
    # one repository, with any tag or digest.
    image_prefixes: tuple[str, ...] = (ANY,)
    # Engines must run as a user the pool names (spec.engine.runAsUser), never as their image's (root for SGLang's).
    require_non_root_engines: bool = False


# Where each list comes from, for messages that tell the reader what to change.
SOURCES = {
    "host_path_prefixes": ("hostPathPrefixes", "--allow-host-path-prefix"),
    "priority_classes": ("priorityClasses", "--allow-priority-class"),
    "toleration_keys": ("tolerationKeys", "--allow-toleration-key"),
    "image_prefixes": ("imagePrefixes", "--allow-image-prefix"),
}


def prefix_problem(flag: str, value: str) -> str | None:
    """What is wrong with one allowed entry given to `flag` (None when nothing is): host folders are absolute,
    without `..`; image entries are one word; `*` is always valid."""
    if value == ANY:
        return None
    if flag == SOURCES["host_path_prefixes"][1] and (not value.startswith("/") or ".." in value.split("/")):
        return f"{flag}: {value!r} is not an absolute folder without '..' (or '*')"
    if not value or any(c.isspace() for c in value):
        return f"{flag}: {value!r} is empty or has white space"
    return None


def host_path_allowed(path: str, prefixes: Sequence[str]) -> bool:
    """`path` is one of `prefixes` or lies below one (by whole path components: /models does not allow
    /models-secret). Paths are compared as written: the API refuses `..` components in a hostPath."""
    for prefix in prefixes:
        if prefix == ANY or path == prefix:
            return True
        under = prefix if prefix.endswith("/") else prefix + "/"
        if path.startswith(under):
            return True
    return False


def image_allowed(image: str, prefixes: Sequence[str]) -> bool:
    """`image` lies under an entry ending in `/`, or is the repository an entry names, with any tag or digest."""
    for prefix in prefixes:
        if prefix == ANY:
            return True
        if prefix.endswith("/"):
            if image.startswith(prefix):
                return True
        elif image == prefix or image.startswith((prefix + ":", prefix + "@")):
            return True
    return False


def toleration_allowed(toleration: Toleration, keys: Sequence[str]) -> bool:
    """A toleration of one of `keys` or of the GPU taint; one without a key (every taint) only under `*`."""
    if ANY in keys:
        return True
    return bool(toleration.key) and (toleration.key in GPU_TAINT_KEYS or toleration.key in keys)


def allowed_text(field: str, listed: str) -> str:
    """Names the list that decides, what it holds (`listed`) and where the admin changes it."""
    value_name, flag = SOURCES[field]
    return f"the pool policy's {value_name} ({listed}; chart value poolPolicy.{value_name}, operator flag {flag})"


def listed(values: Sequence[str]) -> str:
    return ", ".join(values) if values else "none"


# The messages, shared with the admission policy's CEL (admission_policy.py), which fills the same blanks.
def host_path_message(path: str, allowed: str) -> str:
    return (f"{path} is not a host folder {allowed} allows: a hostPath mount reaches the node itself. Load the "
            "model from a PVC, the image or a download, or ask the cluster admin to allow the folder")


def image_message(image: str, allowed: str) -> str:
    return f"{image} is not an image {allowed} allows"


def priority_class_message(name: str, allowed: str) -> str:
    return (f"{name} is not a priority class {allowed} allows: a priority class decides which pods the scheduler "
            "evicts to make room")


def toleration_message(what: str, allowed: str) -> str:
    return (f"tolerating {what} is not allowed by {allowed}: a toleration lets pods onto nodes kept for something "
            "else")


EVERY_TAINT = "every taint (it has no key)"
NON_ROOT_MESSAGE = (
    "unset, so the engines would run as their image's user (root for SGLang's images), and the pool policy's "
    "requireNonRootEngines (chart value poolPolicy.requireNonRootEngines, operator flag --require-non-root-engines) "
    "asks for a user of the pool's: set a non-root user the image works with")


def problems(spec: InferencePoolSpec, policy: PoolPolicy) -> list[Problem]:
    """Everything `spec` asks for that `policy` does not allow, each at its field; [] when the pool may run."""
    return list(_problems(spec, policy))


def _problems(spec: InferencePoolSpec, policy: PoolPolicy) -> Iterator[Problem]:
    def allowed(field: str) -> str:
        return allowed_text(field, listed(getattr(policy, field)))

    host_path = spec.model.source.host_path
    if host_path is not None and not host_path_allowed(host_path.path, policy.host_path_prefixes):
        yield Problem("spec.model.source.hostPath.path",
                      host_path_message(host_path.path, allowed("host_path_prefixes")))
    if policy.require_non_root_engines and spec.engine.run_as_user is None:
        yield Problem("spec.engine.runAsUser", NON_ROOT_MESSAGE)
    for path, image in image_fields(spec):
        if not image_allowed(image, policy.image_prefixes):
            yield Problem(path, image_message(image, allowed("image_prefixes")))
    for path, scheduling in scheduling_fields(spec):
        name = scheduling.priority_class_name
        if name and not (ANY in policy.priority_classes or name in policy.priority_classes):
            yield Problem(f"{path}.priorityClassName", priority_class_message(name, allowed("priority_classes")))
        for index, toleration in enumerate(scheduling.tolerations):
            if not toleration_allowed(toleration, policy.toleration_keys):
                what = f"taint key {toleration.key}" if toleration.key else EVERY_TAINT
                yield Problem(f"{path}.tolerations[{index}]", toleration_message(what, allowed("toleration_keys")))


def image_fields(spec: InferencePoolSpec) -> list[tuple[str, str]]:
    images = [("spec.engine.image", spec.engine.image)]
    if spec.router.image is not None:
        images.append(("spec.router.image", spec.router.image))
    return images


SCHEDULING_PATHS = (*(f"spec.{role}.scheduling" for role in Role), "spec.router.scheduling")


def scheduling_fields(spec: InferencePoolSpec) -> list[tuple[str, Scheduling]]:
    return list(zip(SCHEDULING_PATHS, (*(spec.role(role).scheduling for role in Role), spec.router.scheduling),
                    strict=True))
