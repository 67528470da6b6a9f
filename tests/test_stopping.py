"""Stop rules (specjax.stopping): exact rules keep the target's law, the biased rule is caught.

Shapes: N rows per rule, K rules side by side, M = 3 generated tokens, V vocab, G = G_MAX.

Law tests: the setup of tests/test_exactness.py (tiny V = 12 T5 target, the first M = 3 tokens of
N = 20,000 rows of one prompt, chi-square against the enumerated target law), at G_MAX = 3 with a
far draft (independent weights, alpha ~ 0.6 at T = 1) and a near one (the target plus noise,
alpha ~ 0.8). To keep compiles few, one call runs every rule side by side: rows k N .. (k+1) N - 1
follow rule k (`ByRow`, a fixed assignment that does not depend on any sample). Rows never
interact (acceptance, caches and statistics are per row; only the number of draft passes is
shared), so each slice is an independent sample of its rule. One compile per (verifier,
temperature); the near and far drafts share it (same shapes).

The biased rule runs in the same calls. UnsafeDropLowConfidence(0.15) with the far draft at T = 1:
the draft's token probabilities are spread (median max q ~ 0.2 over V = 12), so about half the
drafts fall under 0.15 and are dropped depending on their own value -- the emitted law moves
towards the draft's confident tokens, by far more than 20,000 rows can miss.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chi2 import chi2_pvalue  # tests/chi2.py
from test_exactness import M, N, PROMPT, V, exact_law, models
from specjax import stopping
from specjax.decoding import TRACE_COUNTS, acceptance
from specjax.decoding.drafts import ModelDraft
from specjax.decoding.loop import autoregressive_decode, speculative_decode
from specjax.decoding.sampling import Sampling
from specjax.decoding.stopping import StopRule
from specjax.testing import add_noise, spread_params, tiny_config, tiny_t5

G_MAX = 3
SEED = 2023
# Thresholds in the middle of the tiny models' ranges (entropy ~1.3-2.4 nats of at most log 12 =
# 2.48; token probabilities ~0.1-0.5), so every rule stops some rows early and not others.
EXACT_RULES = {
    'fixed': stopping.Fixed(),
    'confidence': stopping.Confidence(0.15),
    'entropy': stopping.Entropy(2.1),
    'alpha': stopping.AlphaTracked(c=0.3, prior=0.6),
    'budget': stopping.Budget(c=0.3, prior=0.6, block_costs=(1.0, 1.1, 1.3, 1.6)),
    # a_k = sigmoid(log q(x_k) + 1) in ~[0.2, 0.6]: stops after one draft about half the time and
    # by the running product after two or three (its carried state is what decides there).
    'learned': stopping.Learned(weights=(1.0, 0.0, 0.0, 0.0), bias=1.0, threshold=0.3),
}
UNSAFE = stopping.UnsafeDropLowConfidence(0.15)
RULES = {**EXACT_RULES, 'unsafe': UNSAFE}
TEMPS = {'T1': Sampling(temperature=1.0), 'T0.7': Sampling(temperature=0.7)}


@dataclasses.dataclass(frozen=True)
class ByRow(StopRule):
  """Rows [k rows, (k+1) rows) follow rules[k] (a static assignment, decided before any sample)."""
  rules: tuple = ()
  rows: int = 1

  def _pick(self, values):
    b = values[0].shape[0]
    group_B = jnp.arange(b) // self.rows
    out = values[-1]
    for k in range(len(values) - 2, -1, -1):
      out = jnp.where(group_B == k, values[k], out)
    return out

  def limit(self, stats, gamma):
    return self._pick([r.limit(stats, gamma) for r in self.rules])

  def before(self, q_BxV, k):
    return self._pick([r.before(q_BxV, k) for r in self.rules])

  def after(self, q_BxV, x_B, k):
    return self._pick([r.after(q_BxV, x_B, k) for r in self.rules])

  def truncate(self, x_BxG, q_BxGxV, n_B):
    return self._pick([r.truncate(x_BxG, q_BxGxV, n_B) for r in self.rules])

  def start(self, b, gamma):
    return tuple(r.start(b, gamma) for r in self.rules)

  def after_carry(self, state, q_BxV, x_B, k):
    outs = [r.after_carry(s, q_BxV, x_B, k) for r, s in zip(self.rules, state)]
    return self._pick([o[0] for o in outs]), tuple(o[1] for o in outs)


ALL_ROWS = ByRow(rules=tuple(RULES.values()), rows=N)


@dataclasses.dataclass(frozen=True)
class ShortBlocks(StopRule):
  """`inner`, capped at iteration % period drafts for every row: whole batches propose 0, 1, ..
  drafts, so the target scores narrow blocks (engine.Chain.for_rule). The cap depends on the
  iteration count only: exact whenever `inner` is."""
  inner: StopRule = stopping.Fixed()
  period: int = 3

  @property
  def exact(self):
    return self.inner.exact

  def limit(self, stats, gamma):
    return jnp.minimum(self.inner.limit(stats, gamma), stats.iterations % self.period)

  def before(self, q_BxV, k):
    return self.inner.before(q_BxV, k)

  def after(self, q_BxV, x_B, k):
    return self.inner.after(q_BxV, x_B, k)

  def truncate(self, x_BxG, q_BxGxV, n_B):
    return self.inner.truncate(x_BxG, q_BxGxV, n_B)

  def start(self, b, gamma):
    return self.inner.start(b, gamma)

  def after_carry(self, state, q_BxV, x_B, k):
    return self.inner.after_carry(state, q_BxV, x_B, k)


NARROW = {'confidence': ShortBlocks(stopping.Confidence(0.15)),
          'budget': ShortBlocks(stopping.Budget(c=0.3, block_costs=(1.0, 1.1, 1.3, 1.6)), 4),
          'unsafe': ShortBlocks(UNSAFE, 2)}


@functools.lru_cache(maxsize=None)
def near_draft():
  return add_noise(models()[0], 0.3, seed=5)


@functools.lru_cache(maxsize=None)
def run(temp, verifier, draft_name):
  """One call, all rules side by side: {rule: (counts over V^3, proposed histogram [G1], alpha)}."""
  target, far = models()
  draft = far if draft_name == 'far' else near_draft()
  sampling = TEMPS[temp]
  out = speculative_decode(
      target, draft, np.repeat(PROMPT, N * len(RULES), axis=0), gamma=G_MAX, max_new_tokens=M,
      temperature=sampling.temperature, rng=jax.random.PRNGKey(SEED), eos_id=-1, stop=ALL_ROWS,
      verifier=verifier)
  tokens = np.asarray(out.tokens)
  assert (np.asarray(out.lengths) == M).all()
  codes = tokens @ np.array([V * V, V, 1])
  hist = np.asarray(out.stats.proposed_hist)
  a_sum, a_cnt = np.asarray(out.stats.alpha_sum), np.asarray(out.stats.alpha_count)
  rows = [slice(k * N, (k + 1) * N) for k in range(len(RULES))]
  return {name: (np.bincount(codes[r], minlength=V ** 3), hist[r].sum(0),
                 a_sum[r].sum() / max(a_cnt[r].sum(), 1)) for name, r in zip(RULES, rows)}


# The far draft at both temperatures; the near one (alpha ~ 0.8, long accepted runs) at T = 1.
@pytest.mark.parametrize('verifier', ['token', 'block'])
@pytest.mark.parametrize('draft_name,temp', [('far', 'T1'), ('far', 'T0.7'), ('near', 'T1')])
def test_exact_rules_follow_target_law(draft_name, verifier, temp):
  law = exact_law(TEMPS[temp])
  results = run(temp, verifier, draft_name)
  pvalues = {}
  for name in EXACT_RULES:
    counts, hist, _ = results[name]
    pvalues[name] = chi2_pvalue(counts, law)
    if name != 'fixed':  # the rule acts: >= 5% of proposals end early, >= 5% propose a token
      assert hist[:G_MAX].sum() > 0.05 * hist.sum() and hist[1:].sum() > 0.05 * hist.sum(), (
          name, hist)
  print(f'{draft_name} {verifier} {temp}: ' + ', '.join(f'{k} p = {v:.3g}'
                                                        for k, v in pvalues.items()))
  assert min(pvalues.values()) > 1e-3, pvalues


@pytest.mark.parametrize('verifier', ['token', 'block'])
def test_unsafe_drop_low_confidence_is_detected(verifier):
  counts, hist, _ = run('T1', verifier, 'far')['unsafe']
  p = chi2_pvalue(counts, exact_law(TEMPS['T1']))
  print(f'control:unsafe_drop_low_confidence ({verifier}): chi-square p = {p:.3g}, proposed {hist}')
  assert not UNSAFE.exact
  assert p < 1e-6, p


@functools.lru_cache(maxsize=None)
def run_narrow(temp):
  """NARROW's rules side by side (rows k N .. (k+1) N - 1): {rule: (counts, proposed hist)}."""
  target, far = models()
  out = speculative_decode(
      target, far, np.repeat(PROMPT, N * len(NARROW), axis=0), gamma=G_MAX, max_new_tokens=M,
      temperature=TEMPS[temp].temperature, rng=jax.random.PRNGKey(SEED + 1), eos_id=-1,
      stop=ByRow(rules=tuple(NARROW.values()), rows=N))
  assert (np.asarray(out.lengths) == M).all()
  codes = np.asarray(out.tokens) @ np.array([V * V, V, 1])
  hist = np.asarray(out.stats.proposed_hist)
  rows = [slice(k * N, (k + 1) * N) for k in range(len(NARROW))]
  return {name: (np.bincount(codes[r], minlength=V ** 3), hist[r].sum(0))
          for name, r in zip(NARROW, rows)}


