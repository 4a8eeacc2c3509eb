"""The securityContexts of the pods the operator renders, and the Pod Security level each meets (docs/security.md).

- The router pod meets `restricted`: it runs as a non-root user (65532, whatever its image's user), with the
  runtime's default seccomp profile, no privilege escalation, no capabilities, a read-only root filesystem.
- Engine pods meet `baseline`, and carry what `restricted` asks that their function allows: the runtime's default
  seccomp profile, no privilege escalation, every capability dropped. They run as their image's user (root for
  SGLang's images) unless the pool names one (`spec.engine.runAsUser`, for an image that works so), and then meet
  `restricted`. Two things a pool may ask for take an engine pod out of `baseline`: RDMA (`spec.transfer.ibDevice`
  with mooncake or nixl) adds IPC_LOCK, which memory registration needs to pin pages and `baseline` does not
  allow; a `hostPath` model source mounts a host directory, which `baseline` forbids (and the pool policy allows
  only where the cluster admin says: api/pool_policy.py). Such a pool needs a namespace that admits `privileged`.
- The runtime init container of an engine pod runs with its root filesystem read-only as well.

Checked against the real apiserver's Pod Security admission in tests/integration/test_pod_security_e2e.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Body = dict[str, Any]

RUNTIME_DEFAULT = {"type": "RuntimeDefault"}
# The router's user and group: not root, and no user a node already has (distroless' `nonroot`, the operator's).
NON_ROOT = 65532


def engine_pod(user: int | None = None, group: int | None = None) -> Body:
    """The engine pod's securityContext: the runtime's default seccomp profile, and with `user` (the pool's
    spec.engine.runAsUser) that user, never root."""
    context: Body = {"seccompProfile": dict(RUNTIME_DEFAULT)}
    if user is not None:
        context.update(runAsNonRoot=True, runAsUser=user)
        if group is not None:
            context["runAsGroup"] = group
    return context


def router_pod() -> Body:
    """The router pod's securityContext: not root, the runtime's default seccomp profile."""
    return {"runAsNonRoot": True, "runAsUser": NON_ROOT, "runAsGroup": NON_ROOT,
            "seccompProfile": dict(RUNTIME_DEFAULT)}


def container(*, add: Iterable[str] = (), read_only_root: bool = False) -> Body:
    """A container's securityContext: no privilege escalation, every capability dropped but `add`."""
    capabilities: Body = {"drop": ["ALL"]}
    if added := sorted(set(add)):
        capabilities["add"] = added
    context: Body = {"allowPrivilegeEscalation": False, "capabilities": capabilities}
    if read_only_root:
        context["readOnlyRootFilesystem"] = True
    return context
