"""Draft strategies behind one small interface.

Shape legend: B batch, S source, N decoder-sequence buffer, G gamma (draft block), V vocab.

A draft is a pytree (so it can enter `jax.jit` next to the target) with three methods:

  init(input_ids_BxS, max_len) -> state
      Per-batch state (e.g. the draft model's cache); the encoder runs here, once.
  propose(state, seq_BxN, lengths_B, keys_B, gamma, sampling) -> (draft_BxG, q_BxGxV, state)
      Proposes `gamma` tokens per row after the committed prefix. `seq_BxN[b, :lengths_B[b]+1]` is
      row b's decoder input so far ([start, generated...]); the last committed token is
      seq[b, lengths[b]]. q is exactly the distribution each draft token was sampled from.
  calls_per_proposal(gamma) -> int
      Forward passes of the draft per proposal (for the statistics and the cost model).

The speculative loop never looks inside the state, so drafts with no model (n-gram, prompt lookup)
fit the same slot.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax import sampling as sampling_lib
from specjax.t5 import DecoderCache, T5Model


def _take_rows(seq_BxN, pos_B):
  return jnp.take_along_axis(seq_BxN, pos_B[:, None], axis=1)[:, 0]


@struct.dataclass
class ModelDraft:
  """A smaller T5 as the draft: gamma autoregressive steps on its own cache.

  Cache invariant at the start of a proposal: positions 0 .. lengths-2 hold the committed prefix
  (after a full acceptance the last draft token and the bonus token were never fed to the draft).
  So the first step feeds two tokens [seq[L-1], seq[L]] at offset L-1; re-feeding a position that
  is already in the cache rewrites identical keys/values. At L = 0 it feeds [start, filler] at
  offset 0 and reads the logits of position 0; the filler's entry is overwritten by the next step.
  """
  model: T5Model

  def init(self, input_ids_BxS, max_len: int) -> DecoderCache:
    return self.model.init_cache(input_ids_BxS, max_len)

  def calls_per_proposal(self, gamma: int) -> int:
    return gamma

  def propose(self, cache: DecoderCache, seq_BxN, lengths_B, keys_B, gamma: int,
              sampling: sampling_lib.Sampling):
    b = seq_BxN.shape[0]
    vocab = self.model.config.vocab_size
    start_B = jnp.maximum(lengths_B - 1, 0)
    block_Bx2 = jnp.stack([_take_rows(seq_BxN, start_B), _take_rows(seq_BxN, start_B + 1)], 1)
    logits_Bx2xV, cache = self.model.decode(cache, block_Bx2, start_B)
    logits_BxV = jnp.where((lengths_B >= 1)[:, None], logits_Bx2xV[:, 1], logits_Bx2xV[:, 0])
    step_keys_BxG = jax.vmap(lambda k: jax.random.split(k, gamma))(keys_B)

    def sample_step(i, logits_BxV):
      q_BxV = sampling_lib.probs(logits_BxV, sampling)
      if sampling.greedy:
        tok_B = jnp.argmax(q_BxV, axis=-1).astype(jnp.int32)
      else:
        tok_B = jax.vmap(sampling_lib.sample)(step_keys_BxG[:, i], q_BxV)
      return tok_B, q_BxV, jnp.isnan(logits_BxV).any()

    def cond_fn(carry):
      return carry[0] < gamma - 1

    def body_fn(carry):
      i, logits_BxV, cache, draft_BxG, q_BxGxV, nan = carry
      tok_B, q_BxV, step_nan = sample_step(i, logits_BxV)
      draft_BxG = draft_BxG.at[:, i].set(tok_B)
      q_BxGxV = q_BxGxV.at[:, i].set(q_BxV)
      logits_Bx1xV, cache = self.model.decode(cache, tok_B[:, None], lengths_B + 1 + i)
      return i + 1, logits_Bx1xV[:, 0], cache, draft_BxG, q_BxGxV, nan | step_nan

    carry = (jnp.int32(0), logits_BxV, cache, jnp.zeros((b, gamma), jnp.int32),
             jnp.zeros((b, gamma, vocab), jnp.float32), jnp.bool_(False))
    _, logits_BxV, cache, draft_BxG, q_BxGxV, nan = jax.lax.while_loop(cond_fn, body_fn, carry)
    tok_B, q_BxV, step_nan = sample_step(gamma - 1, logits_BxV)
    draft_BxG = draft_BxG.at[:, gamma - 1].set(tok_B)
    q_BxGxV = q_BxGxV.at[:, gamma - 1].set(q_BxV)
    # A NaN in the draft poisons q; the loop checks q for NaN and stops with a clear error.
    q_BxGxV = jnp.where(nan | step_nan, jnp.nan, q_BxGxV)
    return draft_BxG, q_BxGxV, cache
