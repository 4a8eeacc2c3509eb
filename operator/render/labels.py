"""Labels and annotations pdfleet puts on every object it manages: the standard `app.kubernetes.io/*` set
plus pdfleet's own, which the operator selects on and people read for provenance."""

from __future__ import annotations

PREFIX = "pdfleet.dev"
POOL = f"{PREFIX}/pool"
ROLE = f"{PREFIX}/role"
GROUP = f"{PREFIX}/group"
RANK = f"{PREFIX}/node-rank"
REVISION = f"{PREFIX}/revision"
COMPONENT = "app.kubernetes.io/component"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "pdfleet"

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


def selector(pool: str, **extra: str) -> dict[str, str]:
    """The labels that select a pool's objects (stable across revisions, unlike the full set)."""
    return {MANAGED_BY: MANAGER, POOL: pool, **extra}
