"""Block verification (acceptance.block_verify): exact law, never fewer accepted drafts, greedy limit.

Shapes: R rows (independent blocks), G block width, G1 = G + 1, V vocab, T = G + 1 emitted tokens.

The drafts and targets are random probability *trees* (every prefix has its own p and q row), so
the tests see the context dependence that block verification exploits. Two kinds of check:
  - the derivation: the stop law of the docstring, enumerated exactly over every block in float64,
    gives the target's law exactly and at least token verification's E[accepted];
  - the implementation: R blocks drawn from q and verified by the jitted function, completed to T
    tokens by sampling the target tree; the joint law of the T tokens is compared by chi-square
    with the exact target law (p > 1e-3), and a broken variant must be rejected (p < 1e-6).
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chi2 import chi2_pvalue  # tests/chi2.py
from specjax.decoding import acceptance
from specjax.decoding.sampling import sample

V, G, R = 3, 3, 120_000
T = G + 1


def random_trees(seed, concentration=0.5):
  """p[L] [V]*L + [V] for L = 0..G (the bonus row included), q[L] for L = 0..G-1 (Dirichlet)."""
  rng = np.random.default_rng(seed)
  p = [rng.dirichlet(np.full(V, concentration), size=(V,) * L) for L in range(G + 1)]
  q = [rng.dirichlet(np.full(V, concentration), size=(V,) * L) for L in range(G)]
  return p, q


def target_law(p):
  """P(y_1 .. y_T) [V]*T, float64."""
  law = np.ones(())
  for L in range(T):
    law = law[..., None] * p[L]
  return law


# ----------------------------------------------------------------------------- the derivation


def block_stop_law(p, q, x, n):
  """P(tau = i | X^n = x[:n]) for i = 0..n, and the weights w (the docstring's formulas)."""
  w = [1.0]
  for i in range(n):
    w.append(min(1.0, w[-1] * p[i][tuple(x[:i])][x[i]] / q[i][tuple(x[:i])][x[i]]))
  rho = [np.maximum(w[i] * p[i][tuple(x[:i])] - q[i][tuple(x[:i])], 0).sum() for i in range(n)]
  h = [r / (r + 1 - w[i]) if r + 1 - w[i] > 0 else 1.0 for i, r in enumerate(rho)] + [w[n]]
  stop, left = np.zeros(n + 1), 1.0
  for i in range(n, -1, -1):  # right to left
    hi = 1.0 if i == 0 else h[i]
    stop[i], left = left * hi, left * (1 - hi)
  return stop, w


def token_stop_law(p, q, x, n):
  acc, stop = 1.0, np.zeros(n + 1)
  for i in range(n):
    r = min(1.0, p[i][tuple(x[:i])][x[i]] / q[i][tuple(x[:i])][x[i]])
    stop[i] = acc * (1 - r)
    acc *= r
  stop[n] = acc
  return stop


def exact_output_law(p, q, n, residual):
  """Exact law of the T emitted tokens (block, then the target) for proposal length n."""
  law = np.zeros((V,) * T)
  for x in itertools.product(range(V), repeat=G):
    qx = np.prod([q[i][x[:i]][x[i]] for i in range(n)]) if n else 1.0
    if qx == 0 or x[n:] != (0,) * (G - n):  # the drafts beyond n do not matter: count them once
      continue
    stop, w = block_stop_law(p, q, x, n)
    for tau in range(n + 1):
      prefix = x[:tau]
      if tau < n:
        y = residual(w[tau] * p[tau][prefix], q[tau][prefix])
      else:
        y = p[tau][prefix]
      head = np.zeros((V,) * (tau + 1))
      head[prefix] = y
      tail = head
      for L in range(tau + 1, T):
        tail = tail[..., None] * p[L]
      law += qx * stop[tau] * tail
  return law


def block_residual(wp, q):
  d = np.maximum(wp - q, 0)
  return d / d.sum() if d.sum() > 0 else wp / wp.sum()


def token_residual(wp, q):  # the wrong one: ignores the weight w
  return block_residual(wp / wp.sum(), q)


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_derivation_is_exact_for_every_n(seed):
  p, q = random_trees(seed)
  for n in range(G + 1):
    np.testing.assert_allclose(exact_output_law(p, q, n, block_residual), target_law(p),
                               atol=1e-12)


# Trees where the token residual is far off (total variation 0.026; for many random trees it is
# below 0.005 and a law test of feasible size could not see it).
CONTROL_TREES = dict(seed=2, concentration=1.0)


def test_derivation_with_the_token_residual_is_wrong():
  p, q = random_trees(**CONTROL_TREES)
  tv = np.abs(exact_output_law(p, q, G, token_residual) - target_law(p)).sum() / 2
  assert tv > 0.02, tv


def expected_accepted(p, q, n, stop_law):
  total = 0.0
  for x in itertools.product(range(V), repeat=n):
    qx = np.prod([q[i][x[:i]][x[i]] for i in range(n)]) if n else 1.0
    stop = stop_law(p, q, x + (0,) * (G - n), n)
    stop = stop[0] if isinstance(stop, tuple) else stop
    total += qx * np.dot(stop, np.arange(n + 1))
  return total


def test_never_fewer_accepted_than_token_verification():
  gains = []
  for seed in range(40):
    p, q = random_trees(seed, concentration=[0.3, 1.0, 3.0][seed % 3])
    block, token = (expected_accepted(p, q, G, block_stop_law),
                    expected_accepted(p, q, G, token_stop_law))
    assert block >= token - 1e-12, (seed, block, token)
    gains.append(block - token)
  assert max(gains) > 0.01, gains  # and strictly more somewhere


# ----------------------------------------------------------------------------- the implementation


def verify_with_token_residual(key, draft_tokens_G, q_GxV, p_G1xV, n=None):
  """Broken on purpose: block verification's tau, but the token rule's residual norm(max(p-q, 0))
  in place of norm(max(w_tau p - q, 0))."""
  g = draft_tokens_G.shape[0]
  n = jnp.int32(g) if n is None else n
  tau, nxt = acceptance.block_verify(key, draft_tokens_G, q_GxV, p_G1xV, n)
  q_G1xV = jnp.concatenate([q_GxV, jnp.zeros_like(q_GxV[:1])], axis=0)
  wrong = sample(jax.random.fold_in(key, 7), acceptance.residual(p_G1xV[tau], q_G1xV[tau]))
  return tau, jnp.where(tau < n, wrong, nxt)


def sample_rows(rng, rows):
  """One token per row from rows [R, V] (inverse CDF)."""
  u = rng.random(len(rows))[:, None]
  return np.minimum((np.cumsum(rows, axis=1) < u).sum(1), V - 1)


def tree_rows(tree, L, prefix_RxL):
  return tree[L][tuple(prefix_RxL[:, i] for i in range(L))] if L else np.broadcast_to(
      tree[0], (len(prefix_RxL), V))


@functools.lru_cache(maxsize=None)
def _jitted(fn):
  return jax.jit(jax.vmap(fn))


def run_blocks(fn, seed, variable_n, concentration):
  """R blocks drafted from q, verified by `fn`, completed by the target: (counts [V]*T, tau)."""
  p, q = random_trees(seed, concentration)
  rng = np.random.default_rng(100 + seed)
  x_RxG = np.zeros((R, G), np.int64)
  for L in range(G):
    x_RxG[:, L] = sample_rows(rng, tree_rows(q, L, x_RxG))
  n_R = rng.integers(0, G + 1, R) if variable_n else np.full(R, G)
  q_RxGxV = np.stack([tree_rows(q, L, x_RxG) for L in range(G)], 1)
  p_RxG1xV = np.stack([tree_rows(p, L, x_RxG) for L in range(G + 1)], 1)
  keys = jax.random.split(jax.random.PRNGKey(seed), R)
  tau_R, y_R = jax.device_get(_jitted(fn)(keys, jnp.asarray(x_RxG, jnp.int32),
                                          jnp.asarray(q_RxGxV, jnp.float32),
                                          jnp.asarray(p_RxG1xV, jnp.float32),
                                          jnp.asarray(n_R, jnp.int32)))
  assert (tau_R <= n_R).all() and (tau_R >= 0).all()
  out_RxT = np.zeros((R, T), np.int64)
  out_RxT[:, :G] = x_RxG
  idx_R = np.arange(R)
  out_RxT[idx_R, tau_R] = y_R
  for L in range(1, T):  # positions after the emitted block come from the target
    fresh = sample_rows(rng, tree_rows(p, L, out_RxT))
    out_RxT[:, L] = np.where(L > tau_R, fresh, out_RxT[:, L])
  codes = out_RxT @ (V ** np.arange(T - 1, -1, -1))
  return np.bincount(codes, minlength=V ** T).reshape((V,) * T), tau_R, p, q


@pytest.mark.parametrize('variable_n', [False, True], ids=['n=G', 'random n'])
def test_emitted_tokens_follow_target_law(variable_n):
  counts, _, p, _ = run_blocks(acceptance.block_verify, variable_n=variable_n, **CONTROL_TREES)
  pv = chi2_pvalue(counts, target_law(p))
  print(f'block_verify ({"random n" if variable_n else "n=G"}): chi-square p = {pv:.3g}')
  assert pv > 1e-3, pv


def test_token_residual_in_block_verification_is_detected():
  counts, _, p, _ = run_blocks(verify_with_token_residual, variable_n=False, **CONTROL_TREES)
  pv = chi2_pvalue(counts, target_law(p))
  print(f'control:block_with_token_residual: chi-square p = {pv:.3g}')
  assert pv < 1e-6, pv


def test_mean_accepted_matches_the_optimum_and_beats_token():
  # The implementation realises the derived stop law (mean within 4 standard errors of the exact
  # E[accepted]), which is above token verification's by more than the noise.
  _, tau_block, p, q = run_blocks(acceptance.block_verify, 3, False, 0.7)
  _, tau_token, _, _ = run_blocks(acceptance.verify, 3, False, 0.7)
  exact_block = expected_accepted(p, q, G, block_stop_law)
  exact_token = expected_accepted(p, q, G, token_stop_law)
  se = tau_block.std() / np.sqrt(R)
  print(f'E[accepted]: block {tau_block.mean():.4f} (exact {exact_block:.4f}, se {se:.4f}), '
        f'token {tau_token.mean():.4f} (exact {exact_token:.4f})')
  assert abs(tau_block.mean() - exact_block) < 4 * se
  assert abs(tau_token.mean() - exact_token) < 4 * tau_token.std() / np.sqrt(R)
  assert exact_block - exact_token > 10 * se


def test_paper_example_eleven_ninths():
  # Sun et al.'s motivating example: context-free target (1/3, 2/3), draft (2/3, 1/3), G = 2:
  # token verification accepts 10/9 drafts on average, block verification 11/9.
  p_V, q_V = np.array([1 / 3, 2 / 3]), np.array([2 / 3, 1 / 3])
  rng = np.random.default_rng(0)
  x = (rng.random((R, 2)) > q_V[0]).astype(np.int32)
  q = jnp.broadcast_to(jnp.asarray(q_V, jnp.float32), (R, 2, 2))
  p = jnp.broadcast_to(jnp.asarray(p_V, jnp.float32), (R, 3, 2))
  keys = jax.random.split(jax.random.PRNGKey(1), R)
  n = jnp.full((R,), 2, jnp.int32)
  for fn, exact in ((acceptance.block_verify, 11 / 9), (acceptance.verify, 10 / 9)):
    tau = np.asarray(_jitted(fn)(keys, jnp.asarray(x), q, p, n)[0])
    assert abs(tau.mean() - exact) < 4 * tau.std() / np.sqrt(R), (fn.__name__, tau.mean())


def test_greedy_limit_equals_token_verification():
  # One-hot p and q (temperature 0): same accepted count and next token as `verify`, any key.
  rows, vocab, g = 4000, 4, 5
  rng = np.random.default_rng(5)
  draft = rng.integers(0, vocab, (rows, g))
  # Targets agree with the drafts often, so every accepted count occurs.
  top = np.where(rng.random((rows, g + 1)) < 0.7, np.pad(draft, ((0, 0), (0, 1))),
                 rng.integers(0, vocab, (rows, g + 1)))
  q = jax.nn.one_hot(draft, vocab)
  p = jax.nn.one_hot(top, vocab)
  n = jnp.asarray(rng.integers(0, g + 1, rows), jnp.int32)
  keys = jax.random.split(jax.random.PRNGKey(2), rows)
  args = (keys, jnp.asarray(draft, jnp.int32), q, p, n)
  tau_b, y_b = _jitted(acceptance.block_verify)(*args)
  tau_t, y_t = _jitted(acceptance.verify)(*args)
  np.testing.assert_array_equal(tau_b, tau_t)
  np.testing.assert_array_equal(y_b, y_t)
  assert len(np.unique(np.asarray(tau_t))) == g + 1


def test_registered_as_block():
  rule = acceptance.VERIFIERS['block']
  assert isinstance(rule, acceptance.BlockVerifier) and acceptance.verifier_for('block') is rule
  assert acceptance.VERIFIERS.name_of(rule) == 'block'
  with pytest.raises(ValueError, match='has no tree form'):
    rule.verify_tree(None, None, None, None, None)