@pytest.mark.parametrize('temp', ['T1', 'T0.7'])
def test_narrow_blocks_keep_the_target_law(temp):
  # Every iteration's batch proposes at most iteration % period drafts, so the target scores
  # blocks of 1 .. period tokens (< G_MAX + 1 = 4 for confidence and unsafe), padded to G_MAX + 1.
  law = exact_law(TEMPS[temp])
  results = run_narrow(temp)
  pvalues = {name: chi2_pvalue(results[name][0], law) for name in NARROW}
  print(f'narrow blocks {temp}: ' + ', '.join(f'{k} p = {v:.3g} {results[k][1]}'
                                              for k, v in pvalues.items()))
  for name in ('confidence', 'budget'):
    hist = results[name][1]
    assert hist[0] > 0.05 * hist.sum() and hist[1:3].sum() > 0.3 * hist.sum(), (name, hist)
    assert pvalues[name] > 1e-3, pvalues
  assert results['confidence'][1][G_MAX] == 0  # never the full block
  if temp == 'T1':  # the negative control through the same narrow blocks
    assert pvalues['unsafe'] < 1e-6, pvalues


# A broken block verification (the token rule's residual in place of the block residual) is
# rejected in tests/test_block_verify.py on probability trees where its bias is large (total
# variation 0.026). Through this loop (G = 3, 3 tokens, these models) its bias is too small for
# 80,000 rows to see (measured p = 0.13), so no loop-level run is spent on it.


