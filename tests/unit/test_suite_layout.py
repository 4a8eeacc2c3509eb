"""How `make test` splits the suite over pytest-xdist workers (tests/support/scheduling.py): units of work that
run whole in one worker, and collection refusing a test that would break them."""

from __future__ import annotations

from tests.support import scheduling
from tests.support.release import SERVICE_ACCOUNT
from tests.support.scheduling import (
    CLUSTER_TIER,
    OWN_CLUSTER_UNIT,
    SECOND_OPERATOR_UNIT,
    SHARED_OPERATOR_UNIT,
    misplaced,
    unit_of,
)


def test_the_cluster_tier_makes_three_units_and_any_other_module_is_its_own() -> None:
    assert unit_of("tests/integration/test_serving_e2e.py::test_x") == \
        unit_of("tests/integration/test_leader_election.py::test_y[a::b]") == SHARED_OPERATOR_UNIT
    assert unit_of("tests/integration/test_bake_e2e.py::test_x") == SECOND_OPERATOR_UNIT
    assert unit_of("tests/integration/test_demo.py::test_the_demo") == \
        unit_of("tests/integration/test_crd.py::test_x[a::b]") == OWN_CLUSTER_UNIT
    assert unit_of("tests/unit/test_render.py::test_a[x::y]") == "tests/unit/test_render.py"
    assert unit_of("tests/unit/test_render.py::test_b") != unit_of("tests/unit/test_refusals.py::test_b")


def test_the_two_shared_operators_share_no_release_and_no_namespace() -> None:
    first, second = scheduling.SHARED_OPERATORS
    assert first.release == SERVICE_ACCOUNT, "modules that name the release's identity run on the first"
    assert first.release != second.release
    assert not first.prefix.startswith(second.prefix) and not second.prefix.startswith(first.prefix)
    assert not any(o.prefix.startswith("t-") for o in (first, second)), "other tests' namespaces are t-*"
    for module in scheduling.SECOND_OPERATOR_MODULES:
        assert scheduling.on_shared_operator(module), f"{module} does not run on a shared operator"
        assert "tests.support.release" not in (scheduling.ROOT / module).read_text(), \
            f"{module} names the first release's identity: it cannot run on the second"
    assert scheduling.shared_operator("tests/integration/test_bake_e2e.py") == second


def test_a_test_outside_its_unit_is_refused() -> None:
    shared, own = SHARED_OPERATOR_UNIT, OWN_CLUSTER_UNIT
    assert misplaced(f"{CLUSTER_TIER}test_a.py::t", {"cluster", "operator"}, True, shared) is None
    assert misplaced(f"{CLUSTER_TIER}test_b.py::t", {"cluster", "namespace"}, True, own) is None
    assert misplaced("tests/unit/test_render.py::t", {"tmp_path"}, False, "tests/unit/test_render.py") is None
    assert "move it to tests/integration/" in misplaced("tests/unit/test_x.py::t", {"cluster"}, False, "u")
    assert misplaced("tests/unit/test_x.py::t", set(), True, "u") is not None
    assert "not marked cluster" in misplaced(f"{CLUSTER_TIER}test_x.py::t", {"cluster"}, False, own)
    assert "asks for the shared operator" in misplaced(f"{CLUSTER_TIER}test_x.py::t", {"chart"}, True, own)
    assert misplaced(f"{CLUSTER_TIER}test_x.py::t", {"cluster"}, True, shared) is None, "no operator is harmless"
    assert misplaced(f"{CLUSTER_TIER}test_a.py::t", {"operator"}, True, SECOND_OPERATOR_UNIT) is None


def test_disruptive_tests_go_last_in_their_order() -> None:
    assert scheduling.disruptive_last(["a", "x", "b", "y"], [False, True, False, True]) == ["a", "b", "x", "y"]
