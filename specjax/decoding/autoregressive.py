"""Autoregressive decoding, the baseline: one token per target call, one jitted while_loop.

Shape legend: B batch, S source, M max_new_tokens, V vocab.

The same model code and the same commit rule as the speculative loops (specjax.decoding.engine),
so greedy speculative output can be compared token for token. autoregressive_decode
(specjax.decoding.loop) validates and dispatches here, or to slot refill with slots=B.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specjax import ops
from specjax.decoding import engine
from specjax.decoding import sampling as sampling_lib
from specjax.decoding.stats import DecodeOutput
from specjax.models.t5 import T5Model
from specjax.programs import typed_jit


@struct.dataclass
class ARState:
  """Loop state of autoregressive decoding.

  seq:      [B, max_new + 1] int32  decoder inputs [start, generated...]
  lengths:  [B] int32               generated tokens per row
  done:     [B] bool                row finished (EOS, max_new_tokens or NaN)
  cache:    DecoderCache            the model's cache, max_new + 1 positions
  rng:      key                     base key; step i uses fold_in(rng, i), split per row
  step:     [] int32                iterations so far
  nan:      [] bool                 a NaN appeared in the logits
  """
  seq: jax.Array
  lengths: jax.Array
  done: jax.Array
  cache: Any
  rng: jax.Array
  step: jax.Array
  nan: jax.Array


def autoregressive_init(model: T5Model, input_ids_BxS, rng, *, max_new_tokens: int) -> ARState:
  """Runs the encoder once and builds the loop state (usable from a Python loop too)."""
  b = input_ids_BxS.shape[0]
  seq = jnp.zeros((b, max_new_tokens + 1), jnp.int32).at[:, 0].set(
      model.config.decoder_start_token_id)
  return ARState(seq=seq, lengths=jnp.zeros((b,), jnp.int32), done=jnp.zeros((b,), bool),
                 cache=model.init_cache(input_ids_BxS, max_new_tokens + 1), rng=rng,
                 step=jnp.int32(0), nan=jnp.bool_(False))


def autoregressive_step(model: T5Model, state: ARState, *, max_new_tokens: int,
                        sampling: sampling_lib.Sampling, eos_id: int) -> ARState:
  """One token for every unfinished row: one decoder step, the token choice, the commit."""
  b = state.seq.shape[0]
  last_Bx1 = jnp.take_along_axis(state.seq, state.lengths[:, None], axis=1)
  logits_Bx1xV, cache = model.decode(state.cache, last_Bx1, state.lengths)
  if sampling.greedy:  # argmax of probs' one-hot of the argmax: the same index, one pass
    tok_B = ops.argmax(logits_Bx1xV[:, 0])
  else:
    p_BxV = sampling_lib.probs(logits_Bx1xV[:, 0], sampling)
    tok_B = jax.vmap(sampling_lib.sample)(engine.row_keys(state.rng, state.step, b), p_BxV)
  seq, lengths, done = engine.commit_tokens(state.seq, state.lengths, state.done, tok_B[:, None],
                                     jnp.ones((b,), jnp.int32), eos_id, max_new_tokens)
  nan = state.nan | jnp.isnan(logits_Bx1xV).any()
  return state.replace(seq=seq, lengths=lengths, done=done | nan, cache=cache,
                       step=state.step + 1, nan=nan)


@typed_jit(static_argnames=('max_new_tokens', 'sampling', 'eos_id'))
def autoregressive_program(model, input_ids_BxS, rng, *, max_new_tokens, sampling, eos_id):
  """The whole autoregressive loop as one jitted program (static: max_new_tokens, sampling from
  make_sampling, eos_id). No input checks (autoregressive_decode does them)."""
  state = autoregressive_init(model, input_ids_BxS, rng, max_new_tokens=max_new_tokens)
  step = functools.partial(autoregressive_step, model, max_new_tokens=max_new_tokens,
                           sampling=sampling, eos_id=eos_id)
  state = engine.run_loop(state, step)
  return DecodeOutput(tokens=engine.finish_tokens(state.seq, state.lengths, max_new_tokens,
                                                  model.config.pad_token_id),
                      lengths=state.lengths, stats={'steps': state.step, 'nan': state.nan})


def plain_decode(model, input_ids, *, max_new_tokens: int, sampling, eos_id, rng) -> DecodeOutput:
  """autoregressive_decode without slots (the sampling already validated)."""
  engine.check_inputs(input_ids, max_new_tokens, None, sampling, model.config.vocab_size, None)
  out = autoregressive_program(model, jnp.asarray(input_ids, jnp.int32), engine.as_key(rng),
                               max_new_tokens=int(max_new_tokens), sampling=sampling,
                               eos_id=engine.eos_of(model, eos_id))
  engine.raise_on_nan(out.stats['nan'], 'autoregressive_decode')
  return out.to_host()
