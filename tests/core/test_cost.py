import pytest

from tokenfair.core.cost import LinearCost, ProfiledCost, make_cost


def test_linear_cost_weights_input_and_output():
    cost = LinearCost(1, 2)
    assert cost.prefill(100) == 100
    assert cost.output(100, 3, 10) == 14


def test_profiled_cost_charges_add_up_to_h():
    cost = ProfiledCost()
    x, n = 136, 256
    total = cost.prefill(x) + sum(cost.output(x, k - 1, k) for k in range(1, n + 1))
    assert total == pytest.approx(cost.h(x, n))
    assert cost.prefill(x) == pytest.approx(0.21001891 * x + 1.14601454)


def test_make_cost_names():
    assert isinstance(make_cost("linear", 1, 3), LinearCost)
    assert isinstance(make_cost("profiled"), ProfiledCost)
    with pytest.raises(ValueError, match="unknown cost"):
        make_cost("quadratic")
    with pytest.raises(ValueError):
        LinearCost(-1, 2)
