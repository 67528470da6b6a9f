"""The paper's cost model in one place: alpha, Eq. (1), Theorem 3.8 and the best gamma.

Shapes: x any leading shape, V vocab, G1 = gamma + 1 candidate widths.

alpha is E[beta] with beta = sum_x min(p(x), q(x)) (Cor. 3.6), the probability that a draft is
accepted given that its prefix was; it is estimated on positions whose prefix was accepted (the
target's own prefixes). With alpha and gamma drafts per target call, E[tokens per call] is
(1 - alpha^(gamma+1)) / (1 - alpha) = sum_{i <= gamma} alpha^i (Eq. 1), and with a draft step
costing c target steps the walltime improvement is E[tokens] / (gamma c + 1) (Theorem 3.8).

Every function works on Python floats and, where it says so, on traced arrays: the runner's
tables, the stop rule that tracks alpha per row (stopping.AlphaTracked) and gamma='auto'
(decoding.auto) all call these.
"""

from __future__ import annotations

import jax.numpy as jnp


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


def best_gamma(alpha_x, cost_G1, first: int = 0):
  """Traced: per alpha the gamma in first .. G maximising E[tokens](alpha, gamma) / cost[gamma],
  ties to the smaller gamma. cost_G1[g] is what an iteration at gamma g costs (any unit);
  alpha_x any shape, the result int32 of the same shape."""
  alpha_x = jnp.clip(jnp.asarray(alpha_x, jnp.float32), 0.0, 1.0)
  tokens_xG1 = jnp.stack([expected_tokens_per_call(alpha_x, g) for g in range(len(cost_G1))], -1)
  gain_xG1 = tokens_xG1 / jnp.asarray(cost_G1, jnp.float32)
  return (jnp.argmax(gain_xG1[..., first:], axis=-1) + first).astype(jnp.int32)
