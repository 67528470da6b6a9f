"""Exact verification rules: Algorithm 1 (Leviathan et al., ICML 2023), block verification and
recursive rejection sampling for trees, and the verifiers that select them.

Shapes: B batch, G the block width (drafted slots), G1 = G + 1 (target rows incl. the bonus row),
D tree depth, D1 = D + 1, M tree nodes below the root, M1 = M + 1, V vocab.

`verify` and friends act on ONE sequence; callers `jax.vmap` over the batch (with one key per
sequence). q_GxV are the draft's processed distributions at the G drafted slots, p_G1xV the
target's at the same positions plus one bonus row, both from `specjax.decoding.sampling.probs`
with the same `Sampling`. Only the first n slots were proposed (n = G when not given): slots >= n
are never accepted and the corrected / bonus token comes from p[n]. Everything is float32 and free
of Python control flow on traced values, so it jits and vmaps.

Precondition: draft ids lie in [0, V). An out-of-range id is never accepted (so never emitted);
the loop flags it (`out_of_range`) and `speculative_decode` raises a ValueError after the call.

A `Verifier` is a rule the loop can select: `verify` for a chain and, where the rule has one,
`verify_tree` for a token tree. `VERIFIERS` (a registry: `@register(name)` on the class) names the
shipped ones, 'token' (Algorithm 1; recursive rejection sampling on trees) and 'block'.
`speculative_decode(..., verifier=NAME or a Verifier)` selects one. Exact rules reduce to argmax
matching at temperature 0, so there the loop runs the batched `verify_greedy_batch` /
`verify_tree_greedy_batch` instead (no RNG, no [B, G1, V] probabilities); a rule that does not
(research, negative controls) sets `argmax_at_greedy = False`.

Greedy limit: with temperature 0, p and q are exact one-hots, so
u * q_i(x_i) < p_i(x_i) holds iff x_i == argmax p_i (for every u in [0, 1)),
the residual at the first mismatch is the one-hot of argmax p_n, and `verify`
reduces exactly to "accept while draft == argmax p; next = argmax p_n" for any key.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp

from specjax import ops
from specjax.decoding import sampling as sampling_lib
from specjax.decoding import theory
from specjax.decoding.registry import VERIFIERS
from specjax.decoding.sampling import sample
from specjax.decoding.shapes import TreeShape

__all__ = ['VERIFIERS', 'Verifier', 'TokenVerifier', 'BlockVerifier', 'FunctionVerifier',
           'register', 'verifier_for', 'accept_prefix', 'alpha_terms', 'block_verify', 'in_range', 'out_of_range', 'residual',
           'verify', 'verify_batch', 'verify_greedy_batch', 'verify_tree',
           'verify_tree_greedy_batch', 'path_betas']

register = VERIFIERS.register


def in_range(tokens_xG: jax.Array, vocab: int) -> jax.Array:
  """Bool, same shape: the id is a valid token in [0, vocab)."""
  return (tokens_xG >= 0) & (tokens_xG < vocab)


def out_of_range(tokens_BxG: jax.Array, n_B: jax.Array, vocab: int) -> jax.Array:
  """Bool []: some proposed draft id (slot < n) lies outside [0, vocab) -- a broken draft."""
  proposed_BxG = jnp.arange(tokens_BxG.shape[1])[None, :] < n_B[:, None]
  return jnp.any(proposed_BxG & ~in_range(tokens_BxG, vocab))


def accept_prefix(
  draft_tokens_G: jax.Array, q_GxV: jax.Array, p_G1xV: jax.Array, u_G: jax.Array, n=None
) -> jax.Array:
  """int32 m in [0, n]: number of leading drafts accepted among the first n (n = G by default).

  Draft i is accepted iff u_i * q_i(x_i) < p_i(x_i), i.e. u_i < p/q without
  dividing (q may be 0, p may be 0: a token with p == 0 is never accepted).
  Slots i >= n and ids outside [0, V) are never accepted.
  """
  G, V = q_GxV.shape
  x_G = draft_tokens_G.astype(jnp.int32)
  x_G1 = jnp.clip(x_G, 0, V - 1)[:, None]
  qx_G = jnp.take_along_axis(q_GxV.astype(jnp.float32), x_G1, axis=-1)[:, 0]
  px_G = jnp.take_along_axis(p_G1xV[:G].astype(jnp.float32), x_G1, axis=-1)[:, 0]
  accept_G = (u_G.astype(jnp.float32) * qx_G < px_G) & in_range(x_G, V)
  if n is not None:
    accept_G = accept_G & (jnp.arange(G) < n)
  # Leading run of accepts: cumprod zeroes everything after the first reject.
  return jnp.sum(jnp.cumprod(accept_G.astype(jnp.int32)), dtype=jnp.int32)


def residual(p_V: jax.Array, q_V: jax.Array) -> jax.Array:
  """norm(max(0, p - q)): where a rejected position resamples from.

  When p == q the residual is all zero (and rejection has probability 0); we
  then return p so the result is always a valid distribution and never NaN.
  """
  p_V = p_V.astype(jnp.float32)
  diff_V = jnp.maximum(p_V - q_V.astype(jnp.float32), 0.0)
  total = jnp.sum(diff_V)
  safe_total = jnp.maximum(total, jnp.finfo(jnp.float32).tiny)
  return jnp.where(total > 0, diff_V / safe_total, p_V)


def verify(
  key: jax.Array, draft_tokens_G: jax.Array, q_GxV: jax.Array, p_G1xV: jax.Array, n=None
) -> tuple[jax.Array, jax.Array]:
  """(m accepted int32 in [0, n], next_token int32) for one drafted block of n proposed tokens.

  n (int32 in [0, G], default G) is the proposal length: slots >= n are padding. The block emits
  draft_tokens_G[:m] followed by next_token, which comes from residual(p_m, q_m) after a
  rejection at m < n, or from p_n itself when all n drafts are accepted (the bonus row when
  n = G). The emitted tokens are distributed exactly as sampling from p, for any n that was
  decided without looking at the drafted token it would include. Draft ids must lie in [0, V)
  (an id outside is never accepted).
  """
  G = draft_tokens_G.shape[0]
  n = jnp.int32(G) if n is None else jnp.asarray(n, jnp.int32)
  key_u, key_next = jax.random.split(key)
  u_G = jax.random.uniform(key_u, (G,), dtype=jnp.float32)
  m = accept_prefix(draft_tokens_G, q_GxV, p_G1xV, u_G, n)
  p_V = p_G1xV[m].astype(jnp.float32)
  # Pad q with a zero row so q[m] is defined for m == G (that branch uses p_G).
  q_G1xV = jnp.concatenate([q_GxV.astype(jnp.float32), jnp.zeros_like(p_V)[None]], axis=0)
  next_dist_V = jnp.where(m < n, residual(p_V, q_G1xV[m]), p_V)
  return m, sample(key_next, next_dist_V)


def alpha_terms(q_GxV: jax.Array, p_G1xV: jax.Array) -> jax.Array:
  """float32 beta_i = sum_x min(p_i(x), q_i(x)) per drafted position.

  beta_i is the probability that draft i is accepted given its prefix was;
  the paper's alpha is the mean of beta over positions whose prefix was accepted.
  """
  return theory.beta(p_G1xV[:q_GxV.shape[0]], q_GxV)


def verify_greedy_batch(draft_BxG: jax.Array, q_BxGxV: jax.Array, logits_BxG1xV: jax.Array,
                        n_B: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`verify` at temperature 0 for a batch: (m_B, next_B, beta_BxG) straight from the argmaxes.

  p is the one-hot of the target's argmax a_i, so for ANY q `verify` accepts draft i < n iff
  x_i == a_i, the corrected / bonus token is a_m, and the alpha term sum_x min(p_i, q_i) is
  q_i(a_i). Same results without the per-row RNG (threefry loops) and the [B, G1, V] probability
  and residual work.
  """
  g = draft_BxG.shape[1]
  top_BxG1 = ops.argmax(logits_BxG1xV)
  match_BxG = (draft_BxG == top_BxG1[:, :g]) & (jnp.arange(g)[None, :] < n_B[:, None])
  m_B = jnp.sum(jnp.cumprod(match_BxG.astype(jnp.int32), axis=1), axis=1, dtype=jnp.int32)
  next_B = jnp.take_along_axis(top_BxG1, m_B[:, None], axis=1)[:, 0]
  beta_BxG = jnp.take_along_axis(q_BxGxV, top_BxG1[:, :g, None], axis=2)[..., 0]
  return m_B, next_B, beta_BxG


