"""Exact speculative-sampling acceptance rule (Leviathan et al., ICML 2023, Alg. 1).

Shapes: G gamma (drafted tokens), G1 = G + 1 (target rows incl. the bonus row), V vocab.

All functions act on ONE sequence; callers `jax.vmap` over the batch (with one key
per sequence).  q_GxV are the draft's processed distributions at the G drafted
positions, p_G1xV the target's at the same positions plus one bonus row, both
from `specjax.decoding.sampling.probs` with the same `Sampling`.  Everything is float32
and free of Python control flow on traced values, so it jits and vmaps.

Greedy limit: with temperature 0, p and q are exact one-hots, so
u * q_i(x_i) < p_i(x_i) holds iff x_i == argmax p_i (for every u in [0, 1)),
the residual at the first mismatch is the one-hot of argmax p_n, and `verify`
reduces exactly to "accept while draft == argmax p; next = argmax p_n" for any key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decoding.sampling import sample

__all__ = ['accept_prefix', 'residual', 'verify', 'alpha_terms']


def accept_prefix(
  draft_tokens_G: jax.Array, q_GxV: jax.Array, p_G1xV: jax.Array, u_G: jax.Array
) -> jax.Array:
  """int32 n in [0, G]: number of leading drafts accepted.

  Draft i is accepted iff u_i * q_i(x_i) < p_i(x_i), i.e. u_i < p/q without
  dividing (q may be 0, p may be 0: a token with p == 0 is never accepted).
  """
  G = draft_tokens_G.shape[0]
  x_G1 = draft_tokens_G.astype(jnp.int32)[:, None]
  qx_G = jnp.take_along_axis(q_GxV.astype(jnp.float32), x_G1, axis=-1)[:, 0]
  px_G = jnp.take_along_axis(p_G1xV[:G].astype(jnp.float32), x_G1, axis=-1)[:, 0]
  accept_G = u_G.astype(jnp.float32) * qx_G < px_G
  # Leading run of accepts: cumprod zeroes everything after the first reject.
  return jnp.sum(jnp.cumprod(accept_G.astype(jnp.int32)), dtype=jnp.int32)


def residual(p_V: jax.Array, q_V: jax.Array) -> jax.Array:
  """norm(max(0, p - q)): where a rejected position resamples from.

  When p == q the residual is all zero (and rejection has probability 0); we
  then return p so the result is always a valid distribution and never NaN.
  """
  p_V = p_V.astype(jnp.float32)
  diff_V = jnp.maximum(p_V - q_V.astype(jnp.float32), 0.0)
  total = jnp.sum(diff_V)
  safe_total = jnp.maximum(total, jnp.finfo(jnp.float32).tiny)
  return jnp.where(total > 0, diff_V / safe_total, p_V)


def verify(
  key: jax.Array, draft_tokens_G: jax.Array, q_GxV: jax.Array, p_G1xV: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """(n_accepted int32 in [0, G], next_token int32) for one drafted block.

  The block emits draft_tokens_G[:n] followed by next_token, which comes from
  residual(p_n, q_n) after a rejection at n < G, or from the bonus row p_G when
  all G drafts are accepted.  The emitted tokens are distributed exactly as
  sampling from p.
  """
  G = draft_tokens_G.shape[0]
  key_u, key_next = jax.random.split(key)
  u_G = jax.random.uniform(key_u, (G,), dtype=jnp.float32)
  n = accept_prefix(draft_tokens_G, q_GxV, p_G1xV, u_G)
  p_V = p_G1xV[n].astype(jnp.float32)
  # Pad q with a zero row so q[n] is defined for n == G (that branch uses p_G).
  q_G1xV = jnp.concatenate([q_GxV.astype(jnp.float32), jnp.zeros_like(p_V)[None]], axis=0)
  next_dist_V = jnp.where(n < G, residual(p_V, q_G1xV[n]), p_V)
  return n, sample(key_next, next_dist_V)


def alpha_terms(q_GxV: jax.Array, p_G1xV: jax.Array) -> jax.Array:
  """float32 beta_i = sum_x min(p_i(x), q_i(x)) per drafted position.

  beta_i is the probability that draft i is accepted given its prefix was;
  the paper's alpha is the mean of beta over positions whose prefix was accepted.
  """
  G = q_GxV.shape[0]
  return jnp.sum(jnp.minimum(p_G1xV[:G].astype(jnp.float32), q_GxV.astype(jnp.float32)), axis=-1)