@functools.lru_cache(maxsize=None)
def run_argmax(stop):
  """The far draft proposing its argmax (q one-hot) at T = 1: (counts, alpha)."""
  target, far = models()
  out = speculative_decode(target, ModelDraft(far, argmax=True), np.repeat(PROMPT, N, axis=0),
                           gamma=G_MAX, max_new_tokens=M, temperature=1.0,
                           rng=jax.random.PRNGKey(SEED), eos_id=-1, stop=stop)
  codes = np.asarray(out.tokens) @ np.array([V * V, V, 1])
  return np.bincount(codes, minlength=V ** 3), jax.device_get(out.stats)


def test_argmax_draft_is_exact_under_sampling():
  # q is a point mass given the prefix: exact at T = 1, with a stop rule that acts on the draft's
  # processed distribution too (Confidence judges q_T, not the one-hot).
  counts, stats = run_argmax(stopping.Confidence(0.3))
  p = chi2_pvalue(counts, exact_law(TEMPS['T1']))
  hist = np.asarray(stats.proposed_hist).sum(0)
  sampled_alpha = run('T1', 'token', 'far')['fixed'][2]
  print(f'argmax draft + confidence:0.3, T = 1: chi-square p = {p:.3g}; alpha argmax '
        f'{stats.alpha:.3f} vs sampled {sampled_alpha:.3f}; proposed {hist}')
  assert hist[:G_MAX].sum() > 0.05 * hist.sum(), hist
  assert p > 1e-3, p


