"""A fix to kopf (1.45) the operator installs before kopf starts: a watch ended before the operator's first
indexing finished must not keep that indexing from ever finishing.

Until every watched kind's first listing, and every object seen in it, is indexed, kopf runs no handler: each
listing and each object holds a toggle of `operator_indexed`, dropped once listed or processed. A watch ended
early (its namespace deleted while the operator starts: a glob such as `--namespace team-*` that matched a
namespace being deleted) is cancelled with its object workers, and kopf drops neither toggle, so the operator
waits forever, handling nothing, while it looks alive. Seen in this repository's tests: an operator started
3 s before the previous test's namespace was gone never reconciled a pool in 6 minutes (docs/architecture.md).
Here each watcher and worker drops its toggle when it ends, whatever ended it: an object of a namespace that is
gone has nothing left to index.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from kopf._core.reactor import queueing

_INSTALLED = "_pdfleet_drops_its_toggle"


def _dropping(run: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    @functools.wraps(run)
    async def wrapped(*args: Any, **kwargs: Any) -> None:
        try:
            await run(*args, **kwargs)
        finally:
            indexed, toggle = kwargs.get("operator_indexed"), kwargs.get("resource_indexed")
            if indexed is not None and toggle is not None:
                # Shielded: a second cancellation must not leave the toggle behind either.
                await asyncio.shield(asyncio.ensure_future(indexed.drop_toggle(toggle)))

    setattr(wrapped, _INSTALLED, True)
    return wrapped


def install() -> None:
    """Wraps kopf's watcher and per-object worker (both looked up by name when they are started); idempotent."""
    for name in ("watcher", "worker"):
        run = getattr(queueing, name)
        if not getattr(run, _INSTALLED, False):
            setattr(queueing, name, _dropping(run))
