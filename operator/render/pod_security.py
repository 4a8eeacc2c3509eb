"""The securityContexts of the pods the operator renders, and the Pod Security level each meets (docs/security.md).

- The router pod meets `restricted`: it runs as a non-root user (65532, whatever its image's user), with the
  runtime's default seccomp profile, no privilege escalation, no capabilities, a read-only root filesystem.
- Engine pods meet `baseline`, and carry what `restricted` asks that their function allows: the runtime's default
  seccomp profile, no privilege escalation, every capability dropped. They run as their image's user: SGLang's
  images run as root, and the engine needs the GPU devices and the IPC of its ranks. Two things a pool may ask
  for take an engine pod out of `baseline`: RDMA (`spec.transfer.ibDevice` with mooncake or nixl) adds IPC_LOCK,
  which memory registration needs to pin pages and `baseline` does not allow; a `hostPath` model source mounts a
  host directory, which `baseline` forbids. Such a pool needs a namespace that admits `privileged` (the security
  issue decides what a pool author may ask for).
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


def engine_pod() -> Body:
    """The engine pod's securityContext: the runtime's default seccomp profile."""
    return {"seccompProfile": dict(RUNTIME_DEFAULT)}


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
