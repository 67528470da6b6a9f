"""A complete custom draft in under 40 lines: the worked example of docs/extending.md.

Shape legend: B batch, S source, N decoder-sequence buffer, G gamma, V vocab.
Tested like the shipped drafts (chi-square law test and a negative control in tests/test_drafts.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding import protocol


@struct.dataclass
class SourceBigramDraft:
  """After token a, proposes the token that followed a's first occurrence in the row's source, and
  so on; a row stops where the chain meets a token with no successor (an exact stop: decided from
  the previous drafts, before the slot is drafted). Deterministic, so q is one-hot."""
  vocab_size: int = struct.field(pytree_node=False)

  def init(self, input_ids_BxS, max_len):
    """next_BxV[b, a]: the source token after a's first occurrence in row b, -1 if none."""
    ids_BxS = jnp.asarray(input_ids_BxS, jnp.int32)
    b, s = ids_BxS.shape
    first_BxV = jnp.full((b, self.vocab_size), s, jnp.int32).at[
        jnp.arange(b)[:, None], ids_BxS[:, :-1]].min(jnp.arange(s - 1)[None, :])
    nxt_BxV = jnp.take_along_axis(ids_BxS, jnp.minimum(first_BxV + 1, s - 1), axis=1)
    return jnp.where(first_BxV < s - 1, nxt_BxV, -1)

  def commit(self, next_BxV, seq_BxN, lengths_B):
    return next_BxV

  def propose(self, next_BxV, seq_BxN, lengths_B, keys_B, gamma, sampling, *, stop, limit_B):
    prev_B = jnp.take_along_axis(seq_BxN, lengths_B[:, None], axis=1)[:, 0]
    tokens = []
    for _ in range(gamma):  # follow the chain; -1 stays -1
      look_B = jnp.take_along_axis(next_BxV, jnp.maximum(prev_B, 0)[:, None], axis=1)[:, 0]
      prev_B = jnp.where(prev_B >= 0, look_B, -1)
      tokens.append(prev_B)
    tokens_BxG = jnp.stack(tokens, axis=1)
    chain_B = jnp.sum(jnp.cumprod(tokens_BxG >= 0, axis=1), axis=1, dtype=jnp.int32)
    tokens_BxG = jnp.maximum(tokens_BxG, 0)
    q_BxGxV = jax.nn.one_hot(tokens_BxG, self.vocab_size, dtype=jnp.float32)
    n_B = protocol.cut(stop, tokens_BxG, q_BxGxV, jnp.minimum(limit_B, chain_B))
    return protocol.Proposal(protocol.pad_after(tokens_BxG, n_B), q_BxGxV, n_B, jnp.int32(0),
                             next_BxV)