# ----------------------------------------------------------------------------- greedy


GB, GS, GM = 8, 7, 16  # rows per rule, source length, max_new_tokens


@functools.lru_cache(maxsize=None)
def greedy_pair():
  config = tiny_config('v11')
  target = tiny_t5(config, seed=1, scale=2.0)
  target = target.replace(params=spread_params(target.params, 1))
  return target, add_noise(target, 0.1, seed=2)


@functools.lru_cache(maxsize=None)
def greedy_prompts():
  rng = np.random.default_rng(0)
  ids = rng.integers(2, 64, (GB * len(RULES), GS)).astype(np.int32)
  ids[:, -2:] = 0  # right padding
  return ids


@dataclasses.dataclass(frozen=True)
class BlockAsWritten(acceptance.BlockVerifier):
  """The block rule's own code at temperature 0 too (the loop otherwise runs the batched argmax
  verifier for every registered rule)."""
  argmax_at_greedy = False


@pytest.mark.parametrize('verifier', ['token', BlockAsWritten()], ids=['token', 'block'])
def test_greedy_every_rule_is_token_identical(verifier):
  target, draft = greedy_pair()
  ids = greedy_prompts()
  ref = autoregressive_decode(target, ids, max_new_tokens=GM)
  out = speculative_decode(target, draft, ids, gamma=G_MAX, max_new_tokens=GM,
                           stop=ByRow(rules=tuple(RULES.values()), rows=GB), verifier=verifier)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  hist = np.asarray(out.stats.proposed_hist)
  for k, name in enumerate(RULES):  # the rules act at temperature 0 too
    h = hist[k * GB:(k + 1) * GB].sum(0)
    if name in ('confidence', 'entropy', 'alpha', 'budget', 'learned'):
      assert h[:G_MAX].sum() > 0, (name, h)


def test_greedy_narrow_blocks_are_token_identical():
  target, draft = greedy_pair()
  ids = greedy_prompts()
  ref = autoregressive_decode(target, ids, max_new_tokens=GM)
  for rule in (ShortBlocks(stopping.Confidence(0.3)), ShortBlocks(period=2),
               ShortBlocks(stopping.Budget(c=0.2, block_costs=(1.0, 1.5, 2.0, 3.0)), 4)):
    out = speculative_decode(target, draft, ids, gamma=G_MAX, max_new_tokens=GM, stop=rule)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_array_equal(out.tokens, ref.tokens)


