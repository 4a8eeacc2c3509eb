"""How `make test` splits the suite over pytest-xdist workers (tests/conftest.py): the tests on the shared cluster,
all in tests/integration/, run in one worker in order; any other module runs whole, side by side with others.
Collection refuses a test that would break that."""

from __future__ import annotations

from tests.conftest import CLUSTER_TIER, misplaced, xdist_scope


def test_the_cluster_tier_is_one_unit_of_work_and_any_other_module_is_its_own() -> None:
    assert xdist_scope("tests/integration/test_demo.py::test_the_demo") == \
        xdist_scope("tests/integration/test_crd.py::test_x[a::b]") == CLUSTER_TIER
    assert xdist_scope("tests/unit/test_render.py::test_a[x::y]") == "tests/unit/test_render.py"
    assert xdist_scope("tests/unit/test_render.py::test_b") != xdist_scope("tests/unit/test_refusals.py::test_b")


def test_a_test_on_the_cluster_outside_the_cluster_tier_is_refused_and_so_is_an_unmarked_one_inside() -> None:
    assert misplaced("tests/integration/test_crd.py::t", uses_cluster=True, marked_cluster=True) is None
    assert misplaced("tests/unit/test_render.py::t", uses_cluster=False, marked_cluster=False) is None
    assert "move it to tests/integration/" in misplaced("tests/unit/test_x.py::t", uses_cluster=True,
                                                         marked_cluster=False)
    assert misplaced("tests/unit/test_x.py::t", uses_cluster=False, marked_cluster=True) is not None
    assert "not marked cluster" in misplaced("tests/integration/test_x.py::t", uses_cluster=True,
                                             marked_cluster=False)
