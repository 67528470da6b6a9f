"""gamma='auto': one gamma in 0 .. G_MAX per iteration, from a cost curve and the running alpha.

Shape legend: G1 = G_MAX + 1 candidate widths.

Each iteration picks the gamma maximising E[tokens](alpha, gamma) / cost(gamma) (Theorem 3.8's
ratio, specjax.decoding.theory.best_gamma) with the running alpha of FINISHED iterations (the
non-anticipation rule of specjax.decoding.stopping: the choice never sees a draft of this
iteration) and a cost curve `Costs` (a whole loop iteration at each gamma, measured by
refill.measure_costs, or given by hand). gamma = 0 is a plain decoding step (one target token per
row, no draft call). Slot refill (specjax.decoding.refill) runs the choice.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.decoding import theory


@dataclasses.dataclass(frozen=True)
class Auto:
  """gamma='auto': choose gamma in 0 .. g_max per iteration (static, hashable).

  alpha = (sum of beta terms of finished iterations + prior_weight * prior) / (count +
  prior_weight), over all requests so far (the paper's alpha, Cor. 3.6). gamma = 0 steps measure
  no alpha, so once chosen gamma 0 stays; `probe_every` > 0 runs one gamma = 1 iteration after
  that many gamma = 0 iterations in a row (a fresh alpha; it costs the draft's resync pass).
  `costs` ((target cost for K = 1 .. g_max + 1, draft cost)) fixes the cost curve instead of
  measuring it at every call (refill.measure_costs); it is passed to the program as data (no
  recompilation).
  """
  g_max: int = 5
  prior: float = 0.6
  prior_weight: float = 2.0
  probe_every: int = 0
  costs: tuple | None = None

  def __post_init__(self):
    if isinstance(self.g_max, bool) or int(self.g_max) < 1:
      raise ValueError(f'gamma auto: g_max must be >= 1, got {self.g_max}')
    if not 0 <= self.prior <= 1 or self.prior_weight < 0:
      raise ValueError(f'gamma auto: prior must be in [0, 1] and prior_weight >= 0, got {self}')
    if self.costs is not None and len(self.costs[0]) != self.g_max + 1:
      raise ValueError(f'gamma auto: costs need {self.g_max + 1} target costs (K = 1 .. g_max + '
                       f'1), got {len(self.costs[0])}')

  def curve(self):
    """The given cost curve as Costs (None when it is to be measured)."""
    if self.costs is None:
      return None
    target_k, draft_cost = self.costs
    return Costs(target_K=jnp.asarray(target_k, jnp.float32), draft=jnp.float32(draft_cost))

  def static(self) -> Auto:
    """The part that shapes the program (the curve is data, not a static argument)."""
    return dataclasses.replace(self, costs=None)


@struct.dataclass
class Costs:
  """Cost of one iteration at B slots (any unit; only ratios matter): cost(gamma) =
  target_K[gamma] + gamma * draft.

  target_K: [G1] float32   measure_costs: a whole iteration at gamma = 0 .. G (then draft = 0);
                           or, given by hand (Auto.costs), the target's step with K = gamma + 1
  draft:    []   float32   one draft pass, when target_K holds target steps only
  """
  target_K: jax.Array
  draft: jax.Array

  @classmethod
  def flat(cls) -> Costs:
    """A placeholder curve for programs that choose no gamma."""
    return cls(target_K=jnp.ones((1,), jnp.float32), draft=jnp.float32(0))


def choose_gamma(auto: Auto, costs: Costs, alpha_sum, alpha_count):
  """argmax over g in 0 .. G of E[tokens per row](alpha, g) / cost(g), ties to the smaller g.
  Uses only finished iterations' alpha."""
  alpha = theory.running_alpha(alpha_sum, alpha_count, auto.prior, auto.prior_weight)
  g_G1 = jnp.arange(auto.g_max + 1, dtype=jnp.float32)
  cost_G1 = costs.target_K.astype(jnp.float32) + g_G1 * costs.draft.astype(jnp.float32)
  return theory.best_gamma(alpha, cost_G1)


def smooth_costs(cost_G1) -> np.ndarray:
  """Iteration costs at gamma = 0 .. G with gamma >= 1 replaced by their least-squares line
  (slope >= 0). From gamma = 1 on an iteration adds one draft pass and one block column per
  gamma, so the cost is linear in gamma; single timings on a shared CPU scatter by 5-10%, enough
  to order neighbouring gammas wrongly (measured: gamma 3 'cheaper' than gamma 2 at B = 64).
  gamma = 0 (no draft call at all) keeps its own timing."""
  c = np.asarray(cost_G1, np.float64)
  if len(c) <= 2:
    return c
  g = np.arange(1, len(c), dtype=np.float64)
  slope, icpt = np.polyfit(g, c[1:], 1)
  if slope < 0:
    slope, icpt = 0.0, float(np.mean(c[1:]))
  return np.concatenate([c[:1], icpt + slope * g])


def parse_gamma(gamma) -> tuple[int | None, Auto | None]:
  """(fixed gamma, None) or (None, Auto) from an int, 'auto', 'auto:G' or an Auto."""
  if isinstance(gamma, Auto):
    return None, gamma
  if isinstance(gamma, str):
    name, _, arg = gamma.strip().partition(':')
    if name != 'auto':
      raise ValueError(f"gamma {gamma!r}: expected an int >= 1, 'auto' or 'auto:G_MAX'")
    try:
      return None, Auto(g_max=int(arg)) if arg else Auto()
    except ValueError as e:
      if 'auto' in str(e):
        raise
      raise ValueError(f'gamma {gamma!r}: G_MAX {arg!r} is not an integer') from None
  if gamma is None or isinstance(gamma, bool) or int(gamma) < 1:
    raise ValueError(f'gamma must be >= 1, got {gamma}')
  return int(gamma), None
