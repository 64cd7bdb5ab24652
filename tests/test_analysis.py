"""The paper's formulas, checked against the numbers the paper quotes."""
import pytest

from speculative_t5.measure import analysis


def test_eq1_tokens_per_call_paper_values():
    assert analysis.expected_tokens_per_call(0.75, 7) == pytest.approx(3.60, abs=0.005)
    assert analysis.expected_tokens_per_call(0.9, 10) == pytest.approx(6.86, abs=0.005)
    assert analysis.expected_tokens_per_call(1.0, 4) == 5
    assert analysis.expected_tokens_per_call(0.0, 4) == 1


def test_eq5_walltime_and_measured_v():
    # T5-small drafting for T5-XXL on EnDe argmax: alpha 0.75, gamma 7, c 0.02 -> ~3.1x predicted
    pred = analysis.walltime_improvement(0.75, 7, 0.02)
    assert pred == pytest.approx(3.60 / 1.14, rel=1e-3)
    # a verify pass costing v > 1 one-token passes lowers the prediction
    assert analysis.walltime_improvement(0.75, 7, 0.02, v=2.0) == pytest.approx(3.60 / 2.14, rel=1e-3)
    p = analysis.predictions(0.75, 7, 0.02, 1.5)
    assert p["speedup_predicted_paper"] > p["speedup_predicted"]


def test_operations_factor_and_best_gamma():
    # drafts that cost nothing: operations grow by (gamma+1)/E[tokens] >= 1
    assert analysis.operations_factor(0.75, 7, 0.0) == pytest.approx(8 / 3.60, abs=0.01)
    assert analysis.operations_factor(1.0, 3, 0.0) == pytest.approx(1.0)
    g = analysis.best_gamma(0.75, 0.02)
    assert all(analysis.walltime_improvement(0.75, g, 0.02) >= analysis.walltime_improvement(0.75, k, 0.02)
               for k in range(1, 33))
    assert analysis.best_gamma(0.1, 0.5) == 1
    assert analysis.alpha_from_acceptance(3, 4) == 0.75 and analysis.alpha_from_acceptance(0, 0) == 0.0
