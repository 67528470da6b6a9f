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


# ----------------------------------------------------------------------------- the length oracle
# theory.oracle_lengths (experiments/bench_adaptive.py's oracle row): the proposal length per
# logged iteration that maximises pooled expected tokens per unit cost.


def _costs(c, block):
  """cost[k] = block cost of k + 1 tokens + k c, block[0] = 1."""
  return [b + k * c for k, b in enumerate(block)]


def test_chain_tokens_is_eq1_per_position():
  import numpy as np
  from specjax.decoding import theory
  beta = np.array([[0.9, 0.5, 0.1], [0.7, 0.7, 0.7]])
  np.testing.assert_allclose(theory.chain_tokens(beta)[0], [1, 1.9, 2.35, 2.395])
  np.testing.assert_allclose(theory.chain_tokens(beta)[1],
                             [metrics.expected_tokens_per_call(0.7, g) for g in range(4)])


def test_oracle_single_iteration_known_optimum():
  # E = [1, 1.9, 2.35, 2.395], cost = [1, 1.3, 1.6, 1.9]: ratios 1, 1.4615, 1.46875, 1.2605.
  from specjax.decoding import theory
  beta, cost = [[0.9, 0.5, 0.1]], _costs(0.2, [1.0, 1.1, 1.2, 1.3])
  k, rate = theory.oracle_lengths(beta, cost)
  assert k.tolist() == [2] and rate == pytest.approx(2.35 / 1.6)
  # Negative control: an oracle blind to the cost (every length costs the same) proposes all 3,
  # which is worse under the real costs.
  blind, _ = theory.oracle_lengths(beta, [1.0] * 4)
  assert blind.tolist() == [3]
  assert theory.pooled_rate(theory.chain_tokens(beta), cost, blind) < rate - 0.2


def test_oracle_matches_enumeration_and_beats_every_fixed_gamma():
  import itertools
  import numpy as np
  from specjax.decoding import theory
  rng = np.random.default_rng(0)
  for trial in range(5):
    beta = rng.uniform(0, 1, (4, 3)) ** rng.uniform(0.2, 2, (4, 1))  # varied rows
    cost = _costs(rng.uniform(0.05, 0.5), np.cumsum([1.0, *rng.uniform(0.02, 0.4, 3)]))
    tokens = theory.chain_tokens(beta)
    k, rate = theory.oracle_lengths(beta, cost)
    every = {ks: theory.pooled_rate(tokens, cost, ks)
             for ks in itertools.product(range(4), repeat=4)}  # all 4^4 assignments
    best = max(every, key=every.get)
    assert rate == pytest.approx(every[best], rel=1e-12), trial
    assert theory.pooled_rate(tokens, cost, k) == pytest.approx(rate, rel=1e-12)
    # A fixed gamma (0..3, the same on every iteration) is one of the oracle's choices.
    for g in range(4):
      assert rate >= every[(g,) * 4] - 1e-12, (trial, g)
    # The logged data of one oracle (same betas, same costs): it must be >= the best fixed one.
    assert rate >= max(every[(g,) * 4] for g in range(4))


def test_oracle_is_not_the_per_iteration_ratio():
  # Control: maximising each iteration's own E / cost is not the pooled optimum. Iteration A
  # (beta 0.55) alone is worth a draft (1.55 / 1.5 > 1), but it lowers the pooled rate of B's
  # (beta 1: 2 / 1.5): (1, 1) gives 3.55 / 3 = 1.183, (0, 1) gives 3 / 2.5 = 1.2.
  import numpy as np
  from specjax.decoding import theory
  beta, cost = np.array([[0.55], [1.0]]), [1.0, 1.5]
  tokens = theory.chain_tokens(beta)
  per_iteration = np.argmax(tokens / np.asarray(cost)[None, :], axis=1)
  k, rate = theory.oracle_lengths(beta, cost)
  assert per_iteration.tolist() == [1, 1] and k.tolist() == [0, 1]
  assert rate == pytest.approx(1.2)
  assert theory.pooled_rate(tokens, cost, per_iteration) == pytest.approx(3.55 / 3)
  assert 3.55 / 3 < rate


def test_sequence_speedup_adds_the_fixed_cost_per_call():
  """Without a fixed cost and with the paper's 1 step per token it is predicted_speedup; a fixed
  cost both loops pay pulls the speedup towards 1, the more the shorter the sequences."""
  args = dict(tokens_per_call=2.5, draft_passes_per_call=3.0, c=0.1, block_cost=1.2)
  plain = metrics.predicted_speedup(**args)
  assert metrics.predicted_sequence_speedup(25.0, **args, fixed_base=0.0,
                                            fixed_spec=0.0) == pytest.approx(plain)
  short = metrics.predicted_sequence_speedup(10.0, **args, fixed_base=4.0, fixed_spec=4.0)
  long = metrics.predicted_sequence_speedup(100.0, **args, fixed_base=4.0, fixed_spec=4.0)
  assert 1.0 < short < long < plain
  # (4 + 10 * 0.9) / (5 + 4 * 1.5) by hand: the plain loop's own per-token cost counts too.
  assert metrics.predicted_sequence_speedup(
      10.0, **args, fixed_base=4.0, fixed_spec=5.0, base_per_token=0.9) == pytest.approx(13 / 11)
  # An iteration's overhead is charged like a wider block: 4 iterations of 1.5 + 0.25 steps.
  assert metrics.predicted_sequence_speedup(
      10.0, **args, fixed_base=4.0, fixed_spec=5.0, base_per_token=0.9,
      overhead=0.25) == pytest.approx(13 / 12)
