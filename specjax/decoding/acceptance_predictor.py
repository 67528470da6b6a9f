"""Fitting the learned stop rule (stopping.Learned) on logged iterations, SpecDec++-style.

Shape legend: I logged iterations (all rows'), G the logged block width, F stopping.FEATURES.

  record(...)      a traced fixed-G run under Recorder: per iteration the G drafts'
                   features (what the rule will see) and beta_k = sum_x min(p_k, q_k), the
                   probability the target accepts draft k given drafts < k were (the 0/1 match of
                   the argmaxes at T = 0). Rows and iterations pooled: Log(features, beta, n).
  fit(log, costs)  logistic regression of beta_k on the features (soft labels: beta_k is the
                   exact acceptance probability, a lower-variance target than the 0/1 outcome),
                   then the threshold on the predicted prod_{j<=k} a_j that maximises the pooled
                   E[tokens] / cost over the same log, E[tokens](n) = 1 + sum_{j<=n}
                   prod_{i<=j} beta_i and cost(n) the caller's price of proposing n drafts (e.g.
                   stopping.Budget.costs: the block the loop verifies + n c + the per-iteration
                   overhead). Returns the rule and a report (its pooled rate beside each fixed
                   gamma's on the log).

The fitted rule is exact whatever its weights (stopping.Learned): fitting can only make it fast or
slow, never biased. Fit on verses apart from those it is judged on (experiments/bench_adaptive.py
fits on dev verses and times on test verses).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding import stopping

__all__ = ['Log', 'Recorder', 'record', 'fit', 'rate']


@dataclasses.dataclass(frozen=True)
class Recorder(stopping.StopRule):
  """`inner`'s decisions, and its state carries each draft's stopping.features [B, G, F] so a
  traced run logs them (DecodeOutput.trace_features): the training data of a learned rule. It
  only watches: exact whenever `inner` is."""
  inner: stopping.StopRule = stopping.StopRule()
  records_features = True  # chain.SpecState.record_trace logs the state's features

  @property
  def exact(self):
    return self.inner.exact

  def spec(self) -> str:
    return stopping.spec(self.inner)

  def limit(self, stats, gamma):
    return self.inner.limit(stats, gamma)

  def before(self, q_BxV, k):
    return self.inner.before(q_BxV, k)

  def truncate(self, x_BxG, q_BxGxV, n_B):
    return self.inner.truncate(x_BxG, q_BxGxV, n_B)

  def start(self, b, gamma):
    return self.inner.start(b, gamma), jnp.zeros((b, gamma, len(stopping.FEATURES)), jnp.float32)

  def after_carry(self, state, q_BxV, x_B, k):
    inner, f_BxGxF = state
    stop_B, inner = self.inner.after_carry(inner, q_BxV, x_B, k)
    f_BxGxF = jax.lax.dynamic_update_index_in_dim(f_BxGxF, stopping.features(q_BxV, x_B, k), k, 1)
    return stop_B, (inner, f_BxGxF)


@dataclasses.dataclass(frozen=True)
class Log:
  """Pooled logged iterations: features [I, G, F], beta [I, G], n [I] drafts proposed."""
  features: np.ndarray
  beta: np.ndarray
  n: np.ndarray

  @classmethod
  def from_trace(cls, out) -> Log:
    """The active iterations of a traced DecodeOutput run under a Recorder rule."""
    n_BxI = np.asarray(out.trace_proposed)
    keep = n_BxI >= 0
    return cls(features=np.asarray(out.trace_features)[keep], beta=np.asarray(out.trace_beta)[keep],
               n=n_BxI[keep])

  @classmethod
  def concat(cls, logs) -> Log:
    logs = list(logs)
    return cls(*(np.concatenate([getattr(x, f.name) for x in logs])
                 for f in dataclasses.fields(cls)))


def record(target, draft, prompts_NxS, *, gamma: int, temperature: float, batch: int,
           max_new_tokens: int, rng: int = 0) -> Log:
  """The log of a traced fixed-`gamma` run of `draft` (any draft that drafts token by token: a T5
  model, the feature head) on the prompts, in chunks of `batch` (right-padded prompts)."""
  from specjax.decoding import loop  # pylint: disable=import-outside-toplevel
  n = prompts_NxS.shape[0] - prompts_NxS.shape[0] % batch
  if n == 0:
    raise ValueError(f'record: {prompts_NxS.shape[0]} prompts, fewer than one batch of {batch}')
  logs = []
  for i in range(0, n, batch):
    out = loop.speculative_decode(target, draft, prompts_NxS[i:i + batch], gamma=gamma,
                                  max_new_tokens=max_new_tokens, temperature=temperature,
                                  rng=rng + i // batch, trace=True,
                                  stop=Recorder(stopping.Fixed()))
    logs.append(Log.from_trace(out))
  log = Log.concat(logs)
  if not (log.n == gamma).all():
    raise ValueError('record: the logged run proposed fewer than gamma drafts somewhere')
  return log


def _logistic(x_NxF, y_N, l2: float, iters: int = 50):
  """Weights [F] and bias of the logistic regression of soft labels y in [0, 1] on x, by Newton's
  method (a 5-parameter convex problem: a dozen lines beat a dependency and a learning rate)."""
  x = np.concatenate([x_NxF, np.ones((len(x_NxF), 1))], axis=1).astype(np.float64)
  w = np.zeros(x.shape[1])
  reg = np.full(x.shape[1], l2)
  reg[-1] = 0.0  # the bias is not shrunk
  for _ in range(iters):
    p = 1.0 / (1.0 + np.exp(-x @ w))
    grad = x.T @ (p - y_N) / len(y_N) + reg * w
    hess = (x * (p * (1 - p))[:, None]).T @ x / len(y_N) + np.diag(reg) + 1e-9 * np.eye(len(w))
    step = np.linalg.solve(hess, grad)
    w -= step
    if np.max(np.abs(step)) < 1e-10:
      break
  return w[:-1], float(w[-1])


def _expected_tokens(beta_IxG: np.ndarray) -> np.ndarray:
  """[I, G + 1] E[tokens](n) = 1 + sum_{j<=n} prod_{i<=j} beta_i for n = 0..G (Eq. 1 per
  position, the yardstick length_oracle uses)."""
  reach = np.cumprod(beta_IxG, axis=1)
  return np.concatenate([np.ones((len(beta_IxG), 1)), 1 + np.cumsum(reach, axis=1)], axis=1)


def rate(log: Log, n_I: np.ndarray, costs) -> float:
  """Pooled E[tokens] / cost when iteration i proposes n_I[i] drafts (costs[n] in target
  steps)."""
  e = _expected_tokens(log.beta)[np.arange(len(n_I)), n_I]
  return float(e.sum() / np.asarray(costs, np.float64)[n_I].sum())


def lengths(rule: stopping.Learned, log: Log) -> np.ndarray:
  """[I] the drafts `rule` proposes on each logged iteration (its after-hook on the logged
  features: at least 1, stop after draft k once the predicted prod a_<=k < threshold)."""
  f = log.features.astype(np.float64)
  logit = f @ np.asarray(rule.weights) + rule.bias
  cum = np.cumsum(-np.logaddexp(0.0, -logit), axis=1)  # log prod a_<=k
  stop = cum < np.log(max(rule.threshold, 1e-30))
  g = f.shape[1]
  return np.where(stop.any(1), np.argmax(stop, axis=1) + 1, g)


def fit(log: Log, costs, *, l2: float = 1e-3, thresholds=None, source: str = ''):
  """(the fitted stopping.Learned, report): module docstring. `costs` [G + 1], costs[n] the price
  of proposing n drafts in 1-token target steps."""
  g = log.beta.shape[1]
  if len(costs) != g + 1:
    raise ValueError(f'fit: {len(costs)} costs for a log of {g} drafts (needs {g + 1})')
  if len(log.n) < 2:
    raise ValueError(f'fit: {len(log.n)} logged iterations are too few')
  x = log.features.reshape(-1, log.features.shape[-1]).astype(np.float64)
  y = np.clip(log.beta.reshape(-1).astype(np.float64), 0.0, 1.0)
  mean, std = x.mean(0), x.std(0) + 1e-6
  w_std, b_std = _logistic((x - mean) / std, y, l2)
  weights = w_std / std
  bias = b_std - float(np.sum(w_std * mean / std))
  thresholds = np.linspace(0.02, 0.98, 49) if thresholds is None else thresholds
  best = None
  for tau in [0.0, *thresholds]:  # 0: never stops (fixed G)
    rule = stopping.Learned(weights=tuple(weights), bias=bias, threshold=float(tau), source=source)
    r = rate(log, lengths(rule, log), costs)
    if best is None or r > best[1] + 1e-12:
      best = (rule, r)
  rule, r = best
  fixed = {k: rate(log, np.full(len(log.n), k), costs) for k in range(1, g + 1)}
  pred = 1.0 / (1.0 + np.exp(-(x @ weights + bias)))
  report = dict(iterations=int(len(log.n)), rate=r, fixed_rates=fixed,
                best_fixed=max(fixed, key=fixed.get), vs_best_fixed=r / max(fixed.values()),
                mean_length=float(lengths(rule, log).mean()),
                brier=float(np.mean((pred - y) ** 2)), brier_constant=float(np.var(y)))
  return rule, report
