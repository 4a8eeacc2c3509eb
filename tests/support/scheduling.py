"""How `make test` spreads the suite over pytest-xdist workers (`-n N --dist loadscope`, tests/conftest.py).

A unit of work runs whole, in order, in one worker. The cluster tier (tests/integration/) makes three:
- two of modules on a shared operator (the module-scoped `operator` fixture, with the chart release it runs
  under): within each, one module at a time, since each module's operator would otherwise reconcile the next
  one's pools; each operator watches only the namespaces its unit's tests get (`SharedOperator.prefix`), and
  runs as its own release's ServiceAccount, so the two units run side by side. The second takes the long modules
  that reach the operator only through the fixtures (`SECOND_OPERATOR_MODULES`); modules that name the release's
  identity themselves (tests/support/release.py) stay on the first;
- every other cluster module (the demo, the pod runner, the CRD, the cluster itself), each with operators of its
  own scoped to its own namespaces, if any.
Any other module is a unit of its own, so its module-scoped fixtures are set up once.

A test marked `disruptive` (it restarts a part of the shared cluster) runs last in its unit and alone on the
cluster (tests/support/cluster_share.py).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_TIER = "tests/integration/"
SHARED_OPERATOR_UNIT = "tests/integration/ (shared operator)"
SECOND_OPERATOR_UNIT = "tests/integration/ (second shared operator)"
OWN_CLUSTER_UNIT = "tests/integration/ (own operators)"
SHARED_OPERATOR_FIXTURES = ("operator", "chart")
SECOND_OPERATOR_MODULES = frozenset(f"{CLUSTER_TIER}{name}.py" for name in (
    "test_bake_e2e", "test_rollback_e2e", "test_cli_e2e", "test_playbook_e2e", "test_rollout_under_load_e2e",
    "test_verified_rollout_e2e", "test_autoscale_stories_e2e", "test_gang_e2e"))
_ASKS_FOR_SHARED = re.compile(r"\b(operator\s*:\s*OperatorProcess|chart\s*:\s*None)\b")


@dataclasses.dataclass(frozen=True)
class SharedOperator:
    """One shared operator: its unit, the chart release it runs under (and that release's ServiceAccount, named
    as the release), and the prefix of its tests' namespaces (no other test's namespace has it)."""

    unit: str
    release: str
    prefix: str

    @property
    def namespaces(self) -> str:
        return f"{self.prefix}*"


SHARED_OPERATORS = (SharedOperator(SHARED_OPERATOR_UNIT, "pdfleet", "top-"),
                    SharedOperator(SECOND_OPERATOR_UNIT, "pdfleet-b", "tob-"))


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
    if not on_shared_operator(module):
        return OWN_CLUSTER_UNIT
    return SECOND_OPERATOR_UNIT if module in SECOND_OPERATOR_MODULES else SHARED_OPERATOR_UNIT


def shared_operator(module: str) -> SharedOperator:
    """The shared operator a cluster module's tests run on (the first for a module not on either)."""
    unit = unit_of(module)
    return next((o for o in SHARED_OPERATORS if o.unit == unit), SHARED_OPERATORS[0])


def module_path(file: str) -> str:
    """A test module's path as test ids name it, from its __file__."""
    return str(Path(file).resolve().relative_to(ROOT))


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
    if in_tier and shared and unit not in (o.unit for o in SHARED_OPERATORS):
        return (f"{nodeid} asks for the shared operator but was put in unit {unit!r}: name the fixture in a "
                "test's signature (`operator: OperatorProcess`, `chart: None`)")
    return None


def disruptive_last(items: list, is_disruptive: list[bool]) -> list:
    """The same items, those marked disruptive moved to the end (in their order): each then runs last in its
    unit, after the other unit of the cluster tier has most likely finished."""
    return [i for i, d in zip(items, is_disruptive, strict=True) if not d] + \
        [i for i, d in zip(items, is_disruptive, strict=True) if d]