# ----------------------------------------------------------------------------- block verification


def block_verify(
  key: jax.Array, draft_tokens_G: jax.Array, q_GxV: jax.Array, p_G1xV: jax.Array, n=None
) -> tuple[jax.Array, jax.Array]:
  """Block verification (Sun et al., ICLR 2025, arXiv 2403.10444): `verify`'s signature and
  contract (the block emits draft_tokens_G[:tau], then next_token; only the first n drafts count),
  with the acceptance decided jointly over the block. Never fewer accepted drafts in expectation.

  Derivation. Write q_i, p_i for the rows of draft i (0-based) given the earlier drafts, and
  r_i = p_i(x_i) / q_i(x_i). The law is exact iff, for every i < n and prefix x^i,
    (E)  P(tau >= i+1, X^{i+1} = x^i x) + P(tau = i, X^i = x^i, Y = x) = A_i(x^i) p_i(x),
  where A_i(x^i) = P(tau >= i, X^i = x^i) (the (i+1)-th emitted token is then p-distributed given
  the prefix; induction over i). Since A_{i+1}(x^i x) <= min(q(x^i x), A_i(x^i) p_i(x)), the
  largest choice is A_i(x^i) = q(x^i) w_i with the weights
    w_0 = 1,   w_{i+1} = min(1, w_i r_i)          (token verification has prod_j min(1, r_j) <= w_i,
                                                    so it never accepts more)
  and (E) then fixes the stop law and the corrected token:
    P(tau = i | X^i) = rho_i := sum_x max(w_i p_i(x) - q_i(x), 0),
    Y | tau = i, X^i  ~  norm(max(w_i p_i - q_i, 0))     (p_n itself when tau = n),
    P(tau = n | X^n) = w_n.
  w_i is not monotone in i, so tau cannot be decided left to right; it is decided right to left
  with the whole block in view: stop at n with probability w_n, else at i = n-1, ..., 1 with
  probability h_i = rho_i / (rho_i + 1 - w_i), else at 0. Invariant: with
  s_i = sum_x max(q_i - w_i p_i, 0) = rho_i + 1 - w_i,  E[P(tau <= i | X^n) | X^i] = s_i
  (base: E[1 - w_n | X^{n-1}] = s_{n-1}; step: s_i (1 - h_i) = 1 - w_i, and
  E[1 - w_i | X^{i-1}] = s_{i-1}), hence P(tau = i | X^i) = h_i s_i = rho_i, as required.
  Where s_i = 0 a larger index stops with probability 1, and h_i = 1 is harmless.

  Greedy limit (one-hot p and q): w_i = 1 up to the first mismatch and 0 after it, rho_i = 1 only
  at the first mismatch, so tau and next_token are exactly `verify`'s for every key.
  """
  G = q_GxV.shape[0]
  n = jnp.int32(G) if n is None else jnp.asarray(n, jnp.int32)
  q_GxV, p_G1xV = q_GxV.astype(jnp.float32), p_G1xV.astype(jnp.float32)
  w_G1, h_G1 = block_stops(draft_tokens_G, q_GxV, p_G1xV, n)
  idx_G1 = jnp.arange(G + 1)
  key_u, key_next = jax.random.split(key)
  stop_G1 = (jax.random.uniform(key_u, (G + 1,), dtype=jnp.float32) < h_G1) | (idx_G1 == 0)
  tau = jnp.max(jnp.where(stop_G1, idx_G1, 0)).astype(jnp.int32)
  p_V = p_G1xV[tau]
  q_V = jnp.concatenate([q_GxV, jnp.zeros_like(p_V)[None]], axis=0)[tau]
  diff_V = jnp.maximum(w_G1[tau] * p_V - q_V, 0.0)
  total = jnp.sum(diff_V)
  tiny = jnp.finfo(jnp.float32).tiny
  next_dist_V = jnp.where((tau < n) & (total > 0), diff_V / jnp.maximum(total, tiny), p_V)
  return tau, sample(key_next, next_dist_V)


