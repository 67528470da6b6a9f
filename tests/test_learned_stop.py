"""The learned stop rule (stopping.Learned) and its fitting (decoding.acceptance_predictor).

Its law test and greedy identity run with the other rules in tests/test_stopping.py (EXACT_RULES
'learned'). Here: the rule stops on its running product of predicted acceptances (its carried
state), the same in the token-by-token rollout, in `cut` and in the fitter's offline replay; the
traced log holds the drafts' features and their betas with the loop's semantics; the fit recovers
a known predictor and chooses its threshold by tokens per cost; files round-trip and bad ones
fail with the file's name.

Shapes: B rows, G drafts, V vocab, F stopping.FEATURES, I logged iterations.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import stopping
from specjax.decoding import acceptance_predictor as ap
from specjax.decoding import protocol
from specjax.decoding.loop import speculative_decode
from specjax.testing import spread_pair

B, G, V = 64, 5, 7


def random_block(seed=0):
  """(tokens [B, G], q [B, G, V]): random draft distributions and tokens drawn from them."""
  rng = np.random.default_rng(seed)
  q = rng.dirichlet(np.full(V, 0.4), size=(B, G)).astype(np.float32)
  x = np.array([[rng.choice(V, p=q[b, k] / q[b, k].sum()) for k in range(G)] for b in range(B)])
  return jnp.asarray(x, jnp.int32), jnp.asarray(q)


def features_of(x_BxG, q_BxGxV):
  return np.stack([np.asarray(stopping.features(q_BxGxV[:, k], x_BxG[:, k], k))
                   for k in range(x_BxG.shape[1])], axis=1)


RULE = stopping.Learned(weights=(0.8, 0.3, -0.2, -0.1), bias=1.2, threshold=0.3)


def test_stops_on_the_running_product_in_rollout_cut_and_replay():
  x, q = random_block()
  limit = jnp.full((B,), G, jnp.int32)
  n_cut = np.asarray(protocol.cut(RULE, x, q, limit))

  def advance(carry, x_B, k):
    return carry, q[:, k + 1]
  prop = protocol.rollout(advance, (), q[:, 0], lambda k, _: x[:, k], gamma=G, stop=RULE,
                          limit_B=limit)
  np.testing.assert_array_equal(np.asarray(prop.n_B), n_cut)
  log = ap.Log(features=features_of(x, q), beta=np.zeros((B, G)), n=np.full(B, G))
  np.testing.assert_array_equal(ap.lengths(RULE, log), n_cut)
  # By hand: the first k with sum_{j<=k} log sigmoid(w.f_j + b) < log 0.3, then n = k + 1.
  logit = log.features.astype(np.float64) @ np.asarray(RULE.weights) + RULE.bias
  below = np.cumsum(np.log(1 / (1 + np.exp(-logit))), axis=1) < np.log(0.3)
  np.testing.assert_array_equal(n_cut, np.where(below.any(1), below.argmax(1) + 1, G))
  # Control: judging each a_k alone (no carried product) stops at different places here, so the
  # state is what decides.
  alone = np.log(1 / (1 + np.exp(-logit))) < np.log(0.3)
  n_alone = np.where(alone.any(1), alone.argmax(1) + 1, G)
  assert (n_alone != n_cut).mean() > 0.1, (n_alone, n_cut)
  assert 1 < len(set(n_cut.tolist()))


def test_recorded_trace_has_features_and_betas():
  target, draft = spread_pair(noise=0.2)
  prompts = np.random.default_rng(1).integers(2, 12, (8, 6)).astype(np.int32)
  for temperature in (0.0, 1.0):
    kw = dict(gamma=3, max_new_tokens=8, temperature=temperature, rng=3, eos_id=-1)
    out = speculative_decode(target, draft, prompts, trace=True,
                             stop=ap.Recorder(stopping.Fixed()), **kw)
    plain = speculative_decode(target, draft, prompts, **kw)
    np.testing.assert_array_equal(out.tokens, plain.tokens)  # it only watches
    log = ap.Log.from_trace(out)
    accepted = np.asarray(out.trace_accepted)[np.asarray(out.trace_proposed) >= 0]
    assert (log.n == 3).all() and len(log.n) == len(accepted)
    assert ((log.beta >= 0) & (log.beta <= 1 + 1e-6)).all()
    assert (log.features[..., 3] == np.arange(3)).all()  # depth
    assert (log.features[..., 2] > 0).any() and (log.features[..., 0] < 0).all()
    if temperature == 0:  # beta is the 0/1 argmax match: 1 before the first rejection, 0 at it
      assert set(np.unique(log.beta).tolist()) <= {0.0, 1.0}
      for beta_G, m in zip(log.beta, accepted):
        assert (beta_G[:m] == 1).all() and (m == 3 or beta_G[m] == 0)
      np.testing.assert_allclose(log.features[..., 0], log.features[..., 1])  # x = argmax
  not_recorded = speculative_decode(target, draft, prompts, trace=True, **kw)
  assert not np.asarray(not_recorded.trace_features).any()


def synthetic_log(w, b, n=4000, seed=0):
  """Features like a draft's and betas drawn as sigmoid(w.f + b) plus noise."""
  rng = np.random.default_rng(seed)
  log_qx = -rng.exponential(0.8, (n, G))
  f = np.stack([log_qx, np.maximum(log_qx, -rng.exponential(0.3, (n, G))),
                rng.uniform(0, 2, (n, G)), np.broadcast_to(np.arange(G), (n, G))], -1)
  beta = 1 / (1 + np.exp(-(f @ np.asarray(w) + b)))
  beta = np.clip(beta + rng.normal(0, 0.05, beta.shape), 0, 1)
  return ap.Log(features=f.astype(np.float32), beta=beta, n=np.full(n, G))


