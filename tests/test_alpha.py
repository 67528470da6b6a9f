"""The acceptance statistics of speculative_decode against the paper's closed forms.

Shapes: B batch, M max_new_tokens, G gamma, V vocab.

With a context-independent target p and draft q (stub models below: every position has the same
distribution), the number of accepted drafts per iteration is i.i.d. with
P(n = k) = alpha^k (1 - alpha) for k < G and P(n = G) = alpha^G, alpha = sum_x min(p(x), q(x))
(Leviathan et al., Thm 3.5 / Def 3.1), so tokens per target call = (1 - alpha^(G+1)) / (1 - alpha).
The paper's worked example (acceptance level) is in tests/test_acceptance.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from specjax.decoding import acceptance
from specjax.decoding import sampling as sampling_lib
from specjax.decoding.loop import speculative_decode
from specjax.models.t5 import T5Config, T5Model, init_params
from specjax.testing import stub_logits as _logits
from specjax.testing import stub_pair  # stub models with known laws

V = 8
P_V = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05])
Q_V = np.array([0.1, 0.25, 0.1, 0.2, 0.05, 0.15, 0.1, 0.05])
B_IID, M_IID = 2000, 64


def processed(p_V):
  """The distribution the loop actually uses (softmax of the float32 logits), float64."""
  return np.asarray(sampling_lib.probs(_logits(p_V), sampling_lib.Sampling(1.0)), np.float64)


def run_stubs(p_V, q_V, gamma, rule=None):
  target, draft = stub_pair(p_V, q_V)
  out = speculative_decode(target, draft, np.full((B_IID, 2), 3, np.int32), gamma=gamma,
                           max_new_tokens=M_IID, temperature=1.0, rng=jax.random.PRNGKey(gamma),
                           eos_id=-1, verifier=acceptance.FunctionVerifier(rule) if rule else 'token')
  assert (np.asarray(out.lengths) == M_IID).all()
  return jax.device_get(out)


def tokens_per_call_formula(alpha, gamma):
  return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def per_call_mean_and_se(hist_G1):
  """Mean and standard error of n + 1 over iterations, from the accepted-count histogram."""
  counts = np.asarray(hist_G1, np.float64)
  k = np.arange(1, len(counts) + 1)
  total = counts.sum()
  mean = (counts * k).sum() / total
  var = (counts * (k - mean) ** 2).sum() / (total - 1)
  return mean, np.sqrt(var / total)


# ----------------------------------------------------------------------------- draft == target


def _tiny_t5():
  config = T5Config(vocab_size=32, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=2,
                    num_heads=2, relative_attention_num_buckets=8,
                    relative_attention_max_distance=16)
  return T5Model(init_params(config, jax.random.PRNGKey(3), scale=1.5), config)


@pytest.mark.parametrize('temperature', [1.0, 0.0])
def test_draft_equal_to_target_accepts_everything(temperature):
  # Catches p and q computed on different positions / prefixes, or a draft cache that is stale
  # after a full acceptance (the draft must catch up on the last draft token and the bonus).
  model = _tiny_t5()
  gamma, max_new, b = 3, 18, 4  # 18 = 4 full blocks of 4 + a final block cut to 2 tokens
  ids = np.array([[5, 6, 7, 0], [9, 10, 0, 0], [11, 12, 13, 14], [5, 6, 7, 0]], np.int32)
  out = speculative_decode(model, model, ids, gamma=gamma, max_new_tokens=max_new,
                           temperature=temperature, rng=jax.random.PRNGKey(0), eos_id=-1)
  stats = out.stats
  assert abs(stats.alpha - 1.0) < 1e-5, stats.alpha
  hist = np.asarray(stats.accepted_hist)
  # Every iteration, the final truncated one included, accepted the full block.
  assert hist[:, :gamma].sum() == 0 and (hist[:, gamma] == 5).all(), hist
  np.testing.assert_array_equal(np.asarray(out.lengths), max_new)
  np.testing.assert_array_equal(np.asarray(stats.target_calls), 5)
  np.testing.assert_array_equal(np.asarray(stats.emitted), 5 * (gamma + 1))  # before the cut
  assert int(stats.iterations) == 5


# ----------------------------------------------------------------------------- disjoint supports


def test_disjoint_supports_alpha_zero():
  # Catches accepting a draft token the target gives probability 0 (u * q < p must fail for p = 0).
  k = 3
  p = np.where(np.arange(V) < k, 1.0 / k, 0.0)
  q = np.where(np.arange(V) >= k, 1.0 / (V - k), 0.0)
  out = run_stubs(p, q, gamma=3)
  stats = out.stats
  assert stats.alpha == 0.0
  assert stats.tokens_per_target_call == 1.0
  hist = np.asarray(stats.accepted_hist)
  assert hist[:, 1:].sum() == 0
  np.testing.assert_array_equal(np.asarray(stats.target_calls), M_IID)  # one token per call
  assert (np.asarray(out.tokens) < k).all()


# ----------------------------------------------------------------------------- i.i.d. acceptance


@pytest.mark.parametrize('gamma', [1, 3, 5])
def test_iid_acceptance_matches_closed_forms(gamma):
  # Catches a biased acceptance rule, alpha counted on the wrong positions, emitted tokens
  # miscounted, or a dropped/duplicated bonus token (which all move tokens per call).
  p, q = processed(P_V), processed(Q_V)
  alpha = float(np.minimum(p, q).sum())
  assert abs(alpha - 0.7) < 1e-6
  stats = run_stubs(P_V, Q_V, gamma).stats
  # Every verified position sees the same p and q, so the estimate is alpha up to rounding.
  assert abs(stats.alpha - alpha) < 1e-5, (stats.alpha, alpha)
  hist = np.asarray(stats.accepted_hist).sum(0)
  mean, se = per_call_mean_and_se(hist)
  assert abs(stats.tokens_per_target_call - mean) < 1e-9
  expected = tokens_per_call_formula(alpha, gamma)
  assert abs(mean - expected) < 4 * se, (gamma, mean, expected, se)
  # The whole histogram: P(n = k) = alpha^k (1 - alpha), k < G; alpha^G at k = G.
  law = np.append(alpha ** np.arange(gamma) * (1 - alpha), alpha ** gamma)
  pvalue = scipy.stats.chisquare(hist, hist.sum() * law).pvalue
  assert pvalue > 1e-3, (gamma, hist, pvalue)
  # Negative control: the formula with the wrong exponent is far outside the same error bar.
  wrong = (1 - alpha ** gamma) / (1 - alpha)
  assert abs(mean - wrong) > 10 * se, (gamma, mean, wrong, se)


def verify_dropped_bonus(key, draft_tokens_G, q_GxV, p_G1xV, n=None):
  """When all G drafts pass, emit them without the bonus token (n = G-1, next = draft[G-1]).

  The output law is still exact (see test_exactness.py), but tokens per call drop to
  (1 - alpha^G) / (1 - alpha): only the acceptance statistics can see this bug.
  """
  g = draft_tokens_G.shape[0]
  m, nxt = acceptance.verify(key, draft_tokens_G, q_GxV, p_G1xV, n)
  full = m == g
  return jnp.where(full, g - 1, m), jnp.where(full, draft_tokens_G[g - 1], nxt)


def test_dropped_bonus_is_detected_by_tokens_per_call():
  # Negative control for the tokens-per-call check: a loop that forgets the bonus token.
  gamma = 3
  alpha = float(np.minimum(processed(P_V), processed(Q_V)).sum())
  stats = run_stubs(P_V, Q_V, gamma, rule=verify_dropped_bonus).stats
  mean, se = per_call_mean_and_se(np.asarray(stats.accepted_hist).sum(0))
  assert abs(mean - tokens_per_call_formula(alpha, gamma)) > 10 * se, (mean, se)
  assert abs(mean - (1 - alpha ** gamma) / (1 - alpha)) < 4 * se, (mean, se)
