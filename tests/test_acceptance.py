"""Tests for specjax.decoding.acceptance and specjax.decoding.sampling.

Shapes: N trials, G gamma, V vocab.

Exactness is tested statistically on context-independent distributions (p_i, q_i
fixed per position), where the law of one emitted block is fully enumerable:
P(emit y_0..y_k, n = k) = prod_{i<k} min(p_i, q_i)(y_i) * r_k(y_k), with
r_k = max(0, p_k - q_k) for k < G and r_G = p_G (bonus).  The same chi-square
helpers are run on deliberately broken verify functions to prove they have power.
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import functools
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chi2 import chi2_pvalue  # tests/chi2.py
from specjax.decoding.acceptance import accept_prefix, alpha_terms, out_of_range, residual, verify
from specjax.decoding.sampling import Sampling, has_nan, probs, sample

# ---------------------------------------------------------------------------
# Exact laws

V, G, N_TRIALS = 4, 3, 50_000


def _context_free_dists():
  """Fixed per-position q_GxV and p_G1xV (float32, rows sum to 1)."""
  rng = np.random.default_rng(0)
  q_GxV = rng.dirichlet(np.ones(V), size=G).astype(np.float32)
  p_G1xV = rng.dirichlet(np.ones(V), size=G + 1).astype(np.float32)
  return q_GxV / q_GxV.sum(-1, keepdims=True), p_G1xV / p_G1xV.sum(-1, keepdims=True)


Q_GxV, P_G1xV = _context_free_dists()


@functools.lru_cache(maxsize=None)
def run_trials(verify_fn, seed=1):
  """N independent blocks: drafts ~ q inside the trial, then verify_fn.

  Returns numpy (n_N, tokens_NxG1) with tokens beyond the emitted n+1 set to -1.
  """
  q_GxV, p_G1xV = jnp.asarray(Q_GxV), jnp.asarray(P_G1xV)

  def trial(key):
    key_draft, key_verify = jax.random.split(key)
    drafts_G = sample(key_draft, q_GxV)
    n, next_token = verify_fn(key_verify, drafts_G, q_GxV, p_G1xV)
    tokens_G1 = jnp.concatenate([drafts_G, jnp.zeros((1,), jnp.int32)]).at[n].set(next_token)
    return n, jnp.where(jnp.arange(G + 1) <= n, tokens_G1, -1)

  keys_N = jax.random.split(jax.random.key(seed), N_TRIALS)
  n_N, tokens_NxG1 = jax.jit(jax.vmap(trial))(keys_N)
  return np.asarray(n_N), np.asarray(tokens_NxG1)


def exact_block_law():
  """Enumerated law of (n, y_0..y_n); cells ordered by n, then lexicographic y."""
  q, p = Q_GxV.astype(np.float64), P_G1xV.astype(np.float64)
  m_GxV = np.minimum(p[:G], q)
  r_G1xV = np.concatenate([np.maximum(p[:G] - q, 0.0), p[G:]])
  law = []
  for k in range(G + 1):
    for ys in itertools.product(range(V), repeat=k + 1):
      law.append(np.prod([m_GxV[i, ys[i]] for i in range(k)]) * r_G1xV[k, ys[k]])
  return np.array(law)


def block_counts(n_N, tokens_NxG1):
  """Histogram of emitted blocks in the cell order of exact_block_law."""
  offsets = np.cumsum([0] + [V ** (k + 1) for k in range(G + 1)])
  counts = np.zeros(offsets[-1], np.int64)
  for k in range(G + 1):
    ys = tokens_NxG1[n_N == k, : k + 1]
    codes = ys @ (V ** np.arange(k, -1, -1))
    counts[offsets[k] : offsets[k + 1]] += np.bincount(codes, minlength=V ** (k + 1))
  return counts


def block_law_pvalue(verify_fn):
  return chi2_pvalue(block_counts(*run_trials(verify_fn)), exact_block_law())


def first_token_pvalue(verify_fn):
  _, tokens_NxG1 = run_trials(verify_fn)
  return chi2_pvalue(np.bincount(tokens_NxG1[:, 0], minlength=V), P_G1xV[0])


def num_accepted_law():
  """P(n = k) from P(n >= k) = prod_{i<k} alpha_i."""
  alpha_G = np.minimum(P_G1xV[:G], Q_GxV).astype(np.float64).sum(-1)
  at_least_G1 = np.concatenate([[1.0], np.cumprod(alpha_G)])
  return at_least_G1 - np.append(at_least_G1[1:], 0.0)


# ---------------------------------------------------------------------------
# Broken verify functions (negative controls)


def verify_always_accept(key, draft_tokens_G, q_GxV, p_G1xV, n=None):
  n = jnp.int32(draft_tokens_G.shape[0]) if n is None else n
  return n, sample(key, p_G1xV[n])


def _verify_with(key, draft_tokens_G, q_GxV, p_G1xV, rejection_dist, bonus_row):
  g = draft_tokens_G.shape[0]
  key_u, key_next = jax.random.split(key)
  u_G = jax.random.uniform(key_u, (g,))
  n = accept_prefix(draft_tokens_G, q_GxV, p_G1xV, u_G)
  q_V = q_GxV[jnp.minimum(n, g - 1)]
  dist_V = jnp.where(n < g, rejection_dist(p_G1xV[n], q_V), p_G1xV[bonus_row])
  return n, sample(key_next, dist_V)


def verify_residual_is_p(key, d, q, p, n=None):
  return _verify_with(key, d, q, p, lambda p_V, q_V: p_V, q.shape[0])


def verify_replacement_from_q(key, d, q, p, n=None):
  return _verify_with(key, d, q, p, lambda p_V, q_V: q_V, q.shape[0])


def verify_bonus_dropped(key, d, q, p, n=None):
  """Off-by-one bonus: after G accepts, samples p_{G-1} instead of p_G."""
  return _verify_with(key, d, q, p, residual, q.shape[0] - 1)


# ---------------------------------------------------------------------------
# Exactness of verify


def test_block_law_is_exact():
  pv = block_law_pvalue(verify)
  print(f'block law p-value {pv:.4g}')
  assert pv > 1e-3


def test_first_token_is_p0():
  pv = first_token_pvalue(verify)
  print(f'first token p-value {pv:.4g}')
  assert pv > 1e-3


def test_num_accepted_law():
  n_N, _ = run_trials(verify)
  pv = chi2_pvalue(np.bincount(n_N, minlength=G + 1), num_accepted_law())
  print(f'n histogram p-value {pv:.4g}')
  assert pv > 1e-3
  np.testing.assert_allclose(
    alpha_terms(jnp.asarray(Q_GxV), jnp.asarray(P_G1xV)),
    np.minimum(P_G1xV[:G], Q_GxV).sum(-1),
    rtol=1e-6,
  )


def test_first_two_tokens_joint_law():
  """Given n >= 1: y_0 ~ min(p_0, q_0)/alpha_0 and y_1 ~ p_1, independently."""
  n_N, tokens_NxG1 = run_trials(verify)
  y_Nx2 = tokens_NxG1[n_N >= 1, :2]
  counts = np.bincount(y_Nx2[:, 0] * V + y_Nx2[:, 1], minlength=V * V)
  m0_V = np.minimum(P_G1xV[0], Q_GxV[0]).astype(np.float64)
  law = np.outer(m0_V / m0_V.sum(), P_G1xV[1]).ravel()
  pv = chi2_pvalue(counts, law)
  print(f'two-token joint p-value {pv:.4g}')
  assert pv > 1e-3


@pytest.mark.parametrize(
  'broken_verify, first_token_detects',
  [
    (verify_always_accept, True),
    (verify_residual_is_p, True),
    (verify_replacement_from_q, True),
    (verify_bonus_dropped, False),
  ],
)
def test_negative_controls_are_detected(broken_verify, first_token_detects):
  pv_block = block_law_pvalue(broken_verify)
  pv_first = first_token_pvalue(broken_verify)
  print(f'{broken_verify.__name__}: block p-value {pv_block:.3g}, first token {pv_first:.3g}')
  assert pv_block < 1e-6
  if first_token_detects:
    assert pv_first < 1e-6


# ---------------------------------------------------------------------------
# The paper's worked example (vocab A, B, C = 0, 1, 2)

A, B, C = 0, 1, 2
PAPER_Q = jnp.array([[0.2, 0.7, 0.1], [0.6, 0.1, 0.3], [0.1, 0.1, 0.8]], jnp.float32)
PAPER_P = jnp.array(
  [[0.5, 0.3, 0.2], [0.7, 0.2, 0.1], [0.1, 0.5, 0.4], [0.3, 0.4, 0.3]], jnp.float32
)
PAPER_DRAFTS = jnp.array([B, A, C], jnp.int32)


def test_paper_example_rejects_third_and_emits_b():
  n = accept_prefix(PAPER_DRAFTS, PAPER_Q, PAPER_P, jnp.array([0.35, 0.99, 0.72]))
  assert n.dtype == jnp.int32 and int(n) == 2
  r_V = residual(PAPER_P[2], PAPER_Q[2])
  np.testing.assert_allclose(r_V, [0.0, 1.0, 0.0], atol=1e-6)
  out = list(np.asarray(PAPER_DRAFTS[:n])) + [int(sample(jax.random.key(0), r_V))]
  assert out == [B, A, B]


def test_paper_example_paths():
  assert int(accept_prefix(PAPER_DRAFTS, PAPER_Q, PAPER_P, jnp.full((3,), 0.01))) == 3
  assert int(accept_prefix(PAPER_DRAFTS, PAPER_Q, PAPER_P, jnp.array([0.9, 0.0, 0.0]))) == 0
  # First rejection resamples from norm(max(0, p_0 - q_0)) = (.75, 0, .25).
  np.testing.assert_allclose(residual(PAPER_P[0], PAPER_Q[0]), [0.75, 0.0, 0.25], atol=1e-6)
  np.testing.assert_allclose(alpha_terms(PAPER_Q, PAPER_P), [0.6, 0.8, 0.6], atol=1e-6)


def test_paper_example_verify_outcome_law():
  """(n, next) law for fixed drafts [B, A, C]: A is always accepted after B."""
  keys = jax.random.split(jax.random.key(3), 20_000)
  n_N, next_N = jax.jit(jax.vmap(lambda k: verify(k, PAPER_DRAFTS, PAPER_Q, PAPER_P)))(keys)
  n_N, next_N = np.asarray(n_N), np.asarray(next_N)
  accept_b = 0.3 / 0.7
  law = np.concatenate([
    (1 - accept_b) * np.array([0.75, 0.0, 0.25]),  # n = 0
    np.zeros(3),  # n = 1 impossible: .6 * u < .7 always
    accept_b * 0.5 * np.array([0.0, 1.0, 0.0]),  # n = 2: residual is one-hot B
    accept_b * 0.5 * np.asarray(PAPER_P[3], np.float64),  # n = 3: bonus from p_3
  ])
  pv = chi2_pvalue(np.bincount(n_N * 3 + next_N, minlength=12), law)
  assert pv > 1e-3


def test_all_accepted_takes_bonus_from_last_row():
  p = PAPER_P.at[3].set(jnp.array([0.0, 0.0, 1.0]))
  keys = jax.random.split(jax.random.key(4), 64)
  n_N, next_N = jax.vmap(lambda k: verify(k, PAPER_DRAFTS, p[:3], p))(keys)  # q == p: accept all
  assert np.all(np.asarray(n_N) == 3) and np.all(np.asarray(next_N) == C)


def test_accept_compares_without_dividing():
  q = jnp.array([[0.0, 1.0], [0.5, 0.5]])
  p = jnp.array([[0.5, 0.5], [0.0, 1.0], [0.5, 0.5]])
  # q(x) = 0 < p(x): accepted; then p(x) = 0: rejected even with u = 0.
  assert int(accept_prefix(jnp.array([0, 0]), q, p, jnp.zeros(2))) == 1


# ---------------------------------------------------------------------------
# Residual


def test_residual_properties():
  rng = np.random.default_rng(5)
  p_BxV = jnp.asarray(rng.dirichlet(np.ones(7), size=32), jnp.float32)
  q_BxV = jnp.asarray(rng.dirichlet(np.ones(7), size=32), jnp.float32)
  r_BxV = jax.vmap(residual)(p_BxV, q_BxV)
  assert r_BxV.dtype == jnp.float32
  assert np.all(np.asarray(r_BxV) >= 0)
  np.testing.assert_allclose(r_BxV.sum(-1), 1.0, atol=1e-5)
  assert np.all(np.asarray(r_BxV)[np.asarray(q_BxV >= p_BxV)] == 0)
  np.testing.assert_allclose(jax.vmap(residual)(p_BxV, p_BxV), p_BxV)
  onehot = jnp.array([0.0, 1.0, 0.0])
  np.testing.assert_array_equal(residual(onehot, onehot), onehot)


# ---------------------------------------------------------------------------
# Greedy limit


def test_greedy_reduces_to_argmax_matching():
  n_cases, g, v = 64, 4, 7
  rng = np.random.default_rng(6)
  target_logits = rng.normal(size=(n_cases, g + 1, v)).astype(np.float32)
  argmax_p = target_logits.argmax(-1)
  match = rng.random((n_cases, g)) < 0.7
  wrong = (argmax_p[:, :g] + rng.integers(1, v, (n_cases, g))) % v
  drafts = np.where(match, argmax_p[:, :g], wrong)
  draft_logits = rng.normal(size=(n_cases, g, v)).astype(np.float32)
  np.put_along_axis(draft_logits, drafts[..., None], 10.0, axis=-1)

  greedy = Sampling()
  p = probs(jnp.asarray(target_logits), greedy)
  q = probs(jnp.asarray(draft_logits), greedy)
  np.testing.assert_array_equal(p, jax.nn.one_hot(argmax_p, v))
  np.testing.assert_array_equal(q, jax.nn.one_hot(drafts, v))

  expected_n = np.cumprod(drafts == argmax_p[:, :g], axis=-1).sum(-1)
  expected_next = argmax_p[np.arange(n_cases), expected_n]
  batched = jax.jit(jax.vmap(verify))
  for seed in range(3):
    keys = jax.random.split(jax.random.key(seed), n_cases)
    n, nxt = batched(keys, jnp.asarray(drafts, jnp.int32), q, p)
    np.testing.assert_array_equal(n, expected_n)
    np.testing.assert_array_equal(nxt, expected_next)


# ---------------------------------------------------------------------------
# sampling.probs / sample / validate


def test_greedy_probs_tie_takes_first_index():
  np.testing.assert_array_equal(probs(jnp.array([1.0, 3.0, 3.0]), Sampling()), [0.0, 1.0, 0.0])


def test_top_k_keeps_exactly_k():
  logits = jax.random.normal(jax.random.key(7), (3, 5, 10))
  pr = probs(logits, Sampling(temperature=1.0, top_k=3))
  assert np.all((np.asarray(pr) > 0).sum(-1) == 3)
  top3 = np.argsort(-np.asarray(logits), axis=-1)[..., :3]
  assert np.all(np.take_along_axis(np.asarray(pr), top3, -1) > 0)
  np.testing.assert_allclose(pr.sum(-1), 1.0, atol=1e-6)
  # Ties at the k-th value: keep exactly k, lower index first.
  tied = probs(jnp.array([0.0, 2.0, 2.0, 2.0, 1.0]), Sampling(temperature=1.0, top_k=2))
  np.testing.assert_allclose(tied, [0.0, 0.5, 0.5, 0.0, 0.0], atol=1e-6)


def test_top_p_hand_example():
  logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
  pr = probs(logits, Sampling(temperature=1.0, top_p=0.8))
  np.testing.assert_allclose(pr, [0.625, 0.375, 0.0, 0.0], atol=1e-6)
  # The top token is always kept, however small top_p.
  np.testing.assert_allclose(probs(logits, Sampling(temperature=1.0, top_p=1e-3)), [1, 0, 0, 0])
  # top_k then top_p: k=3 gives (.5, .3, .15)/.95; top_p=.9 needs all three.
  np.testing.assert_allclose(
    probs(logits, Sampling(temperature=1.0, top_k=3, top_p=0.9)),
    np.array([0.5, 0.3, 0.15, 0.0]) / 0.95,
    atol=1e-6,
  )


def test_temperature_and_jit_vmap_static():
  logits = jax.random.normal(jax.random.key(8), (2, 3, 6)) * 3
  for t in (0.5, 1.0, 2.0):
    s = Sampling(temperature=t)
    expected = jax.nn.softmax(logits / t, -1)
    np.testing.assert_allclose(probs(logits, s), expected, rtol=1e-5, atol=1e-7)
  s = Sampling(temperature=0.7, top_k=4, top_p=0.9)
  jitted = jax.jit(probs, static_argnums=1)(logits, s)
  vmapped = jax.vmap(lambda l: probs(l, s))(logits)
  np.testing.assert_allclose(jitted, probs(logits, s), atol=1e-7)
  np.testing.assert_allclose(vmapped, jitted, atol=1e-7)
  assert jitted.dtype == jnp.float32
  np.testing.assert_allclose(jitted.sum(-1), 1.0, atol=1e-6)
  assert probs(logits.astype(jnp.bfloat16), s).dtype == jnp.float32


def test_validate_names_field():
  Sampling(temperature=1.0, top_k=5, top_p=0.9).validate()
  assert hash(Sampling()) == hash(Sampling(0.0, 0, 1.0)) and Sampling().greedy
  with pytest.raises(ValueError, match='temperature'):
    Sampling(temperature=-1.0).validate()
  with pytest.raises(ValueError, match='top_k'):
    Sampling(temperature=1.0, top_k=-1).validate()
  for bad in (0.0, 1.5, -0.1):
    with pytest.raises(ValueError, match='top_p'):
      Sampling(temperature=1.0, top_p=bad).validate()


def test_has_nan():
  logits = jnp.array([[0.0, 1.0], [jnp.nan, 1.0]])
  np.testing.assert_array_equal(has_nan(logits), [False, True])


def test_sample_frequencies():
  pr_V = jnp.array([0.5, 0.0, 0.2, 0.3, 0.0])
  draws = sample(jax.random.key(9), jnp.broadcast_to(pr_V, (50_000, 5)))
  assert draws.dtype == jnp.int32 and draws.shape == (50_000,)
  counts = np.bincount(np.asarray(draws), minlength=5)
  assert counts[1] == 0 and counts[4] == 0
  pv = chi2_pvalue(counts, pr_V)
  print(f'sample() p-value {pv:.4g}')
  assert pv > 1e-3


# ---------------------------------------------------------------------------
# Draft ids out of range (precondition 0 <= id < V)


def test_out_of_range_draft_is_never_accepted_and_flagged():
  # Without the check, id -1 indexes row V-1 (accepted when q and p agree there) and is emitted.
  v, g = 4, 3
  onehot_GxV = jnp.zeros((g, v)).at[:, v - 1].set(1.0)
  p_G1xV = jnp.zeros((g + 1, v)).at[:, v - 1].set(1.0)
  for bad in (-1, v, v + 7):
    drafts_G = jnp.array([bad, v - 1, v - 1], jnp.int32)
    for seed in range(3):
      m, nxt = verify(jax.random.key(seed), drafts_G, onehot_GxV, p_G1xV)
      assert int(m) == 0 and int(nxt) == v - 1, (bad, m, nxt)
    # A bad id after the proposal's end is padding: not flagged; inside it: flagged.
    assert bool(out_of_range(drafts_G[None], jnp.array([1]), v))
    assert not bool(out_of_range(drafts_G[None, ::-1], jnp.array([2]), v))
  # Accepted up to the bad id, then the target's token.
  m, _ = verify(jax.random.key(0), jnp.array([v - 1, -1, v - 1]), onehot_GxV, p_G1xV)
  assert int(m) == 1
