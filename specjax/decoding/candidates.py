"""Tree candidates: the children a tree draft proposes and the laws they were drawn from.

Shape legend: B batch, K nodes of one level, b children per node, V vocab.

Candidates. A tree draft reports, for every non-root node, the law q_i the node's token was drawn
from GIVEN its parent's path and its earlier siblings. `draw_children` draws them
  * 'wor' (default): without replacement (Gumbel-top-b of log q: the sequential draw without
    replacement), so q_i = q with the earlier siblings' tokens removed, renormalised; siblings are
    distinct, which never wastes a candidate on a token already rejected;
  * 'iid': independently from q, so q_i = q;
  * at temperature 0: the draft's top-b tokens (one-hot q_i; verification is argmax matching).

Their exact verification (recursive rejection sampling): specjax.decoding.acceptance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decoding import sampling as sampling_lib

CANDIDATES = ('wor', 'iid')


def _check_scheme(scheme: str):
  if scheme not in CANDIDATES:
    raise ValueError(f'candidates must be one of {CANDIDATES}, got {scheme!r}')


def sibling_laws(q_BxKxV, tok_BxKxb, scheme: str):
  """q_i [B, K, b, V]: the law child i was drawn from given its earlier siblings, under `scheme`
  ('iid': q itself; 'wor': q without the earlier siblings' tokens, renormalised, all zero once
  q's support is used up)."""
  _check_scheme(scheme)
  bsz, k, v = q_BxKxV.shape
  b = tok_BxKxb.shape[-1]
  if scheme == 'iid':
    return jnp.broadcast_to(q_BxKxV[:, :, None, :], (bsz, k, b, v))
  onehot_BxKxbxV = jax.nn.one_hot(tok_BxKxb, v, dtype=jnp.float32)
  earlier_BxKxbxV = jnp.cumsum(onehot_BxKxbxV, axis=2) - onehot_BxKxbxV
  qi_BxKxbxV = jnp.where(earlier_BxKxbxV > 0, 0.0, q_BxKxV[:, :, None, :])
  total = jnp.sum(qi_BxKxbxV, axis=-1, keepdims=True)
  return jnp.where(total > 0, qi_BxKxbxV / jnp.maximum(total, 1e-30), 0.0)


def draw_tokens(q_BxKxV, keys_B, b: int, scheme: str):
  """b candidate tokens [B, K, b] per node: 'iid' b independent draws from q (inverse CDF, one
  uniform each), 'wor' the sequential draw without replacement (Gumbel-top-b of log q, in
  order)."""
  _check_scheme(scheme)
  _, k, v = q_BxKxV.shape
  if scheme == 'iid':
    u_BxKxb = jax.vmap(lambda key: jax.random.uniform(key, (k, b), jnp.float32))(keys_B)
    return sampling_lib.sample_uniform(u_BxKxb, q_BxKxV[:, :, None, :])
  logq_BxKxV = sampling_lib.log_probs(q_BxKxV)
  g_BxKxV = jax.vmap(lambda key: jax.random.gumbel(key, (k, v), jnp.float32))(keys_B)
  return jax.lax.top_k(logq_BxKxV + g_BxKxV, b)[1].astype(jnp.int32)


def draw_children(logits_BxKxV, keys_B, b: int, sampling, scheme: str):
  """b children of each of K nodes: (tokens [B, K, b] int32, q_i [B, K, b, V] f32), q_i the law
  child i was drawn from given the earlier siblings. Greedy: the draft's top-b tokens, one-hot
  q_i."""
  v = logits_BxKxV.shape[-1]
  if sampling.greedy:
    tok_BxKxb = jax.lax.top_k(logits_BxKxV.astype(jnp.float32), b)[1].astype(jnp.int32)
    return tok_BxKxb, jax.nn.one_hot(tok_BxKxb, v, dtype=jnp.float32)
  q_BxKxV = sampling_lib.probs(logits_BxKxV, sampling)
  tok_BxKxb = draw_tokens(q_BxKxV, keys_B, b, scheme)
  return tok_BxKxb, sibling_laws(q_BxKxV, tok_BxKxb, scheme)


def confidence(logits_BxKxV, tok_BxKxb):
  """[B, K, b] the draft's temperature-1 probability of each child's token at its parent: what a
  dynamic tree ranks nodes by at temperature 0 (where the reported q_i are one-hot)."""
  logp_BxKxV = jax.nn.log_softmax(logits_BxKxV.astype(jnp.float32), axis=-1)
  return jnp.exp(jnp.take_along_axis(logp_BxKxV, tok_BxKxb, axis=-1))


def level_keys(keys_B, d: int):
  """Depth d's own key per row (fold_in): each level of a tree draws with fresh randomness."""
  return jax.vmap(lambda k: jax.random.fold_in(k, d))(keys_B)


