"""The paper's cost model in one place: alpha, Eq. (1), Theorem 3.8 and the best gamma.

Shapes: x any leading shape, V vocab, G1 = gamma + 1 candidate widths.

alpha is E[beta] with beta = sum_x min(p(x), q(x)) (Cor. 3.6), the probability that a draft is
accepted given that its prefix was; it is estimated on positions whose prefix was accepted (the
target's own prefixes). With alpha and gamma drafts per target call, E[tokens per call] is
(1 - alpha^(gamma+1)) / (1 - alpha) = sum_{i <= gamma} alpha^i (Eq. 1), and with a draft step
costing c target steps the walltime improvement is E[tokens] / (gamma c + 1) (Theorem 3.8).

Every function works on Python floats and, where it says so, on traced arrays: the runner's
tables, the stop rule that tracks alpha per row (stopping.AlphaTracked) and gamma='auto'
(decoding.auto) all call these. The length oracle at the end (chain_tokens, oracle_lengths) is
numpy: it bounds adaptive proposal lengths offline from logged per-position betas
(experiments/bench_adaptive.py).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def beta(p_xV, q_xV):
  """sum_x min(p, q) per row (float32): draft acceptance probability given its prefix."""
  return jnp.sum(jnp.minimum(p_xV.astype(jnp.float32), q_xV.astype(jnp.float32)), axis=-1)


def running_alpha(beta_sum, beta_count, prior: float, prior_weight: float):
  """alpha from finished beta terms, shrunk towards `prior` (the alpha assumed before any data)."""
  return (beta_sum + prior_weight * prior) / (beta_count + prior_weight)


def expected_tokens_per_call(alpha, gamma: int):
  """E[tokens per target call] = sum_{i=0..gamma} alpha^i (Eq. 1; gamma + 1 at alpha = 1).
  alpha may be a float or an array (traced too)."""
  return sum(alpha ** i for i in range(int(gamma) + 1))


def walltime_improvement(alpha, gamma: int, c: float):
  """Expected walltime improvement (Theorem 3.8): E[tokens per call] / (gamma * c + 1)."""
  return expected_tokens_per_call(alpha, gamma) / (gamma * c + 1.0)


def operations_factor(alpha: float, gamma: int, c_hat: float = 0.0) -> float:
  """Expected increase in arithmetic operations (Theorem 3.11)."""
  return (gamma * c_hat + gamma + 1.0) / expected_tokens_per_call(alpha, gamma)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
  """The integer gamma >= 1 maximising walltime improvement (Figure 3; ties to the smaller)."""
  return max(range(1, max_gamma + 1), key=lambda g: walltime_improvement(alpha, g, c))


def predicted_speedup(tokens_per_call: float, draft_passes_per_call: float, c: float,
                      block_cost: float = 1.0) -> float:
  """Walltime improvement for any (also variable) proposal length, from measured averages:
  E[tokens per target call] / (E[draft passes per target call] * c + block_cost).

  block_cost is the target's (gamma+1)-token step over its 1-token step; with a fixed gamma,
  gamma passes and block_cost 1 this is Theorem 3.8."""
  return tokens_per_call / (draft_passes_per_call * c + block_cost)


def predicted_sequence_speedup(tokens_per_sequence: float, tokens_per_call: float,
                               draft_passes_per_call: float, c: float, block_cost: float,
                               fixed_base: float, fixed_spec: float,
                               base_per_token: float = 1.0, overhead: float = 0.0) -> float:
  """`predicted_speedup` for whole decodes of n tokens, in target 1-token steps: each call also
  pays a fixed cost (the encoders, the first step, dispatch: fixed_base / fixed_spec, measured)
  that speculation does not shorten, the plain loop's own cost per token (1 in the paper), and
  each iteration what it costs beyond its passes (`overhead`: verification, sampling, commit, a
  head's window pass being wider than one token): (fixed_base + n base_per_token) /
  (fixed_spec + n / E[tokens per call] (passes c + block + overhead))."""
  iterations = tokens_per_sequence / max(tokens_per_call, 1e-9)
  spec = fixed_spec + iterations * (draft_passes_per_call * c + block_cost + overhead)
  return (fixed_base + tokens_per_sequence * base_per_token) / spec


def best_gamma(alpha_x, cost_G1, first: int = 0):
  """Traced: per alpha the gamma in first .. G maximising E[tokens](alpha, gamma) / cost[gamma],
  ties to the smaller gamma. cost_G1[g] is what an iteration at gamma g costs (any unit);
  alpha_x any shape, the result int32 of the same shape."""
  alpha_x = jnp.clip(jnp.asarray(alpha_x, jnp.float32), 0.0, 1.0)
  tokens_xG1 = jnp.stack([expected_tokens_per_call(alpha_x, g) for g in range(len(cost_G1))], -1)
  gain_xG1 = tokens_xG1 / jnp.asarray(cost_G1, jnp.float32)
  return (jnp.argmax(gain_xG1[..., first:], axis=-1) + first).astype(jnp.int32)


# ----------------------------------------------------------------------------- the length oracle
# Offline (numpy, float64): a bound for adaptive proposal lengths from logged per-position betas.


def chain_tokens(beta_NxG):
  """E[tokens per call] when a chain proposes k = 0..G drafts, per row of betas: [N, G + 1].

  beta_NxG[n, i - 1] is draft i's acceptance probability given drafts < i were accepted
  (sum_x min(p_i, q_i); the 0/1 match of argmaxes at temperature 0), so E[tokens](k) =
  1 + sum_{j <= k} prod_{i <= j} beta_i (Eq. 1 when every beta_i = alpha)."""
  beta = np.clip(np.asarray(beta_NxG, np.float64), 0.0, 1.0)
  run_NxG = np.cumprod(beta, axis=1)
  return np.concatenate([np.ones((beta.shape[0], 1)), 1.0 + np.cumsum(run_NxG, axis=1)], axis=1)


def pooled_rate(tokens_NxG1, cost_G1, k_N) -> float:
  """sum_n E_n(k_n) / sum_n cost[k_n]: tokens per unit cost of proposing k_n at iteration n."""
  k_N = np.asarray(k_N, int)
  rows = np.arange(len(k_N))
  return float(tokens_NxG1[rows, k_N].sum() / np.asarray(cost_G1, np.float64)[k_N].sum())


def oracle_lengths(beta_NxG, cost_G1, max_steps: int = 100):
  """The lengths k_n in 0..G, one per logged iteration, that maximise the pooled tokens per unit
  cost sum_n E_n(k_n) / sum_n cost[k_n]; returns (k_N, rate).

  cost_G1[k] is what an iteration proposing k drafts costs (for the speculative loop: the target's
  (k+1)-token step plus k draft steps, in 1-token target steps). Maximising each iteration's own
  ratio E_n(k) / cost[k] does not maximise the pooled one (a fixed gamma can beat it); the pooled
  optimum picks per iteration argmax_k E_n(k) - rate* cost[k] at the optimal rate rate*, found by
  Dinkelbach's iteration from the best fixed gamma (each step raises the rate; it stops at the
  optimum, since then no choice of lengths has sum E - rate* sum cost > 0). Ties go to the smaller
  k. Every fixed gamma in 0..G is one of the choices, so the rate is >= the best fixed gamma's."""
  tokens_NxG1 = chain_tokens(beta_NxG)
  cost_G1 = np.asarray(cost_G1, np.float64)
  n, g1 = tokens_NxG1.shape
  if cost_G1.shape != (g1,) or not (cost_G1 > 0).all():
    raise ValueError(f'cost_G1 must hold {g1} positive costs, got {cost_G1}')
  fixed = [pooled_rate(tokens_NxG1, cost_G1, np.full(n, g)) for g in range(g1)]
  k_N = np.full(n, int(np.argmax(fixed)))
  rate = max(fixed)
  for _ in range(max_steps):
    new_k_N = np.argmax(tokens_NxG1 - rate * cost_G1[None, :], axis=1)
    new_rate = pooled_rate(tokens_NxG1, cost_G1, new_k_N)
    if not new_rate > rate * (1 + 1e-12):
      break
    k_N, rate = new_k_N, new_rate
  return k_N, rate
