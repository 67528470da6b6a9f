"""The cost model reproduces the paper's Table 1 and Figure 3."""

import pytest

from specjax.runner import metrics
from specjax.runner import paper


@pytest.mark.parametrize('alpha,gamma,ops,speed', paper.TABLE1)
def test_table1(alpha, gamma, ops, speed):
  assert metrics.operations_factor(alpha, gamma, 0.0) == pytest.approx(ops, abs=0.006)
  assert metrics.walltime_improvement(alpha, gamma, 0.0) == pytest.approx(speed, abs=0.006)


def test_table1_detects_a_wrong_formula():
  # Negative control: the exponent gamma instead of gamma + 1 misses the paper's 3.69X.
  alpha, gamma = 0.8, 5
  wrong = (1 - alpha ** gamma) / (1 - alpha)
  assert wrong != pytest.approx(3.69, abs=0.006)


def test_table2_predictions():
  # The design notes' "pred" column (Theorem 3.8 with the paper's alpha, gamma, c), one decimal,
  # rounded up in places: agreement within 0.07.
  pred = [3.2, 3.3, 2.5, 2.3, 2.4, 2.0, 2.4, 2.6, 2.0, 1.9, 1.8, 1.6]
  for (_, _, _, gamma, alpha, _, c), expected in zip(paper.TABLE2, pred):
    assert metrics.walltime_improvement(alpha, gamma, c) == pytest.approx(expected, abs=0.07)


def test_figure3_optimal_gamma():
  # Higher alpha and cheaper drafts both favour longer blocks.
  for c in (0.01, 0.02, 0.05, 0.1):
    gammas = [metrics.optimal_gamma(a / 20, c) for a in range(1, 20)]
    assert gammas == sorted(gammas)
  assert metrics.optimal_gamma(0.9, 0.01) > metrics.optimal_gamma(0.9, 0.1)
  # Brute force over a fine grid agrees with the closed form's maximiser.
  assert metrics.optimal_gamma(0.8, 0.05) == max(
      range(1, 65), key=lambda g: (1 - 0.8 ** (g + 1)) / (0.2 * (g * 0.05 + 1)))


def test_some_gamma_helps_when_alpha_exceeds_c():
  # Paper Cor.: if alpha > c some gamma helps, by at least (1 + alpha) / (1 + c).
  for alpha, c in [(0.3, 0.1), (0.6, 0.5), (0.9, 0.02)]:
    best = metrics.walltime_improvement(alpha, metrics.optimal_gamma(alpha, c), c)
    assert best >= (1 + alpha) / (1 + c) - 1e-9


def test_expected_tokens_limits():
  assert metrics.expected_tokens_per_call(1.0, 7) == 8
  assert metrics.expected_tokens_per_call(0.0, 7) == 1
