"""Prompt lookup: a draft that copies from the source and the generated prefix (no model).

Shape legend: B batch, S source, N decoder-sequence buffer, G gamma (draft block), V vocab,
M = 1 + S + N the haystack.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding import protocol
from specjax.decoding import sampling as sampling_lib
from specjax.decoding.protocol import Proposal
from specjax.decoding.registry import DRAFTS


@struct.dataclass
class PromptLookupState:
  """source_BxS: the prompt ids; source_len_B: tokens up to the last non-pad one."""
  source_BxS: jax.Array
  source_len_B: jax.Array


@DRAFTS.register('prompt_lookup')
@struct.dataclass
class PromptLookupDraft:
  """Prompt lookup: copy the continuation of an earlier occurrence of the current suffix.

  Per row the haystack is H = [start] + source[:S_b] + seq[:L+1] (S_b = length up to the last
  non-pad source token; seq[0] is the decoder start, seq[L] the last committed token), laid out at
  fixed size 1 + S + N. The query is the last n tokens of seq[:L+1] (n <= L + 1, so at L = 0 the
  query [start] matches the virtual start before the source and the draft is the source's first
  tokens). For n = ngram_max down to ngram_min, the first n with any match wins, and among its
  matches the most recent one (largest end e < Q, Q = the query's end in H): generated text beats
  the source, later beats earlier. The draft is H[e+1 .. e+gamma], extended periodically with period
  Q - e when it would run past Q (a repeat of the matched span, as in "a b a b" -> "a b"). No
  match: e = Q - 1, i.e. the last committed token repeated.

  Deterministic given the prefix, so q is one-hot on each proposed token: exact also in sampling
  mode (the drafted x is accepted with probability p(x), else the next token is drawn from p with x
  removed). Fixed shapes only: all windows are compared at once by broadcasting (cost
  B * (1 + S + N) * ngram_max comparisons per proposal). No forward passes; the block is cut
  where the stop rule ends each row (protocol.cut).
  """
  vocab_size: int = struct.field(pytree_node=False)
  ngram_max: int = struct.field(pytree_node=False, default=3)
  ngram_min: int = struct.field(pytree_node=False, default=1)
  start_id: int = struct.field(pytree_node=False, default=0)
  pad_id: int = struct.field(pytree_node=False, default=0)

  def __post_init__(self):
    if not 1 <= self.ngram_min <= self.ngram_max:
      raise ValueError(f'need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}')

  @classmethod
  def from_target(cls, target) -> PromptLookupDraft:
    """The draft for this target's vocabulary (the runner builds registered drafts this way)."""
    return cls(vocab_size=target.config.vocab_size)

  def init(self, input_ids_BxS, max_len: int) -> PromptLookupState:
    ids_BxS = jnp.asarray(input_ids_BxS, jnp.int32)
    pos_S = jnp.arange(1, ids_BxS.shape[1] + 1, dtype=jnp.int32)
    source_len_B = jnp.max(jnp.where(ids_BxS != self.pad_id, pos_S[None, :], 0), axis=1)
    return PromptLookupState(source_BxS=ids_BxS, source_len_B=source_len_B)

  def commit(self, state, seq_BxN, lengths_B):
    return state

  def lookup(self, state: PromptLookupState, seq_BxN, lengths_B, gamma: int):
    """The drafted tokens [B, gamma] (int32)."""
    source_BxS = state.source_BxS
    (b, s), n_buf = source_BxS.shape, seq_BxN.shape[1]
    m = 1 + s + n_buf
    pos_M = jnp.arange(m, dtype=jnp.int32)[None, :]
    src_len_Bx1 = state.source_len_B[:, None]
    lengths_Bx1 = lengths_B.astype(jnp.int32)[:, None]
    src_tok = jnp.take_along_axis(source_BxS, jnp.clip(pos_M - 1, 0, s - 1).repeat(b, 0), axis=1)
    gen_tok = jnp.take_along_axis(seq_BxN, jnp.clip(pos_M - 1 - src_len_Bx1, 0, n_buf - 1),
                                  axis=1)
    hay_BxM = jnp.where(pos_M == 0, self.start_id, jnp.where(pos_M <= src_len_Bx1, src_tok,
                                                             gen_tok)).astype(jnp.int32)
    end_Bx1 = 1 + src_len_Bx1 + lengths_Bx1  # Q: the last committed token's position in H

    # match[n][b, e]: H[e-k] == H[Q-k] for k < n, window inside [0, Q), query inside seq[:L+1].
    acc_BxM = pos_M < end_Bx1
    best_e_B = end_Bx1[:, 0] - 1  # no match: repeat the last token
    last_e_by_n = []
    for k in range(self.ngram_max):
      shifted_BxM = jnp.concatenate(
          [jnp.full((b, k), -1, jnp.int32), hay_BxM[:, :m - k]], axis=1) if k else hay_BxM
      query_Bx1 = jnp.take_along_axis(hay_BxM, end_Bx1 - k, axis=1)
      acc_BxM = acc_BxM & (shifted_BxM == query_Bx1) & (k <= lengths_Bx1)
      last_e_by_n.append(jnp.max(jnp.where(acc_BxM, pos_M, -1), axis=1))
    for n in range(self.ngram_min, self.ngram_max + 1):  # longer n overrides shorter
      last_e_B = last_e_by_n[n - 1]
      best_e_B = jnp.where(last_e_B >= 0, last_e_B, best_e_B)

    period_Bx1 = end_Bx1 - best_e_B[:, None]
    idx_BxG = best_e_B[:, None] + 1 + jnp.arange(gamma, dtype=jnp.int32)[None, :] % period_Bx1
    return jnp.take_along_axis(hay_BxM, idx_BxG, axis=1)

  def propose(self, state: PromptLookupState, seq_BxN, lengths_B, keys_B, gamma: int,
              sampling: sampling_lib.Sampling, *, stop, limit_B) -> Proposal:
    draft_BxG = self.lookup(state, seq_BxN, lengths_B, gamma)
    q_BxGxV = jax.nn.one_hot(draft_BxG, self.vocab_size, dtype=jnp.float32)
    n_B = protocol.cut(stop, draft_BxG, q_BxGxV, limit_B)
    return Proposal(protocol.pad_after(draft_BxG, n_B), q_BxGxV, n_B, jnp.int32(0), state)
