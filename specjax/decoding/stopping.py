"""Stop rules: how many of the G_MAX draft slots each row proposes in one iteration.

Shape legend: B batch, G the block width G_MAX (static), V vocab.

The exactness line (the non-anticipation rule): whether draft token x_k enters verification may
depend on everything known *before* x_k is sampled -- the prefix, earlier drafts, q_k itself, past
iterations -- but not on x_k. Given inclusion, x_k is still distributed as q_k, so min(1, p/q) and
norm(max(0, p - q)) still give p. The hooks below are shaped so that an exact rule cannot look at
the wrong thing:

  limit(stats, gamma)     -> [B] int32 in [0, G]  before the rollout, from finished iterations only
  before(q_BxV, k)        -> [B] bool             stop BEFORE sampling x_k, decided from q_k
  after(q_BxV, x_B, k)    -> [B] bool             stop AFTER keeping x_k (x_k is proposed; the
                                                  decision concerns x_{k+1})
  truncate(x_BxG, q_BxGxV, n_B) -> [B]            post-hoc cut of the proposal. Only a rule that is
                                                  deliberately biased uses it (it sees x_k).

`q_BxV` is the distribution the rule judges confidence by: the processed q_k that x_k is drawn from
when sampling; at temperature 0 (q_k a one-hot that says nothing) the draft's softmax at temperature
1. Under greedy decoding the draft is a deterministic function of the prefix, so every length rule
is exact there.

A rule is a small frozen dataclass (hashable: a static argument of `jax.jit`). The draft rollout
(`specjax.decoding.protocol.rollout`) calls `before` / `after` at every step and exits when every
row has stopped; the loop calls `limit` and `truncate`. `parse('confidence:0.4')` builds a rule from
the runner's spelling.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ['StopRule', 'Fixed', 'Confidence', 'Entropy', 'AlphaTracked',
           'UnsafeDropLowConfidence', 'entropy', 'optimal_gammas', 'parse', 'spec']


def entropy(q_xV: jax.Array) -> jax.Array:
  """Shannon entropy in nats over the last axis, 0 log 0 = 0."""
  q_xV = q_xV.astype(jnp.float32)
  logq_xV = jnp.log(jnp.where(q_xV > 0, q_xV, 1.0))
  return -jnp.sum(q_xV * logq_xV, axis=-1)


def _token_prob(q_BxV: jax.Array, x_B: jax.Array) -> jax.Array:
  return jnp.take_along_axis(q_BxV.astype(jnp.float32), x_B[:, None].astype(jnp.int32), 1)[:, 0]


def optimal_gammas(alpha_B: jax.Array, c: float, gamma: int) -> jax.Array:
  """Per row the gamma in 1..`gamma` maximising E[tokens per call] / (gamma c + 1) (Theorem 3.8;
  the traced twin of specjax.runner.metrics.optimal_gamma, ties to the smaller gamma)."""
  alpha_Bx1 = jnp.clip(alpha_B.astype(jnp.float32), 0.0, 1.0 - 1e-6)[:, None]
  g_G = jnp.arange(1, gamma + 1, dtype=jnp.float32)[None, :]
  tokens_BxG = (1.0 - alpha_Bx1 ** (g_G + 1.0)) / (1.0 - alpha_Bx1)
  gain_BxG = tokens_BxG / (g_G * jnp.float32(c) + 1.0)
  return (jnp.argmax(gain_BxG, axis=1) + 1).astype(jnp.int32)


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


@dataclasses.dataclass(frozen=True)
class Confidence(StopRule):
  """Stop after drafting x_k when the draft was unsure of it: q_k(x_k) < threshold.

  x_k itself is kept and verified; the decision only concerns x_{k+1}, which is not sampled yet,
  so the rule is exact (transformers' `assistant_confidence_threshold`, DISCO's static variant).
  """
  threshold: float = 0.4

  def after(self, q_BxV, x_B, k):
    return _token_prob(q_BxV, x_B) < self.threshold


@dataclasses.dataclass(frozen=True)
class Entropy(StopRule):
  """Stop before sampling x_k when the draft's distribution is spread: H(q_k) > threshold (nats).

  Decided from q_k alone, before x_k exists: exact (AdaEDL's entropy signal, as a fixed cut).
  """
  threshold: float = 2.5

  def before(self, q_BxV, k):
    return entropy(q_BxV) > self.threshold


@dataclasses.dataclass(frozen=True)
class AlphaTracked(StopRule):
  """Each row proposes the Theorem-3.8-optimal gamma <= G_MAX for its own running alpha.

  alpha_b = (alpha_sum_b + prior_weight * prior) / (alpha_count_b + prior_weight): the stats'
  per-row beta terms of *finished* iterations, shrunk towards `prior` (the alpha assumed before any
  data). `c` is the measured draft/target cost ratio. Decided before the rollout starts: exact.
  """
  c: float = 0.1
  prior: float = 0.6
  prior_weight: float = 2.0

  def limit(self, stats, gamma):
    alpha_B = ((stats.alpha_sum + self.prior_weight * self.prior)
               / (stats.alpha_count.astype(jnp.float32) + self.prior_weight))
    return optimal_gammas(alpha_B, self.c, gamma)


@dataclasses.dataclass(frozen=True)
class UnsafeDropLowConfidence(StopRule):
  """BIASED on purpose (research and the negative control of the law tests).

  Drafts all G_MAX tokens, then verifies only the prefix before the first x_k with
  q_k(x_k) < threshold. Whether x_k is verified depends on x_k's own value, so given inclusion x_k
  is no longer distributed as q_k but as q_k restricted to {x : q_k(x) >= threshold}, renormalised;
  min(1, p/q) and norm(max(0, p - q)) are computed with the unrestricted q_k, and the emitted
  tokens drift towards the draft's confident tokens (the survey's "global look-back" scheduling).
  """
  threshold: float = 0.3
  exact = False

  def truncate(self, x_BxG, q_BxGxV, n_B):
    qx_BxG = jnp.take_along_axis(q_BxGxV.astype(jnp.float32), x_BxG[..., None].astype(jnp.int32),
                                 axis=2)[..., 0]
    low_BxG = qx_BxG < self.threshold
    first_low_B = jnp.where(low_BxG.any(1), jnp.argmax(low_BxG, axis=1), x_BxG.shape[1])
    return jnp.minimum(n_B, first_low_B).astype(jnp.int32)


_NAMES = {'fixed': Fixed, 'confidence': Confidence, 'entropy': Entropy, 'alpha': AlphaTracked,
          'unsafe': UnsafeDropLowConfidence}


def parse(text: str, c: float | None = None) -> StopRule:
  """'fixed', 'confidence:0.4', 'entropy:2.5', 'alpha' (or 'alpha:PRIOR'), 'unsafe:0.3'.

  `c` (the measured cost ratio) is given to 'alpha'. A bad spelling raises a one-line ValueError.
  """
  name, _, arg = str(text).strip().partition(':')
  cls = _NAMES.get(name.strip().lower())
  if cls is None:
    raise ValueError(f'stop rule {text!r}: unknown name (choose from {", ".join(_NAMES)})')
  kw = {}
  if arg:
    try:
      value = float(arg)
    except ValueError:
      raise ValueError(f'stop rule {text!r}: argument {arg!r} is not a number') from None
    if cls is Fixed:
      raise ValueError(f'stop rule {text!r}: fixed takes no argument')
    kw['prior' if cls is AlphaTracked else 'threshold'] = value
  if cls is AlphaTracked and c is not None:
    kw['c'] = float(c)
  rule = cls(**kw)
  _check(rule, text)
  return rule


def _check(rule: StopRule, text) -> None:
  if isinstance(rule, AlphaTracked):
    if not 0 <= rule.prior <= 1:
      raise ValueError(f'stop rule {text!r}: prior alpha must be in [0, 1], got {rule.prior}')
    if rule.c < 0:
      raise ValueError(f'stop rule {text!r}: c must be >= 0, got {rule.c}')
  elif isinstance(rule, (Confidence, UnsafeDropLowConfidence)) and not 0 <= rule.threshold <= 1:
    raise ValueError(f'stop rule {text!r}: threshold must be in [0, 1], got {rule.threshold}')
  elif isinstance(rule, Entropy) and not rule.threshold >= 0:
    raise ValueError(f'stop rule {text!r}: threshold must be >= 0 nats, got {rule.threshold}')


def spec(rule: StopRule | None) -> str:
  """The short name of a rule for tables: the inverse of `parse` ('alpha' drops c)."""
  if rule is None or type(rule) in (StopRule, Fixed):
    return 'fixed'
  name = {v: k for k, v in _NAMES.items()}[type(rule)]
  if isinstance(rule, AlphaTracked):
    return 'alpha' if rule.prior == AlphaTracked.prior else f'alpha:{rule.prior:g}'
  return f'{name}:{rule.threshold:g}'