def block_stops(draft_tokens_G, q_GxV, p_G1xV, n):
  """block_verify's weights w_0 .. w_G and its right-to-left stop probabilities h_0 .. h_G
  (h_n = w_n, h_i = rho_i / (rho_i + 1 - w_i) below n, 0 above), float32 [G1] each."""
  G, V = q_GxV.shape
  idx_G = jnp.arange(G)
  x_G = draft_tokens_G.astype(jnp.int32)
  x_Gx1 = jnp.clip(x_G, 0, V - 1)[:, None]
  qx_G = jnp.take_along_axis(q_GxV, x_Gx1, axis=-1)[:, 0]
  px_G = jnp.take_along_axis(p_G1xV[:G], x_Gx1, axis=-1)[:, 0]
  tiny = jnp.finfo(jnp.float32).tiny
  # An id outside [0, V) is never accepted (r = 0), as in `accept_prefix`.
  log_r_G = jnp.where((px_G > 0) & in_range(x_G, V),
                      jnp.log(jnp.maximum(px_G, tiny)) - jnp.log(jnp.maximum(qx_G, tiny)), -jnp.inf)
  log_r_G = jnp.where(idx_G < n, log_r_G, 0.0)  # padding slots never matter
  # log w_i = S_i - max_{j <= i} S_j with S_i = sum_{j < i} log r_j: the clamped running product.
  s_G1 = jnp.concatenate([jnp.zeros((1,), jnp.float32), jnp.cumsum(log_r_G)])
  w_G1 = jnp.exp(s_G1 - jax.lax.cummax(s_G1))
  rho_G = jnp.sum(jnp.maximum(w_G1[:G, None] * p_G1xV[:G] - q_GxV, 0.0), axis=-1)
  denom_G = rho_G + 1.0 - w_G1[:G]
  h_G = jnp.where(denom_G > 0, rho_G / jnp.maximum(denom_G, tiny), 1.0)
  idx_G1 = jnp.arange(G + 1)
  h_G1 = jnp.concatenate([h_G, jnp.zeros((1,), jnp.float32)])
  return w_G1, jnp.where(idx_G1 == n, w_G1[jnp.minimum(n, G)], jnp.where(idx_G1 > n, 0.0, h_G1))


