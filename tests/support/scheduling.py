"""How `make test` spreads the suite over pytest-xdist workers (`-n N --dist loadscope`, tests/conftest.py).

A unit of work runs whole, in order, in one worker. The cluster tier (tests/integration/) makes two:
- the modules on the shared operator (the module-scoped `operator` fixture, with the chart's `pdfleet` release it
  runs under): one at a time, since each module's operator would otherwise reconcile the next one's pools; that
  operator watches only the namespaces these tests get (`SHARED_OPERATOR_NAMESPACES`);
- every other cluster module (the demo, the pod runner, the CRD, the cluster itself), each with operators of its
  own scoped to its own namespaces, if any.
Any other module is a unit of its own, so its module-scoped fixtures are set up once.

A test marked `disruptive` (it restarts a part of the shared cluster) runs last in its unit and alone on the
cluster (tests/support/cluster_share.py).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_TIER = "tests/integration/"
SHARED_OPERATOR_UNIT = "tests/integration/ (shared operator)"
OWN_CLUSTER_UNIT = "tests/integration/ (own operators)"
SHARED_OPERATOR_FIXTURES = ("operator", "chart")
# A test on the shared operator gets a namespace of this prefix; any other test's namespace falls outside it.
SHARED_OPERATOR_PREFIX = "top-"
SHARED_OPERATOR_NAMESPACES = f"{SHARED_OPERATOR_PREFIX}*"
_ASKS_FOR_SHARED = re.compile(r"\b(operator\s*:\s*OperatorProcess|chart\s*:\s*None)\b")


@functools.cache
def on_shared_operator(module: str) -> bool:
    """Whether a cluster module's tests ask for the shared operator or its chart (read from its source: the
    scheduler has only test ids; `misplaced` checks the answer against what collection resolved)."""
    return bool(_ASKS_FOR_SHARED.search((ROOT / module).read_text()))


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to."""
    module = nodeid.split("::", 1)[0]
    if not module.startswith(CLUSTER_TIER):
        return module
    return SHARED_OPERATOR_UNIT if on_shared_operator(module) else OWN_CLUSTER_UNIT


def misplaced(nodeid: str, fixtures: set[str], marked_cluster: bool, unit: str) -> str | None:
    """Why a test would break the split, or None: on the cluster exactly when in the cluster tier, and on the
    shared operator only in its unit (`unit`: what `unit_of` said for it; a test there that does without the
    operator is harmless)."""
    in_tier = nodeid.startswith(CLUSTER_TIER)
    if in_tier and not marked_cluster:
        return f"{nodeid} is in {CLUSTER_TIER} but not marked cluster (pytestmark = pytest.mark.cluster)"
    if not in_tier and ("cluster" in fixtures or marked_cluster):
        return f"{nodeid} uses the shared cluster: move it to {CLUSTER_TIER} (tests/support/scheduling.py)"
    shared = bool(fixtures & set(SHARED_OPERATOR_FIXTURES))
    if in_tier and shared and unit != SHARED_OPERATOR_UNIT:
        return (f"{nodeid} asks for the shared operator but was put in unit {unit!r}: name the fixture in a "
                "test's signature (`operator: OperatorProcess`, `chart: None`)")
    return None


def disruptive_last(items: list, is_disruptive: list[bool]) -> list:
    """The same items, those marked disruptive moved to the end (in their order): each then runs last in its
    unit, after the other unit of the cluster tier has most likely finished."""
    return [i for i, d in zip(items, is_disruptive, strict=True) if not d] + \
        [i for i, d in zip(items, is_disruptive, strict=True) if d]
