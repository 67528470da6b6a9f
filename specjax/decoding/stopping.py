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

A rule that needs memory across the steps of one rollout (the learned rule's running product of
predicted acceptances) carries a state: `start(b, gamma)` makes it at step 0 and
`after_carry(state, q_BxV, x_B, k) -> (stop_B, state)` is the `after` hook with it (the default
wraps `after`, state ()). The state is built from q_<=k and x_<=k only, so the rule stays exact.

`q_BxV` is the distribution the rule judges confidence by: the processed q_k that x_k is drawn from
when sampling; at temperature 0 (q_k a one-hot that says nothing) the draft's softmax at temperature
1. Under greedy decoding the draft is a deterministic function of the prefix, so every length rule
is exact there.

A rule is a small frozen dataclass (hashable: a static argument of `jax.jit`). The draft rollout
(`specjax.decoding.protocol.rollout`) calls `before` / `after` at every step and exits when every
row has stopped; the loop calls `limit` and `truncate`, and for a rule that may propose fewer than
G_MAX (`may_shorten`) the target verifies only the block the rows need, one of `block_widths`
(specjax.decoding.engine): a short proposal saves target time as well as draft passes, which is
what the cost-aware rule `Budget` ('budget') prices in. Rules are registered by name
(`@register('name')`, registry STOP_RULES); `parse('confidence:0.4')` builds one from the runner's
spelling (the class's `from_spec`) and `spec(rule)` writes it back (the rule's `spec`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import jax
import jax.numpy as jnp

from specjax.decoding import theory
from specjax.decoding.registry import STOP_RULES

__all__ = ['StopRule', 'Fixed', 'Confidence', 'Entropy', 'AlphaTracked', 'Budget', 'Learned',
           'UnsafeDropLowConfidence', 'FEATURES', 'features', 'STOP_RULES', 'block_widths',
           'entropy', 'may_shorten', 'optimal_gammas', 'parse', 'register', 'spec',
           'takes_block_costs']

register = STOP_RULES.register


def entropy(q_xV: jax.Array) -> jax.Array:
  """Shannon entropy in nats over the last axis, 0 log 0 = 0."""
  q_xV = q_xV.astype(jnp.float32)
  logq_xV = jnp.log(jnp.where(q_xV > 0, q_xV, 1.0))
  return -jnp.sum(q_xV * logq_xV, axis=-1)


def _token_prob(q_BxV: jax.Array, x_B: jax.Array) -> jax.Array:
  return jnp.take_along_axis(q_BxV.astype(jnp.float32), x_B[:, None].astype(jnp.int32), 1)[:, 0]


def optimal_gammas(alpha_B: jax.Array, c: float, gamma: int) -> jax.Array:
  """Per row the gamma in 1..`gamma` maximising E[tokens per call] / (gamma c + 1) (Theorem 3.8,
  theory.best_gamma; ties to the smaller gamma)."""
  return theory.best_gamma(alpha_B, [g * float(c) + 1.0 for g in range(gamma + 1)], first=1)


@dataclasses.dataclass(frozen=True)
class StopRule:
  """Fixed gamma (the paper): every row proposes all G slots. Base class of the other rules."""

  #: True when the rule is exact by the non-anticipation rule (tests hold every exact rule to it).
  exact = True

  @classmethod
  def from_spec(cls, arg: str, c: float | None = None,
                block_costs: tuple[float, ...] | None = None) -> StopRule:
    """The rule from the text after 'name:' ('' when absent): by default a number for the rule's
    first field. `c` (the measured cost ratio) and `block_costs` (the measured block cost curve)
    are for the rules that use them."""
    fields = dataclasses.fields(cls)
    if not arg:
      return cls()
    if not fields:
      raise ValueError('takes no argument')
    try:
      value = float(arg)
    except ValueError:
      raise ValueError(f'argument {arg!r} is not a number') from None
    return cls(**{fields[0].name: value})

  def spec(self) -> str:
    """The rule's spelling for tables (the inverse of `parse`)."""
    name, fields = STOP_RULES.name_of(self), dataclasses.fields(self)
    if name is None:
      return 'fixed' if type(self) is StopRule else type(self).__name__  # pylint: disable=unidiomatic-typecheck
    return f'{name}:{getattr(self, fields[0].name):g}' if fields else name

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

  def start(self, b: int, gamma: int) -> Any:
    """The rule's state at the start of a rollout of `gamma` steps for `b` rows (a pytree)."""
    del b, gamma
    return ()

  def after_carry(self, state: Any, q_BxV: jax.Array, x_B: jax.Array, k) -> tuple[jax.Array, Any]:
    """`after` with the rule's state: (stop after x_k [B] bool, the new state)."""
    return self.after(q_BxV, x_B, k), state


@register('fixed')
@dataclasses.dataclass(frozen=True)
class Fixed(StopRule):
  """The paper's rule: always propose gamma tokens."""


@register('confidence')
@dataclasses.dataclass(frozen=True)
class Confidence(StopRule):
  """Stop after drafting x_k when the draft was unsure of it: q_k(x_k) < threshold.

  x_k itself is kept and verified; the decision only concerns x_{k+1}, which is not sampled yet,
  so the rule is exact (transformers' `assistant_confidence_threshold`, DISCO's static variant).
  """
  threshold: float = 0.4

  def __post_init__(self):
    _check_probability(self.threshold)

  def after(self, q_BxV, x_B, k):
    return _token_prob(q_BxV, x_B) < self.threshold


@register('entropy')
@dataclasses.dataclass(frozen=True)
class Entropy(StopRule):
  """Stop before sampling x_k when the draft's distribution is spread: H(q_k) > threshold (nats).

  Decided from q_k alone, before x_k exists: exact (AdaEDL's entropy signal, as a fixed cut).
  """
  threshold: float = 2.5

  def __post_init__(self):
    if not self.threshold >= 0:
      raise ValueError(f'threshold must be >= 0 nats, got {self.threshold}')

  def before(self, q_BxV, k):
    return entropy(q_BxV) > self.threshold


@register('alpha')
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

  def __post_init__(self):
    if not 0 <= self.prior <= 1:
      raise ValueError(f'prior alpha must be in [0, 1], got {self.prior}')
    if self.c < 0:
      raise ValueError(f'c must be >= 0, got {self.c}')

  @classmethod
  def from_spec(cls, arg: str, c: float | None = None,
                block_costs: tuple[float, ...] | None = None) -> AlphaTracked:
    """'alpha' or 'alpha:PRIOR'; `c` the measured cost ratio."""
    del block_costs
    kw = {} if c is None else {'c': float(c)}
    if arg:
      try:
        kw['prior'] = float(arg)
      except ValueError:
        raise ValueError(f'argument {arg!r} is not a number') from None
    return cls(**kw)

  def spec(self) -> str:
    name = STOP_RULES.name_of(self)
    return name if self.prior == AlphaTracked.prior else f'{name}:{self.prior:g}'

  def running_alpha(self, stats) -> jax.Array:
    """[B] each row's alpha from its finished iterations, shrunk towards the prior."""
    return theory.running_alpha(stats.alpha_sum, stats.alpha_count.astype(jnp.float32),
                                self.prior, self.prior_weight)

  def limit(self, stats, gamma):
    return optimal_gammas(self.running_alpha(stats), self.c, gamma)


@register('budget')
@dataclasses.dataclass(frozen=True)
class Budget(AlphaTracked):
  """AlphaTracked with the measured price of the target's block: each row proposes the g in
  1..G_MAX maximising E[tokens](alpha_b, g) / (block_costs[g] + g c).

  block_costs[g] is the target's (g+1)-token step over its 1-token step (block_costs[0] = 1;
  runner.metrics.measure_block_cost), () = 1 for every g (then this is 'alpha'); `overhead` what
  an iteration costs beyond its model passes, in target steps (runner.metrics.measure_overhead;
  it favours longer proposals where iterations are dear). Under a stop
  rule the chain loop verifies only the block the rows propose (engine.Chain.for_rule), so
  choosing fewer drafts where the block is dear saves its price. Each row is judged alone: in a
  batch the block is as wide as its longest row's. Decided before the rollout: exact.
  """
  block_costs: tuple[float, ...] = ()
  overhead: float = 0.0

  def __post_init__(self):
    super().__post_init__()
    if not self.overhead >= 0:
      raise ValueError(f'overhead must be >= 0 target steps, got {self.overhead}')
    costs = tuple(float(x) for x in self.block_costs)
    if not all(x > 0 for x in costs):
      raise ValueError(f'block costs must be > 0, got {costs}')
    object.__setattr__(self, 'block_costs', costs)  # a list becomes a (hashable) tuple

  @classmethod
  def from_spec(cls, arg: str, c: float | None = None,
                block_costs: tuple[float, ...] | None = None) -> Budget:
    """'budget' or 'budget:PRIOR'; `c` and `block_costs` as measured."""
    rule = super().from_spec(arg, c=c)
    return rule if block_costs is None else dataclasses.replace(rule, block_costs=block_costs)

  def costs(self, gamma: int) -> list[float]:
    """[gamma + 1] what proposing g = 0..gamma drafts costs, in 1-token target steps: the block
    the loop verifies for them (the narrowest of `block_widths` >= g + 1), g draft steps and the
    iteration's `overhead`."""
    if not self.block_costs:
      return [1.0 + g * self.c + self.overhead for g in range(gamma + 1)]
    if len(self.block_costs) <= gamma:
      raise ValueError(f'budget: block costs measured up to {len(self.block_costs) - 1} drafts, '
                       f'the block holds {gamma}')
    widths = block_widths(gamma)
    block = [self.block_costs[min(w for w in widths if w > g) - 1] for g in range(gamma + 1)]
    return [block[g] + g * self.c + self.overhead for g in range(gamma + 1)]

  def limit(self, stats, gamma):
    return theory.best_gamma(self.running_alpha(stats), self.costs(gamma), first=1)


#: The per-draft signals a learned rule reads (`features`), all known once x_k is drawn:
#: log q_k(x_k), log max q_k, the entropy H(q_k) in nats, and the depth k (0-based).
FEATURES = ('log_qx', 'log_qmax', 'entropy', 'depth')
_LOG_FLOOR = -13.8  # log 1e-6: a draft token the draft itself gave ~0 mass is simply "very unsure"


def features(q_BxV: jax.Array, x_B: jax.Array, k) -> jax.Array:
  """[B, F] the FEATURES of draft k (q_BxV the rule's view of q_k, x_B the drawn token)."""
  q_BxV = q_BxV.astype(jnp.float32)
  log_qx_B = jnp.log(jnp.maximum(_token_prob(q_BxV, x_B), 1e-6))
  log_qmax_B = jnp.log(jnp.maximum(jnp.max(q_BxV, axis=-1), 1e-6))
  depth_B = jnp.full(x_B.shape, k, jnp.float32)
  return jnp.stack([jnp.maximum(log_qx_B, _LOG_FLOOR), jnp.maximum(log_qmax_B, _LOG_FLOOR),
                    entropy(q_BxV), depth_B], axis=-1)


@register('learned')
@dataclasses.dataclass(frozen=True)
class Learned(StopRule):
  """A learned acceptance predictor (SpecDec++'s rule): stop after x_k once the predicted
  probability that every draft so far is accepted falls below `threshold`.

  a_k = sigmoid(w . features(q_k, x_k, k) + bias) predicts beta_k = P(x_k accepted | x_<k
  accepted); the state is log prod_{j<=k} a_j. Fitted offline on logged iterations
  (specjax.decoding.acceptance_predictor: logistic regression on the target's own beta_k, then
  the threshold that maximises tokens per unit cost on the same log). The state is built from
  q_<=k and x_<=k only, and the decision concerns x_{k+1}, not yet drawn: exact. Spelled
  'learned:FILE' (a predictor JSON written by `save`); `source` names that file.
  """
  weights: tuple[float, ...] = (0.0,) * len(FEATURES)
  bias: float = 0.0
  threshold: float = 0.5
  source: str = ''

  def __post_init__(self):
    w = tuple(float(x) for x in self.weights)
    if len(w) != len(FEATURES):
      raise ValueError(f'learned: {len(w)} weights, the features are {len(FEATURES)} {FEATURES}')
    if not all(math.isfinite(x) for x in w + (float(self.bias),)):
      raise ValueError('learned: weights and bias must be finite')
    _check_probability(self.threshold)
    object.__setattr__(self, 'weights', w)

  @classmethod
  def from_spec(cls, arg: str, c: float | None = None,
                block_costs: tuple[float, ...] | None = None) -> Learned:
    """'learned:FILE', FILE a predictor written by `save`."""
    del c, block_costs
    if not arg:
      raise ValueError('needs a predictor file: learned:FILE.json')
    return cls.load(arg)

  def spec(self) -> str:
    """'learned:FILE' when loaded from a file (parse reads it back); a label otherwise."""
    return f'learned:{self.source}' if self.source else f'learned@{self.threshold:g}'

  @classmethod
  def load(cls, path: str) -> Learned:
    """The predictor saved at `path`; a missing or malformed file is a one-line error naming it."""
    try:
      with open(path, encoding='utf-8') as f:
        d = json.load(f)
      if tuple(d['features']) != FEATURES:
        raise ValueError(f"features {d['features']} are not {list(FEATURES)}")
      return cls(weights=tuple(d['weights']), bias=float(d['bias']),
                 threshold=float(d['threshold']), source=str(path))
    except FileNotFoundError:
      raise ValueError(f'predictor file {path}: not found') from None
    except (OSError, KeyError, TypeError, ValueError) as e:
      raise ValueError(f'predictor file {path}: {type(e).__name__}: {e}') from None

  def save(self, path: str, **about) -> None:
    """Writes the predictor as JSON (atomically), with `about` (what it was fitted on) beside."""
    d = {'features': list(FEATURES), 'weights': list(self.weights), 'bias': self.bias,
         'threshold': self.threshold, **about}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f'{path}.tmp{os.getpid()}'
    with open(tmp, 'w', encoding='utf-8') as f:
      json.dump(d, f, indent=1)
      f.write('\n')
    os.replace(tmp, path)

  def log_accept(self, q_BxV, x_B, k) -> jax.Array:
    """[B] log a_k, the predicted log probability that draft k is accepted."""
    logit_B = features(q_BxV, x_B, k) @ jnp.asarray(self.weights, jnp.float32) + self.bias
    return jax.nn.log_sigmoid(logit_B)

  def start(self, b, gamma):
    return jnp.zeros((b,), jnp.float32)

  def after_carry(self, state, q_BxV, x_B, k):
    state = state + self.log_accept(q_BxV, x_B, k)
    return state < math.log(max(self.threshold, 1e-30)), state


@register('unsafe')
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

  def __post_init__(self):
    _check_probability(self.threshold)

  def truncate(self, x_BxG, q_BxGxV, n_B):
    qx_BxG = jnp.take_along_axis(q_BxGxV.astype(jnp.float32), x_BxG[..., None].astype(jnp.int32),
                                 axis=2)[..., 0]
    low_BxG = qx_BxG < self.threshold
    first_low_B = jnp.where(low_BxG.any(1), jnp.argmax(low_BxG, axis=1), x_BxG.shape[1])
    return jnp.minimum(n_B, first_low_B).astype(jnp.int32)


def block_widths(gamma: int) -> tuple[int, ...]:
  """The target block widths the chain loop compiles for a rule that may propose fewer than
  `gamma` drafts (engine.Chain.for_rule): the block for 0, 1, 2, 4, 8, .. drafts, and the full
  gamma + 1. The loop verifies the narrowest width >= its longest row's n + 1. Each width is one
  more target pass to compile (about 0.3 s each for the tiny pair); on a CPU a block a draft or
  two wider than needed costs little (docs/performance.md), so the widths double."""
  widths, drafts = [1], 1
  while drafts < gamma:
    widths.append(drafts + 1)
    drafts *= 2
  return (tuple(widths) + (gamma + 1,)) if gamma else (1,)


def takes_block_costs(text: str) -> bool:
  """Whether the rule spelled `text` reads the measured block cost curve (parse's block_costs)."""
  return any(f.name == 'block_costs' for f in dataclasses.fields(parse(text)))


def may_shorten(rule: StopRule | None) -> bool:
  """Whether `rule` can propose fewer than G_MAX drafts: it overrides a hook of the base class
  (the chain loop then compiles narrower target blocks, engine.Chain.for_rule). Fixed and None
  cannot."""
  if rule is None:
    return False
  if getattr(rule, 'records_features', False):  # acceptance_predictor.Recorder only watches
    return may_shorten(rule.inner)
  return any(getattr(type(rule), hook) is not getattr(StopRule, hook)
             for hook in ('limit', 'before', 'after', 'truncate', 'after_carry'))


def parse(text: str, c: float | None = None,
          block_costs: tuple[float, ...] | None = None) -> StopRule:
  """'fixed', 'confidence:0.4', 'entropy:2.5', 'alpha' (or 'alpha:PRIOR'), 'budget' (or
  'budget:PRIOR'), 'learned:FILE' (a fitted acceptance predictor), 'unsafe:0.3', or any
  registered rule. `c` (the measured cost ratio) is given
  to the rules that use it ('alpha', 'budget'), `block_costs` (block_costs[g] the target's
  (g+1)-token step over its 1-token step, g = 0..G_MAX) to 'budget'. A bad spelling raises a
  one-line ValueError."""
  name, _, arg = str(text).strip().partition(':')
  try:
    cls = STOP_RULES.lookup(name.strip().lower())
  except ValueError as e:
    raise ValueError(f'{e} (in {text!r})') from None
  try:
    return cls.from_spec(arg.strip(), c=c, block_costs=block_costs)
  except (TypeError, ValueError) as e:
    raise ValueError(f'stop rule {text!r}: {e}') from None


def spec(rule: StopRule | None) -> str:
  """The short name of a rule for tables: the inverse of `parse` ('alpha' drops c, 'budget' c
  and its costs)."""
  return 'fixed' if rule is None else rule.spec()


def _check_probability(threshold: float):
  if not 0 <= threshold <= 1:
    raise ValueError(f'threshold must be in [0, 1], got {threshold}')