# ----------------------------------------------------------------------------- trees
#
# Recursive rejection sampling (SpecInfer arXiv 2305.09781; RSD arXiv 2402.14160 for candidates
# drawn without replacement, specjax.decoding.candidates). At a node with target law p and
# children x_1 .. x_b drawn with laws q_1 .. q_b (q_i given the earlier siblings):
#     r_1 = p
#     child i: accept x_i with probability min(1, r_i(x_i) / q_i(x_i));
#              if rejected, r_{i+1} = norm(max(0, r_i - q_i))
#     all rejected: the emitted token ~ r_{b+1}.
# Invariant: given the node's path and the rejected siblings x_1 .. x_{i-1}, the token this node
# emits from step i on (an accepted x_j, or the final residual draw) is distributed as r_i.
# Proof, from i = b + 1 down: x_i ~ q_i given the history, so P(emit x at step i) =
# min(q_i(x), r_i(x)), P(reject) = sum_x max(0, r_i - q_i) =: Z, and by the invariant for i + 1
# the rest emits Z r_{i+1}(x) = max(0, r_i(x) - q_i(x)); the sum is r_i(x). At i = 1 the node
# emits p. An accepted child's subtree was drawn given the child alone, independent of the coin,
# so the argument repeats one level down; a reached leaf emits from its own p (the bonus). A
# rejected x_i has r_{i+1}(x_i) = 0, so a repeated (i.i.d.) sibling is never accepted afterwards;
# a child with q_i(x_i) = 0 is skipped (no accept, no update), which keeps the invariant. The rule
# must get the q_i of the scheme the candidates were drawn with (tests/test_tree.py rejects q
# for the without-replacement q_i, the reverse, and r not updated between siblings).
# Greedy: the longest path matching the target's argmax, then the argmax at its end.