def test_narrow_score_is_the_full_blocks_prefix():
  """Chain.score at width n + 1: the full block's first rows (logits and cache), zeros after."""
  from specjax.decoding import engine, protocol
  target, draft = greedy_pair()
  ids = jnp.asarray(greedy_prompts()[:3])
  st = engine.init_state(target, ModelDraft(draft), ids, jax.random.PRNGKey(0),
                         form=engine.Chain(G_MAX), max_new_tokens=GM)
  st = st.replace(lengths=jnp.array([0, 2, 5]), seq=st.seq.at[:, 1:8].set(7))
  prop = protocol.Proposal(tokens_BxG=jnp.array([[4, 0, 0], [9, 3, 0], [5, 0, 0]]),
                           q_BxGxV=jnp.zeros((3, G_MAX, 1)), n_B=jnp.array([1, 2, 0]),
                           passes=jnp.int32(0), state=())
  narrow = engine.Chain.for_rule(G_MAX, stopping.Confidence())
  assert narrow.widths == stopping.block_widths(G_MAX) == (1, 2, 3, 4)
  assert engine.Chain.for_rule(G_MAX, stopping.Fixed()).widths == ()
  full_logits, _, full_cache = engine.Chain(G_MAX).score(target, None, st.target_cache, prop, st)
  logits, hidden, cache = narrow.score(target, None, st.target_cache, prop, st)
  assert hidden is None and logits.shape == full_logits.shape
  np.testing.assert_allclose(logits[:, :3], full_logits[:, :3], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(logits[:, 3:], 0.0)
  for b, start in enumerate([0, 2, 5]):
    for full_k, k in zip(full_cache.self_k, cache.self_k):
      np.testing.assert_allclose(k[b, :, :start + 3], full_k[b, :, :start + 3], rtol=1e-5,
                                 atol=1e-5)


def test_block_widths_and_may_shorten():
  assert stopping.block_widths(1) == (1, 2)
  assert stopping.block_widths(4) == (1, 2, 3, 5)
  assert stopping.block_widths(8) == (1, 2, 3, 5, 9)
  assert stopping.block_widths(12) == (1, 2, 3, 5, 9, 13)
  assert not stopping.may_shorten(None) and not stopping.may_shorten(stopping.Fixed())
  assert not stopping.may_shorten(StopRule())
  for rule in [*EXACT_RULES.values(), UNSAFE, ALL_ROWS]:
    if rule == stopping.Fixed():
      continue
    assert stopping.may_shorten(rule), rule


def test_no_recompilation_for_the_same_shapes_and_rule():
  target, draft = greedy_pair()
  ids = greedy_prompts()[:4]
  rule = stopping.Confidence(0.3)
  kw = dict(gamma=G_MAX, max_new_tokens=GM, temperature=1.0, stop=rule, verifier='block')
  speculative_decode(target, draft, ids, rng=1, **kw)
  before = dict(TRACE_COUNTS)
  speculative_decode(target, draft, ids[::-1].copy(), rng=2, **kw)
  speculative_decode(target, draft, ids, rng=3, **dict(kw, stop=stopping.Confidence(0.3)))
  assert dict(TRACE_COUNTS) == before


# ----------------------------------------------------------------------------- the rules alone


@dataclasses.dataclass
class FakeStats:
  accepted: jnp.ndarray
  alpha_sum: jnp.ndarray
  alpha_count: jnp.ndarray


def test_confidence_and_entropy_hooks():
  q = jnp.array([[0.7, 0.2, 0.1], [1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0]])
  x = jnp.array([1, 0, 0])
  np.testing.assert_array_equal(stopping.Confidence(0.3).after(q, x, 0), [True, False, False])
  np.testing.assert_array_equal(stopping.Confidence(0.3).before(q, 0), [False] * 3)
  np.testing.assert_allclose(stopping.entropy(q)[1:], [np.log(3), 0.0], rtol=1e-6)
  np.testing.assert_array_equal(stopping.Entropy(1.0).before(q, 0), [False, True, False])
  np.testing.assert_array_equal(stopping.Entropy(1.0).after(q, x, 0), [False] * 3)


def test_alpha_tracked_limit_is_theorem_optimal_gamma():
  from specjax.runner.metrics import optimal_gamma
  rule = stopping.AlphaTracked(c=0.05, prior=0.6, prior_weight=2.0)
  stats = FakeStats(accepted=jnp.zeros(4, jnp.int32), alpha_sum=jnp.array([0.0, 3.0, 30.0, 98.0]),
                    alpha_count=jnp.array([0, 10, 40, 100]))
  limit = np.asarray(rule.limit(stats, 8))
  alphas = [(s + 2 * 0.6) / (c + 2) for s, c in zip([0, 3, 30, 98], [0, 10, 40, 100])]
  assert limit.tolist() == [optimal_gamma(a, 0.05, 8) for a in alphas]
  assert limit[0] == optimal_gamma(0.6, 0.05, 8)  # the prior before any data
  assert len(set(limit.tolist())) > 2


def test_budget_limit_maximises_tokens_per_cost():
  costs = (1.0, 1.02, 1.05, 1.3, 1.35, 1.4, 1.6, 1.7, 2.4)
  rule = stopping.Budget(c=0.05, prior=0.6, prior_weight=2.0, block_costs=costs)
  sums, counts = [0.0, 3.0, 30.0, 98.0], [0, 10, 40, 100]
  stats = FakeStats(accepted=jnp.zeros(4, jnp.int32), alpha_sum=jnp.array(sums),
                    alpha_count=jnp.array(counts))
  limit = np.asarray(rule.limit(stats, 8)).tolist()
  widths = stopping.block_widths(8)  # proposing g drafts verifies the narrowest width > g
  block = [costs[min(w for w in widths if w > g) - 1] for g in range(9)]
  for row, (s, c) in enumerate(zip(sums, counts)):
    a = (s + 2 * 0.6) / (c + 2)
    gain = [sum(a ** i for i in range(g + 1)) / (block[g] + 0.05 * g) for g in range(9)]
    assert limit[row] == int(np.argmax(gain[1:])) + 1, (row, gain)
  # A dear block shortens proposals; a flat one gives AlphaTracked's choice.
  flat = stopping.Budget(c=0.05, block_costs=(1.0,) * 9)
  alpha = stopping.AlphaTracked(c=0.05)
  np.testing.assert_array_equal(flat.limit(stats, 8), alpha.limit(stats, 8))
  assert (np.asarray(rule.limit(stats, 8)) <= np.asarray(alpha.limit(stats, 8))).all()
  assert limit != np.asarray(alpha.limit(stats, 8)).tolist()
  # A per-iteration overhead is paid whatever the length: it favours longer proposals.
  dear_iter = stopping.Budget(c=0.05, prior=0.6, prior_weight=2.0, block_costs=costs, overhead=1.5)
  np.testing.assert_allclose(dear_iter.costs(8), np.asarray(rule.costs(8)) + 1.5)
  longer = np.asarray(dear_iter.limit(stats, 8))
  assert (longer >= np.asarray(limit)).all() and (longer > np.asarray(limit)).any(), (longer, limit)
  with pytest.raises(ValueError, match='overhead'):
    stopping.Budget(overhead=-0.1)
  with pytest.raises(ValueError, match='block costs measured up to 2'):
    stopping.Budget(block_costs=(1.0, 1.1, 1.2)).limit(stats, 8)
  with pytest.raises(ValueError, match='> 0'):
    stopping.Budget(block_costs=(1.0, 0.0))


def test_unsafe_truncates_at_the_first_low_token():
  q = jnp.zeros((3, 4, 5)).at[:, :, 0].set(0.5).at[:, :, 1].set(0.1).at[:, :, 2].set(0.4)
  x = jnp.array([[0, 2, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
  n = stopping.UnsafeDropLowConfidence(0.3).truncate(x, q, jnp.array([4, 4, 2]))
  np.testing.assert_array_equal(n, [2, 0, 2])
  assert not stopping.UnsafeDropLowConfidence.exact
  assert all(r.exact for r in EXACT_RULES.values())


def test_parse_spec_and_errors():
  assert stopping.parse('fixed') == stopping.Fixed()
  assert stopping.parse('confidence:0.4') == stopping.Confidence(0.4)
  assert stopping.parse('entropy:2.5') == stopping.Entropy(2.5)
  assert stopping.parse('alpha', c=0.2) == stopping.AlphaTracked(c=0.2)
  assert stopping.parse('unsafe:0.3') == stopping.UnsafeDropLowConfidence(0.3)
  costs = (1.0, 1.1, 1.25)
  assert stopping.parse('budget:0.5', c=0.2, block_costs=list(costs)) == stopping.Budget(
      c=0.2, prior=0.5, block_costs=costs)
  assert stopping.parse('budget', c=0.2) == stopping.Budget(c=0.2)
  assert stopping.spec(stopping.parse('budget:0.5', c=0.2, block_costs=costs)) == 'budget:0.5'
  assert stopping.takes_block_costs('budget') and not stopping.takes_block_costs('alpha')
  for text in ('fixed', 'confidence:0.4', 'entropy:2.5', 'alpha', 'budget', 'unsafe:0.3'):
    assert stopping.spec(stopping.parse(text)) == text
  for bad in ('confident:0.4', 'confidence:x', 'confidence:1.5', 'entropy:-1', 'fixed:2',
              'alpha:2', 'budget:x'):
    with pytest.raises(ValueError, match='stop rule'):
      stopping.parse(bad)
  # Rules are static jit arguments: equal rules hash equal.
  assert hash(stopping.Confidence(0.4)) == hash(stopping.parse('confidence:0.4'))


# ----------------------------------------------------------------------------- the runner


def test_runner_sweeps_stops_and_verifiers(tmp_path, monkeypatch):
  import os
  import sys
  from specjax import testing
  from specjax.data import bible_tokenizer
  from specjax.errors import ConfigError
  from specjax.runner import config as config_lib
  from specjax.runner import experiment
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from configs import tiny  # pylint: disable=import-outside-toplevel

  from specjax.runner import metrics
  # Timing helpers are not what is tested here (seconds of compiles and repeats each).
  monkeypatch.setattr(metrics, 'measure_c', lambda *a, **k: 0.25)
  monkeypatch.setattr(metrics, 'measure_block_cost', lambda *a, **k: 1.5)
  testing.write_random_pair(tmp_path / 'pair', bible_tokenizer())
  c = tiny.get_config('smoke')
  c.target, c.drafts = str(tmp_path / 'pair' / 'target'), (str(tmp_path / 'pair' / 'draft'),)
  c.output_dir, c.compilation_cache = str(tmp_path / 'out'), ''
  c.temperatures, c.gammas, c.num_examples, c.batch_size, c.max_new_tokens = (1.0,), (3,), 2, 2, 8
  c.stops, c.verifiers, c.repeats = ('fixed', 'confidence:0.4', 'budget'), ('block',), 1
  built = []  # the rules the cells decode with: 'budget' gets c and the block cost curve
  parse = stopping.parse
  monkeypatch.setattr(stopping, 'parse', lambda *a, **k: built.append(parse(*a, **k)) or built[-1])
  for field, bad, message in (('stops', ('confident:0.4',), 'config.stops[0]: stop rule'),
                              ('verifiers', ('blk',), 'config.verifiers')):
    with pytest.raises(ConfigError, match=message.replace('[', r'\[').replace(']', r'\]')):
      config_lib.run_spec(c.to_dict() | {field: bad})
  rows = experiment.run(config_lib.run_spec(c))
  assert sorted((r['stop'], r['verifier']) for r in rows) == [('budget', 'block'),
                                                              ('confidence:0.4', 'block'),
                                                              ('fixed', 'block')]
  assert stopping.Budget(c=0.25, block_costs=(1.0, 1.5, 1.5, 1.5)) in built
  assert len(experiment.cells(config_lib.run_spec(c.to_dict() | {'verifiers': ('token', 'block')}))) == 6
  for r in rows:
    assert r['draft_passes_per_call'] > 0 and r['block_cost'] == 1.5
    assert r['pred_improvement_measured'] == pytest.approx(metrics.predicted_speedup(
        r['tokens_per_target_call'], r['draft_passes_per_call'], 0.25, 1.5))
    assert sum(r['proposed_hist']) > 0
  table = (tmp_path / 'out' / 'table.md').read_text()
  assert '| stop | verify |' in table and 'confidence:0.4' in table
  assert (tmp_path / 'out' / 'tokens_vs_passes.png').exists()
