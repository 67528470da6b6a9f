"""Stop rules: how many of the G_MAX draft slots each row proposes in one iteration.

Shape legend: B batch, G the block width G_MAX (static), V vocab.

The exactness line (the non-anticipation rule): whether draft token x_k enters verification may
depend on everything known *before* x_k is sampled -- the prefix, earlier drafts, q_k itself, past
iterations -- but not on x_k. Given inclusion, x_k is still distributed as q_k, so min(1, p/q) and
norm(max(0, p - q)) still give p. The hooks below are shaped so that an exact rule cannot look at
the wrong thing:

  limit(stats)            -> [B] int32 in [0, G]  before the rollout, from finished iterations only
  before(q_BxV, k)        -> [B] bool             stop BEFORE sampling x_k, decided from q_k
  after(q_BxV, x_B, k)    -> [B] bool             stop AFTER keeping x_k (x_k is proposed; the
                                                  decision concerns x_{k+1})
  truncate(x_BxG, q_BxGxV, n_B) -> [B]            post-hoc cut of the proposal. Only a rule that is
                                                  deliberately biased uses it (it sees x_k).

A rule is a small frozen dataclass (hashable: a static argument of `jax.jit`). The draft rollout
(`specjax.decoding.protocol.rollout`) calls `before` / `after` at every step and exits when every
row has stopped; the loop calls `limit` and `truncate`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class StopRule:
  """Fixed gamma (the paper): every row proposes all G slots. Base class of the other rules."""

  #: True when the rule is exact by the non-anticipation rule (tests hold every exact rule to it).
  exact = True

  def limit(self, stats: Any, gamma: int) -> jax.Array:
    """Per-row cap on proposed drafts this iteration, [B] int32 in [0, gamma]."""
    return jnp.full(stats.accepted.shape, gamma, jnp.int32)

  def before(self, q_BxV: jax.Array, k) -> jax.Array:
    """Stop before sampling draft k (from q_k alone)."""
    return jnp.zeros(q_BxV.shape[:1], bool)

  def after(self, q_BxV: jax.Array, x_B: jax.Array, k) -> jax.Array:
    """Stop after keeping draft k (x_k is proposed either way)."""
    return jnp.zeros(x_B.shape, bool)

  def truncate(self, x_BxG: jax.Array, q_BxGxV: jax.Array, n_B: jax.Array) -> jax.Array:
    """Post-hoc proposal length; exact rules leave n_B as it is."""
    return n_B


@dataclasses.dataclass(frozen=True)
class Fixed(StopRule):
  """The paper's rule: always propose gamma tokens."""
