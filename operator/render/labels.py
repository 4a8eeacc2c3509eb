"""Labels and annotations pdfleet puts on every object it manages: the standard `app.kubernetes.io/*` set
plus pdfleet's own, which the operator selects on and people read for provenance."""

from __future__ import annotations

import hashlib

PREFIX = "pdfleet.dev"
POOL = f"{PREFIX}/pool"
ROLE = f"{PREFIX}/role"
GROUP = f"{PREFIX}/group"
RANK = f"{PREFIX}/node-rank"
REVISION = f"{PREFIX}/revision"
KV_LAYOUT = f"{PREFIX}/kv-layout"  # engines with different values must never serve one router together
COMPONENT = "app.kubernetes.io/component"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "pdfleet"

PATCH_PREFIX = f"patch.{PREFIX}/"  # one label per applied patch: `kubectl get pods -l patch.pdfleet.dev/<id>`
IMAGE_HASH = f"{PREFIX}/image-hash"  # image references are not valid label values; their hash is

# Annotations
APPLIED_HASH = f"{PREFIX}/applied-hash"  # hash of the desired object last applied; equal hash -> no write
PATCHES = f"{PREFIX}/patches"  # comma-separated patch ids (label values cannot hold the list)
IMAGE = f"{PREFIX}/image"


def common(pool: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "sglang",
        "app.kubernetes.io/instance": pool,
        COMPONENT: component,
        "app.kubernetes.io/part-of": "pdfleet",
        MANAGED_BY: MANAGER,
        POOL: pool,
    }


def provenance(patches: list[str], image: str) -> dict[str, str]:
    """Labels that say what an engine runs, selectable by label (the full image is in an annotation)."""
    return {**{f"{PATCH_PREFIX}{p}": "true" for p in patches},
            IMAGE_HASH: hashlib.sha256(image.encode()).hexdigest()[:16]}


def selector(pool: str, **extra: str) -> dict[str, str]:
    """The labels that select a pool's objects (stable across revisions, unlike the full set)."""
    return {MANAGED_BY: MANAGER, POOL: pool, **extra}
