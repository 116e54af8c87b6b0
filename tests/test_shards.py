"""``--shard I/N`` (conftest.py at the root): shards balanced by the ``thorough`` mark's cost."""

import importlib.util
import pathlib

import pytest

_spec = importlib.util.spec_from_file_location("root_conftest", pathlib.Path(__file__).parents[1] / "conftest.py")
root_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(root_conftest)


def test_without_costs_every_nth_test_from_the_ith():
    assert root_conftest._balanced([1.0] * 7, 2) == [0, 1, 0, 1, 0, 1, 0]
    assert root_conftest._balanced([1.0] * 7, 3) == [0, 1, 2, 0, 1, 2, 0]


def test_a_costly_test_gets_a_shard_of_its_own_and_the_rest_fill_the_other():
    # The CI case: rotor's 120-stage table (200 s) and best at 10^4 stages (60 s) used to fall in one shard.
    costs = [1.0, 1.0, 200.0, 1.0, 60.0, 1.0]
    owner = root_conftest._balanced(costs, 2)
    assert owner == [1, 1, 0, 1, 1, 1]
    loads = [sum(c for c, o in zip(costs, owner, strict=True) if o == s) for s in range(2)]
    assert max(loads) == 200.0


@pytest.mark.parametrize("seconds", [0, -3, "10", True, float("nan"), float("inf")])
def test_a_cost_that_is_not_a_positive_number_is_refused_by_name(seconds):
    class Item:
        nodeid = "tests/test_x.py::test_y"

        def get_closest_marker(self, name):
            return pytest.mark.thorough(seconds=seconds).mark

    with pytest.raises(pytest.UsageError, match=r"test_y: thorough\(seconds=\.\.\.\) must be a positive number"):
        root_conftest._cost(Item())