def verify_tree(key, tokens_M1, q_MxV, p_M1xV, shape: TreeShape, residual_fn=residual):
  """Recursive rejection sampling down one row's tree (rule and invariant below).

  tokens_M1 node tokens (node 0 the root), q_MxV the law of node j+1 given its history, p_M1xV the
  target's processed law at every node. Returns (path_D1 int32: accepted node per depth, path[0] =
  0, entries past m are 0; m accepted tokens in [0, D]; the emitted token).
  """
  v = p_M1xV.shape[-1]
  key_u, key_next = jax.random.split(key)
  u_M1 = jax.random.uniform(key_u, (shape.nodes + 1,), jnp.float32)
  node, alive, m = jnp.int32(0), jnp.bool_(True), jnp.int32(0)
  path = [jnp.int32(0)]
  final_V = p_M1xV[0]
  for d, b in enumerate(shape.branching):
    r_V = p_M1xV[node]
    child0 = shape.first_child(d, node)
    acc, chosen = jnp.bool_(False), child0
    for i in range(b):
      c = child0 + i
      x, q_V = tokens_M1[c], q_MxV[c - 1]
      xc = jnp.clip(x, 0, v - 1)
      valid = (q_V[xc] > 0) & in_range(x, v)
      take = ~acc & valid & (u_M1[c] * q_V[xc] < r_V[xc])
      chosen = jnp.where(take, c, chosen)
      r_V = jnp.where(~acc & valid & ~take, residual_fn(r_V, q_V), r_V)
      acc = acc | take
    final_V = jnp.where(alive & ~acc, r_V, final_V)
    go = alive & acc
    m = m + go.astype(jnp.int32)
    node = jnp.where(go, chosen, node)
    path.append(jnp.where(go, chosen, 0))
    alive = go
  final_V = jnp.where(alive, p_M1xV[node], final_V)  # a leaf reached: the bonus token
  return jnp.stack(path).astype(jnp.int32), m, sampling_lib.sample(key_next, final_V)


def verify_tree_greedy_batch(tokens_BxM1, logits_BxM1xV, shape: TreeShape):
  """Temperature 0: the longest path matching the target's argmax; (path_BxD1, m_B, next_B)."""
  top_BxM1 = ops.argmax(logits_BxM1xV)
  bsz = tokens_BxM1.shape[0]
  take = lambda a_BxM1, i_B: jnp.take_along_axis(a_BxM1, i_B[:, None], axis=1)[:, 0]  # noqa: E731
  node_B, alive_B = jnp.zeros((bsz,), jnp.int32), jnp.ones((bsz,), bool)
  m_B, path = jnp.zeros((bsz,), jnp.int32), [jnp.zeros((bsz,), jnp.int32)]
  for d, b in enumerate(shape.branching):
    kids_Bxb = shape.first_child(d, node_B)[:, None] + jnp.arange(b)[None, :]
    match_Bxb = jnp.take_along_axis(tokens_BxM1, kids_Bxb, axis=1) == take(top_BxM1, node_B)[:, None]
    go_B = alive_B & match_Bxb.any(axis=1)
    node_B = jnp.where(go_B, take(kids_Bxb, jnp.argmax(match_Bxb, axis=1)), node_B)
    path.append(jnp.where(go_B, node_B, 0))
    m_B = m_B + go_B.astype(jnp.int32)
    alive_B = go_B
  return jnp.stack(path, axis=1), m_B, take(top_BxM1, node_B)


def path_betas(path_BxD1, q_BxMxV, p_BxDxV, shape: TreeShape):
  """[B, D] the alpha term sum_x min(p, q) at each depth d of the accepted path: p the target's
  law at path node d, q the draft's law of that node's first child (q itself under both schemes).
  Entries past the accepted length are not on the target's prefix; the statistics skip them."""
  betas = []
  for d in range(shape.depth):
    child0_B = jnp.clip(shape.first_child(d, path_BxD1[:, d]) - 1, 0, q_BxMxV.shape[1] - 1)
    q_BxV = jnp.take_along_axis(q_BxMxV, child0_B[:, None, None], axis=1)[:, 0]
    betas.append(theory.beta(p_BxDxV[:, d], q_BxV))
  return jnp.stack(betas, axis=1)


# ----------------------------------------------------------------------------- verifiers