def test_fit_recovers_the_predictor_and_prices_the_threshold():
  w, b = (1.5, 0.5, -0.8, -0.2), 3.0  # betas ~0.55-0.7 on average, widely spread
  log = synthetic_log(w, b)
  dear = [1.0, 1.1, 1.2, 1.35, 1.5, 1.7]  # a block that grows dear: stopping early can pay
  rule, rep = ap.fit(log, dear)
  np.testing.assert_allclose(rule.weights, w, atol=0.1)
  assert abs(rule.bias - b) < 0.15
  assert rep['brier'] < 0.5 * rep['brier_constant']
  assert rep['vs_best_fixed'] > 1.015 and 0 < rule.threshold < 1
  assert rep['rate'] == pytest.approx(ap.rate(log, ap.lengths(rule, log), dear))
  assert rep['rate'] >= max(rep['fixed_rates'].values())
  # A free block: never stopping (threshold 0, all G drafts) is best.
  flat_rule, flat = ap.fit(log, [1.0] * (G + 1))
  assert flat_rule.threshold == 0.0 and flat['mean_length'] == G
  with pytest.raises(ValueError, match='costs'):
    ap.fit(log, dear[:-1])


def test_save_load_parse_and_errors(tmp_path):
  path = tmp_path / 'pred.json'
  RULE.save(str(path), fitted_on='test')
  loaded = stopping.parse(f'learned:{path}')
  assert loaded.weights == RULE.weights and loaded.threshold == RULE.threshold
  assert stopping.spec(loaded) == f'learned:{path}'
  assert json.loads(path.read_text())['fitted_on'] == 'test'
  with pytest.raises(ValueError, match=r"learned:.*nope.json: not found"):
    stopping.parse(f'learned:{tmp_path}/nope.json')
  bad = tmp_path / 'bad.json'
  bad.write_text(json.dumps({'features': ['log_qx'], 'weights': [1.0], 'bias': 0,
                             'threshold': 0.5}))
  with pytest.raises(ValueError, match='bad.json'):
    stopping.parse(f'learned:{bad}')
  bad.write_text('{')
  with pytest.raises(ValueError, match='bad.json'):
    stopping.parse(f'learned:{bad}')
  with pytest.raises(ValueError, match='predictor file'):
    stopping.parse('learned')
  with pytest.raises(ValueError, match='weights'):
    stopping.Learned(weights=(1.0,))
  assert stopping.Learned.exact and stopping.may_shorten(RULE)
  assert not stopping.may_shorten(ap.Recorder(stopping.Fixed()))
  assert stopping.may_shorten(ap.Recorder(stopping.Confidence()))
  assert hash(RULE) == hash(stopping.Learned(weights=RULE.weights, bias=1.2, threshold=0.3))
  jax.jit(lambda q: RULE.after_carry(RULE.start(2, 3), q, jnp.array([0, 1]), 0))(
      jnp.full((2, V), 1 / V))
