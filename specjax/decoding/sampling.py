"""Turning logits into the distribution that is actually sampled from.

Shapes: B batch, G gamma (drafted tokens per block), V vocab; `x` = any leading shape.

Speculative decoding is exact only with respect to the distributions that the
acceptance rule sees.  Temperature, top-k and top-p therefore live here, in one
function `probs`, applied identically to the draft's logits (giving q) and to the
target's logits (giving p): the output is then distributed exactly as sampling
the target with the same `Sampling` settings.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax import ops
from specjax.models import cpu_kernels

__all__ = ['Sampling', 'probs', 'sample', 'sample_uniform', 'has_nan']

# Slack on the nucleus comparison so float32 rounding of a cumulative sum that is
# mathematically equal to top_p does not pull one extra token into the nucleus.
_TOP_P_SLACK = 1e-6


@dataclasses.dataclass(frozen=True)
class Sampling:
  """Sampling settings; frozen so it hashes and can be a jit static argument.

  temperature == 0 means greedy (exact argmax, not a tiny temperature);
  top_k == 0 disables top-k; top_p == 1 disables nucleus filtering.
  """

  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0

  @property
  def greedy(self) -> bool:
    return self.temperature == 0

  def validate(self) -> Sampling:
    """Raise ValueError naming the bad field; returns self for chaining."""
    if not self.temperature >= 0:
      raise ValueError(f'Sampling.temperature must be >= 0, got {self.temperature}')
    if self.top_k < 0:
      raise ValueError(f'Sampling.top_k must be >= 0 (0 disables), got {self.top_k}')
    if not 0 < self.top_p <= 1:
      raise ValueError(f'Sampling.top_p must be in (0, 1], got {self.top_p}')
    return self


def _top_k_mask(logits_xV: jax.Array, k: int) -> jax.Array:
  """True on exactly k tokens: the k largest, ties broken by lower index first."""
  V = logits_xV.shape[-1]
  # lax.top_k returns equal values lowest-index first, which fixes the tie rule.
  _, idx_xK = jax.lax.top_k(logits_xV, k)
  flat_idx_NK = idx_xK.reshape(-1, k)
  mask_NV = jax.vmap(lambda i_K: jnp.zeros((V,), bool).at[i_K].set(True))(flat_idx_NK)
  return mask_NV.reshape(logits_xV.shape)


def _top_p_mask(probs_xV: jax.Array, top_p: float) -> jax.Array:
  """True on the nucleus: the fewest highest-prob tokens with mass >= top_p.

  A token is kept iff the mass strictly before it (in descending order, ties by
  index) is below top_p, so the top token is always kept.
  """
  order_xV = jnp.argsort(-probs_xV, axis=-1, stable=True)
  sorted_xV = jnp.take_along_axis(probs_xV, order_xV, axis=-1)
  mass_before_xV = jnp.cumsum(sorted_xV, axis=-1) - sorted_xV
  keep_sorted_xV = mass_before_xV < top_p - _TOP_P_SLACK
  keep_sorted_xV = keep_sorted_xV.at[..., 0].set(True)
  # Scatter back from sorted order to vocabulary order.
  inverse_xV = jnp.argsort(order_xV, axis=-1)
  return jnp.take_along_axis(keep_sorted_xV, inverse_xV, axis=-1)


def probs(logits_xV: jax.Array, sampling: Sampling) -> jax.Array:
  """Processed float32 distribution over the last axis; used for both p and q.

  Order: temperature, then top-k, then top-p, then renormalise.  With
  temperature 0 the result is the exact one-hot of argmax (first index on
  ties), which makes speculative decoding reduce to greedy verification.
  `sampling` must be static under jit.
  """
  logits_xV = logits_xV.astype(jnp.float32)
  V = logits_xV.shape[-1]
  if sampling.greedy:
    return jax.nn.one_hot(ops.argmax(logits_xV), V, dtype=jnp.float32)
  scaled_xV = logits_xV / jnp.float32(sampling.temperature)
  if 0 < sampling.top_k < V:
    keep_xV = _top_k_mask(scaled_xV, sampling.top_k)
    scaled_xV = jnp.where(keep_xV, scaled_xV, -jnp.inf)
  probs_xV = jax.nn.softmax(scaled_xV, axis=-1)
  if sampling.top_p < 1.0:
    keep_xV = _top_p_mask(probs_xV, sampling.top_p)
    probs_xV = jnp.where(keep_xV, probs_xV, 0.0)
    probs_xV = probs_xV / jnp.sum(probs_xV, axis=-1, keepdims=True)
  return probs_xV


def log_probs(probs_xV: jax.Array) -> jax.Array:
  """log p in float32, with log(0) = -inf explicitly, so that a zero-probability token can
  never win a Gumbel-max race."""
  probs_xV = probs_xV.astype(jnp.float32)
  positive_xV = probs_xV > 0
  return jnp.where(positive_xV, jnp.log(jnp.where(positive_xV, probs_xV, 1.0)), -jnp.inf)


def sample(key: jax.Array, probs_xV: jax.Array) -> jax.Array:
  """One int32 token per row, drawn from (not necessarily normalised) probabilities; zero-prob
  tokens never. One uniform per row (`sample_uniform`)."""
  return sample_uniform(jax.random.uniform(key, probs_xV.shape[:-1], jnp.float32), probs_xV)


def sample_uniform(u_x: jax.Array, probs_xV: jax.Array) -> jax.Array:
  """The inverse-CDF draw from probs (any non-negative weights) given a uniform u in [0, 1) per
  row: the token t with c_{t-1} <= u * c_V < c_t, c the cumulative sum. Exact as the Gumbel-max
  draw is (both up to float32 rounding), but it needs one random number per draw instead of one
  per vocabulary entry: on XLA:CPU the V Gumbel draws of `jax.random.categorical` cost ~30x the
  rest of sampling. A zero-probability token has an empty interval and is never drawn."""
  u_x = jnp.broadcast_to(u_x, jnp.broadcast_shapes(u_x.shape, probs_xV.shape[:-1]))
  probs_xV = jnp.broadcast_to(probs_xV, u_x.shape + probs_xV.shape[-1:])
  if not cpu_kernels.available():
    return _by_cumsum(u_x, probs_xV)
  # XLA:CPU runs a cumulative sum as a dozen reduce-window passes; the CPU kernel does one.
  return jax.lax.platform_dependent(u_x, probs_xV, cpu=cpu_kernels.sample_cdf,
                                    default=_by_cumsum)


def _by_cumsum(u_x, probs_xV):
  cdf_xV = jnp.cumsum(probs_xV.astype(jnp.float32), axis=-1)
  below_xV = cdf_xV <= u_x[..., None].astype(jnp.float32) * cdf_xV[..., -1:]
  last = probs_xV.shape[-1] - 1
  # The last token with positive mass, for u * c_V rounding onto c_V itself.
  top_x = last - ops.argmax(jnp.flip(probs_xV, axis=-1) > 0)
  return jnp.minimum(jnp.sum(below_xV, axis=-1, dtype=jnp.int32), top_x).astype(jnp.int32)


def has_nan(logits_xV: jax.Array) -> jax.Array:
  """Bool per row (leading shape): any NaN in the logits, so the loop can raise."""
  return jnp.any(jnp.isnan(logits_xV), axis=-1)