@dataclasses.dataclass(frozen=True)
class Verifier:
  """A verification rule the loop can select (frozen and hashable: a static jit argument).

  Override `verify` (one chain: `verify`'s signature and contract) and, where the rule has a tree
  form, `verify_tree` (`verify_tree`'s). `chain` and `tree` are what the loop calls: the rule
  vmapped over rows, or the batched argmax matching at temperature 0 when `argmax_at_greedy`
  (true for every exact rule; set it False for a rule that must run as written)."""
  argmax_at_greedy = True

  def __call__(self, key, draft_tokens_G, q_GxV, p_G1xV, n=None):
    return self.verify(key, draft_tokens_G, q_GxV, p_G1xV, n)

  def verify(self, key, draft_tokens_G, q_GxV, p_G1xV, n=None):
    raise NotImplementedError(f'{type(self).__name__} has no chain rule')

  def verify_tree(self, key, tokens_M1, q_MxV, p_M1xV, shape: TreeShape):
    raise ValueError(f'verifier {type(self).__name__} has no tree form: use verifier=\'token\'')

  def chain(self, keys_B, draft_BxG, q_BxGxV, logits_BxG1xV, n_B, sampling):
    """(m_B accepted, next_B, beta_BxG alpha terms) for a batch of chains."""
    if sampling.greedy and self.argmax_at_greedy:
      return verify_greedy_batch(draft_BxG, q_BxGxV, logits_BxG1xV, n_B)
    p_BxG1xV = sampling_lib.probs(logits_BxG1xV, sampling)
    m_B, next_B = jax.vmap(self.verify)(keys_B, draft_BxG, q_BxGxV, p_BxG1xV, n_B)
    return m_B, next_B, jax.vmap(alpha_terms)(q_BxGxV, p_BxG1xV)

  def tree(self, keys_B, tokens_BxM1, q_BxMxV, logits_BxM1xV, shape: TreeShape, sampling):
    """(path_BxD1, m_B, next_B, beta_BxD) for a batch of trees."""
    if sampling.greedy and self.argmax_at_greedy:
      path_BxD1, m_B, next_B = verify_tree_greedy_batch(tokens_BxM1, logits_BxM1xV, shape)
    else:
      p_BxM1xV = sampling_lib.probs(logits_BxM1xV, sampling)
      rule = functools.partial(self.verify_tree, shape=shape)
      path_BxD1, m_B, next_B = jax.vmap(rule)(keys_B, tokens_BxM1, q_BxMxV, p_BxM1xV)
    on_path_BxDxV = jnp.take_along_axis(logits_BxM1xV, path_BxD1[:, :-1, None], axis=1)
    beta_BxD = path_betas(path_BxD1, q_BxMxV, sampling_lib.probs(on_path_BxDxV, sampling), shape)
    return path_BxD1, m_B, next_B, beta_BxD


@register('token')
@dataclasses.dataclass(frozen=True)
class TokenVerifier(Verifier):
  """Algorithm 1 token by token (`verify`); on trees, recursive rejection sampling."""

  def verify(self, key, draft_tokens_G, q_GxV, p_G1xV, n=None):
    return verify(key, draft_tokens_G, q_GxV, p_G1xV, n)

  def verify_tree(self, key, tokens_M1, q_MxV, p_M1xV, shape: TreeShape):
    return verify_tree(key, tokens_M1, q_MxV, p_M1xV, shape)


@register('block')
@dataclasses.dataclass(frozen=True)
class BlockVerifier(Verifier):
  """Block verification (`block_verify`, Sun et al. 2025): chains only."""

  def verify(self, key, draft_tokens_G, q_GxV, p_G1xV, n=None):
    return block_verify(key, draft_tokens_G, q_GxV, p_G1xV, n)


@dataclasses.dataclass(frozen=True)
class FunctionVerifier(Verifier):
  """A bare function as a verifier (research rules, broken rules of negative controls, the
  deprecated `verify_fn=`): `verify`'s signature for a chain, `verify_tree`'s for a tree; it runs
  as written, at temperature 0 too."""
  fn: Callable = None
  argmax_at_greedy = False

  def verify(self, key, draft_tokens_G, q_GxV, p_G1xV, n=None):
    return self.fn(key, draft_tokens_G, q_GxV, p_G1xV, n)

  def verify_tree(self, key, tokens_M1, q_MxV, p_M1xV, shape):
    return self.fn(key, tokens_M1, q_MxV, p_M1xV, shape)


def verifier_for(verifier) -> Verifier:
  """A Verifier from a registered name or a Verifier (a one-line ValueError otherwise)."""
  if isinstance(verifier, Verifier):
    return verifier
  if isinstance(verifier, str):
    return VERIFIERS.lookup(verifier)
  raise ValueError(f'verifier must be a name of {sorted(VERIFIERS)} or a Verifier, got '
                   f'{verifier!r}')


def verify_batch(keys_B, draft_BxG, q_BxGxV, logits_BxG1xV, n_B, sampling, *, verifier='token'):
  """The loop's verification of a batch of chains: (m_B, next_B, beta_BxG) (Verifier.chain)."""
  return verifier_for(verifier).chain(keys_B, draft_BxG, q_BxGxV, logits_BxG1xV, n_B, sampling)
