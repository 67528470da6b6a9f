"""Speculative and autoregressive decoding, each one jit-compiled `lax.while_loop` program.

Shape legend: B batch, S source, N decoder-sequence buffer, G gamma, G1 = gamma + 1, V vocab,
I iterations recorded in a trace.

Per row b the loop keeps `seq[b]` = [decoder_start, generated tokens...] and `lengths[b]` = number of
generated tokens L. The target's cache holds input positions 0 .. L-1; the last committed token
seq[b, L] is the first token of the next verification block [seq[L], d_1 .. d_G], written at offset
L in ONE target call. Row b then commits n+1 tokens (n accepted drafts and one corrected or bonus
token); rolling back rejected drafts is just the new, smaller length. Rows advance by different
amounts; finished rows keep their tokens and lengths.

Buffers are sized so that no block is ever written out of range: caches hold
max_new_tokens + gamma + 1 positions, seq holds 1 + max_new_tokens + gamma + 1 tokens.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.decoding import acceptance
from specjax.decoding import sampling as sampling_lib
from specjax.decoding.drafts import ModelDraft
from specjax.models.t5 import T5Model

DEFAULT_SEED = 0

# Times each program was traced, keyed by name; tests assert no retracing on same shapes.
TRACE_COUNTS: collections.Counter = collections.Counter()


@struct.dataclass
class SpecStats:
  """On-device statistics of one speculative_decode call.

  iterations:      []       outer loop iterations (= target calls for the batch)
  draft_calls:     []       draft forward passes (iterations x calls per proposal)
  target_calls:    [B]      iterations in which the row was still generating
  accepted_hist:   [B, G1]  how often n = 0 .. G drafts were accepted in one iteration
  accepted:        [B]      accepted draft tokens
  emitted:         [B]      tokens produced by verification (n + 1 per iteration, before any
                            truncation at EOS or max_new_tokens)
  alpha_sum:       [B]      sum over verified positions whose prefix was accepted of
                            sum_x min(p(x), q(x)) (the paper's beta, Cor. 3.6)
  alpha_count:     [B]      number of such positions
  nan:             []       a NaN appeared in the target's or draft's logits
  """
  iterations: jax.Array
  draft_calls: jax.Array
  target_calls: jax.Array
  accepted_hist: jax.Array
  accepted: jax.Array
  emitted: jax.Array
  alpha_sum: jax.Array
  alpha_count: jax.Array
  nan: jax.Array

  @property
  def gamma(self) -> int:
    return self.accepted_hist.shape[-1] - 1

  @property
  def alpha(self) -> float:
    """The paper's alpha = E[sum_x min(p, q)], estimated on the target's own prefixes."""
    return float(np.sum(self.alpha_sum) / max(int(np.sum(self.alpha_count)), 1))

  @property
  def acceptance_rate(self) -> float:
    """Accepted drafts / drafted tokens (the empirical per-token acceptance)."""
    drafted = int(np.sum(self.target_calls)) * self.gamma
    return float(np.sum(self.accepted) / max(drafted, 1))

  @property
  def tokens_per_target_call(self) -> float:
    return float(np.sum(self.emitted) / max(int(np.sum(self.target_calls)), 1))

  def summary(self) -> dict[str, Any]:
    return {
        'iterations': int(self.iterations),
        'draft_calls': int(self.draft_calls),
        'target_calls': int(np.sum(self.target_calls)),
        'accepted_hist': np.asarray(self.accepted_hist).sum(0).tolist(),
        'alpha': self.alpha,
        'acceptance_rate': self.acceptance_rate,
        'tokens_per_target_call': self.tokens_per_target_call,
    }


@struct.dataclass
class DecodeOutput:
  """tokens [B, max_new_tokens] (pad after each row's end), lengths [B] (EOS counted), stats.

  With trace=True, `trace_drafts` [B, I, G] holds each iteration's drafted tokens and
  `trace_accepted` [B, I] how many were accepted (-1 once the row had finished); the committed
  tokens give the corrected/bonus token of each iteration.
  """
  tokens: jax.Array
  lengths: jax.Array
  stats: Any = None
  trace_drafts: Any = None
  trace_accepted: Any = None

  def to_host(self) -> 'DecodeOutput':
    """tokens and lengths as numpy arrays, which tokenizers' batch_decode accepts (a JAX array
    it does not); kept on device when sharded over several hosts (not addressable here)."""
    host = lambda x: np.asarray(x) if getattr(x, 'is_fully_addressable', True) else x
    return self.replace(tokens=host(self.tokens), lengths=host(self.lengths))


@struct.dataclass
class SpecState:
  """Loop state of speculative decoding.

  seq:          [B, N] int32  decoder inputs [start, generated...], N = max_new + gamma + 2
  lengths:      [B]    int32  generated tokens per row
  done:         [B]    bool   row finished (EOS or max_new_tokens)
  target_cache: DecoderCache  target's cache, max_new + gamma + 1 positions
  draft_state:  pytree        the draft's state (a DecoderCache for a model draft)
  rng:          key           base key; iteration i uses fold_in(rng, i), split per row
  stats:        SpecStats
  trace_drafts / trace_accepted: see DecodeOutput (shape [B, 0, G] / [B, 0] when not traced)
  """
  seq: jax.Array
  lengths: jax.Array
  done: jax.Array
  target_cache: Any
  draft_state: Any
  rng: jax.Array
  stats: SpecStats
  trace_drafts: jax.Array
  trace_accepted: jax.Array


def _as_draft(draft):
  return ModelDraft(draft) if isinstance(draft, T5Model) else draft


def _check_inputs(input_ids, max_new_tokens, gamma, sampling, vocab_target, vocab_draft):
  if isinstance(input_ids, jax.Array) and not input_ids.is_fully_addressable:
    # Spread over several hosts: read only the shape and a reduced min/max.
    shape, dtype = input_ids.shape, input_ids.dtype
    lo, hi = (int(v) for v in jax.jit(lambda x: (x.min(), x.max()))(input_ids))
  else:
    ids = np.asarray(input_ids)
    shape, dtype = ids.shape, ids.dtype
    lo, hi = (int(ids.min()), int(ids.max())) if ids.size else (0, 0)
  if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
    raise ValueError(f'input_ids must be a non-empty [batch, length] array, got shape {shape}')
  if not np.issubdtype(dtype, np.integer):
    raise ValueError(f'input_ids must be integers, got dtype {dtype}')
  if int(max_new_tokens) < 1:
    raise ValueError(f'max_new_tokens must be >= 1, got {max_new_tokens}')
  if gamma is not None and int(gamma) < 1:
    raise ValueError(f'gamma must be >= 1, got {gamma}')
  sampling.validate()
  if vocab_draft is not None and vocab_draft != vocab_target:
    raise ValueError(f'draft vocab_size {vocab_draft} != target vocab_size {vocab_target}: '
                     'the draft must share the target vocabulary')
  if lo < 0 or hi >= vocab_target:
    raise ValueError(f'input_ids out of range [0, {vocab_target})')


def _rng(rng):
  if rng is None:
    return jax.random.PRNGKey(DEFAULT_SEED)
  if isinstance(rng, int):
    return jax.random.PRNGKey(rng)
  return rng


def _row_keys(rng, step, batch):
  return jax.random.split(jax.random.fold_in(rng, step), batch)


def _finish(seq_BxN, lengths_B, max_new_tokens, pad_id):
  gen_BxM = seq_BxN[:, 1:1 + max_new_tokens]
  keep = jnp.arange(max_new_tokens)[None, :] < lengths_B[:, None]
  return jnp.where(keep, gen_BxM, pad_id)


def _commit(seq_BxN, lengths_B, done_B, block_BxK, n_emit_B, eos_id, max_new_tokens):
  """Writes each row's block at seq[L+1:], ends rows at EOS / max_new_tokens.

  block_BxK holds the candidate tokens; the first n_emit_B[b] of row b are committed.
  """
  k = block_BxK.shape[1]
  idx_K = jnp.arange(k)
  valid_BxK = idx_K[None, :] < n_emit_B[:, None]
  is_eos_BxK = valid_BxK & (block_BxK == eos_id)
  has_eos_B = is_eos_BxK.any(axis=1)
  first_eos_B = jnp.argmax(is_eos_BxK, axis=1)
  n_keep_B = jnp.where(has_eos_B, first_eos_B + 1, n_emit_B)
  new_len_B = jnp.minimum(lengths_B + n_keep_B, max_new_tokens)
  new_done_B = has_eos_B | (new_len_B >= max_new_tokens)
  write = jax.vmap(lambda s, blk, start: jax.lax.dynamic_update_slice(s, blk, (start,)))
  new_seq_BxN = write(seq_BxN, block_BxK, lengths_B + 1)
  seq_BxN = jnp.where(done_B[:, None], seq_BxN, new_seq_BxN)
  lengths_B = jnp.where(done_B, lengths_B, new_len_B)
  done_B = done_B | new_done_B
  return seq_BxN, lengths_B, done_B


# ----------------------------------------------------------------------------- speculative


def speculative_init(target: T5Model, draft, input_ids_BxS, rng, *, gamma: int,
                     max_new_tokens: int, trace: bool = False) -> SpecState:
  """Runs both encoders once and builds the loop state (usable from a Python loop too)."""
  b = input_ids_BxS.shape[0]
  cache_len = max_new_tokens + gamma + 1
  seq = jnp.zeros((b, max_new_tokens + gamma + 2), jnp.int32)
  seq = seq.at[:, 0].set(target.config.decoder_start_token_id)
  zeros_B = jnp.zeros((b,), jnp.int32)
  stats = SpecStats(
      iterations=jnp.int32(0), draft_calls=jnp.int32(0), target_calls=zeros_B,
      accepted_hist=jnp.zeros((b, gamma + 1), jnp.int32), accepted=zeros_B, emitted=zeros_B,
      alpha_sum=jnp.zeros((b,), jnp.float32), alpha_count=zeros_B, nan=jnp.bool_(False))
  # The trace has one slot per possible iteration (at least one token per iteration).
  n_trace = max_new_tokens if trace else 0
  return SpecState(
      seq=seq, lengths=zeros_B, done=jnp.zeros((b,), bool),
      target_cache=target.init_cache(input_ids_BxS, cache_len),
      draft_state=draft.init(input_ids_BxS, cache_len), rng=rng, stats=stats,
      trace_drafts=jnp.zeros((b, n_trace, gamma), jnp.int32),
      trace_accepted=jnp.full((b, n_trace), -1, jnp.int32))


def speculative_step(target: T5Model, draft, state: SpecState, *, gamma: int,
                     max_new_tokens: int, sampling: sampling_lib.Sampling,
                     eos_id: int, verify_fn=acceptance.verify) -> SpecState:
  """One draft -> verify -> accept iteration for every unfinished row."""
  b = state.seq.shape[0]
  lengths_B, done_B, stats = state.lengths, state.done, state.stats
  keys_B = _row_keys(state.rng, stats.iterations, b)
  draft_keys_B, verify_keys_B = jnp.split(jax.vmap(lambda k: jax.random.split(k, 2))(keys_B), 2,
                                          axis=1)
  draft_BxG, q_BxGxV, draft_state = draft.propose(
      state.draft_state, state.seq, lengths_B, draft_keys_B[:, 0], gamma, sampling)

  last_B = jnp.take_along_axis(state.seq, lengths_B[:, None], axis=1)
  block_BxG1 = jnp.concatenate([last_B, draft_BxG], axis=1)
  logits_BxG1xV, target_cache = target.decode(state.target_cache, block_BxG1, lengths_B)
  nan = stats.nan | jnp.isnan(logits_BxG1xV).any() | jnp.isnan(q_BxGxV).any()

  if sampling.greedy and verify_fn is acceptance.verify:
    # Temperature 0: p is the one-hot of the target's argmax a_i, so for ANY q acceptance.verify
    # accepts draft i iff x_i == a_i, the corrected / bonus token is a_n, and the alpha term
    # sum_x min(p_i, q_i) is q_i(a_i). Same results without the per-row RNG (threefry loops) and
    # the [B, G+1, V] probability / residual work.
    top_BxG1 = jnp.argmax(logits_BxG1xV, axis=-1).astype(jnp.int32)
    match_BxG = (draft_BxG == top_BxG1[:, :gamma]).astype(jnp.int32)
    n_B = jnp.sum(jnp.cumprod(match_BxG, axis=1), axis=1, dtype=jnp.int32)
    next_B = jnp.take_along_axis(top_BxG1, n_B[:, None], axis=1)[:, 0]
    beta_BxG = jnp.take_along_axis(q_BxGxV, top_BxG1[:, :gamma, None], axis=2)[..., 0]
  else:
    p_BxG1xV = sampling_lib.probs(logits_BxG1xV, sampling)
    n_B, next_B = jax.vmap(verify_fn)(verify_keys_B[:, 0], draft_BxG, q_BxGxV, p_BxG1xV)
    beta_BxG = jax.vmap(acceptance.alpha_terms)(q_BxGxV, p_BxG1xV)
  # Candidate block: accepted drafts, then the corrected / bonus token at index n.
  idx_G1 = jnp.arange(gamma + 1)
  padded_BxG1 = jnp.concatenate([draft_BxG, jnp.zeros((b, 1), jnp.int32)], axis=1)
  cand_BxG1 = jnp.where(idx_G1[None, :] == n_B[:, None], next_B[:, None], padded_BxG1)
  seq, lengths, done = _commit(state.seq, lengths_B, done_B, cand_BxG1, n_B + 1, eos_id,
                               max_new_tokens)

  active_B = ~done_B
  act = active_B.astype(jnp.int32)
  on_prefix_BxG = idx_G1[None, :gamma] <= n_B[:, None]
  stats = stats.replace(
      iterations=stats.iterations + 1,
      draft_calls=stats.draft_calls + draft.calls_per_proposal(gamma),
      target_calls=stats.target_calls + act,
      accepted_hist=stats.accepted_hist + act[:, None] * (idx_G1[None, :] == n_B[:, None]),
      accepted=stats.accepted + act * n_B,
      emitted=stats.emitted + act * (n_B + 1),
      alpha_sum=stats.alpha_sum + jnp.where(active_B, jnp.sum(
          jnp.where(on_prefix_BxG, beta_BxG, 0.0), axis=1), 0.0),
      alpha_count=stats.alpha_count + act * jnp.sum(on_prefix_BxG, axis=1),
      nan=nan)

  trace_drafts, trace_accepted = state.trace_drafts, state.trace_accepted
  if trace_drafts.shape[1]:
    it = jnp.minimum(state.stats.iterations, trace_drafts.shape[1] - 1)
    trace_drafts = trace_drafts.at[:, it].set(jnp.where(active_B[:, None], draft_BxG, 0))
    trace_accepted = trace_accepted.at[:, it].set(jnp.where(active_B, n_B, -1))

  return state.replace(seq=seq, lengths=lengths, done=done | nan, target_cache=target_cache,
                       draft_state=draft_state, stats=stats, trace_drafts=trace_drafts,
                       trace_accepted=trace_accepted)


@functools.partial(jax.jit, static_argnames=('gamma', 'max_new_tokens', 'sampling', 'eos_id',
                                             'trace', 'verify_fn'))
def _speculative_program(target, draft, input_ids_BxS, rng, *, gamma, max_new_tokens, sampling,
                         eos_id, trace, verify_fn):
  TRACE_COUNTS['speculative'] += 1
  state = speculative_init(target, draft, input_ids_BxS, rng, gamma=gamma,
                           max_new_tokens=max_new_tokens, trace=trace)

  def cond_fn(state: SpecState):
    return ~jnp.all(state.done)

  def body_fn(state: SpecState):
    return speculative_step(target, draft, state, gamma=gamma, max_new_tokens=max_new_tokens,
                            sampling=sampling, eos_id=eos_id, verify_fn=verify_fn)

  state = jax.lax.while_loop(cond_fn, body_fn, state)
  return DecodeOutput(
      tokens=_finish(state.seq, state.lengths, max_new_tokens, target.config.pad_token_id),
      lengths=state.lengths, stats=state.stats,
      trace_drafts=state.trace_drafts if trace else None,
      trace_accepted=state.trace_accepted if trace else None)


def _sampling(temperature, top_k, top_p):
  return sampling_lib.Sampling(temperature=float(temperature), top_k=int(top_k),
                               top_p=float(top_p))


def _raise_on_nan(nan, what):
  if bool(nan):
    raise FloatingPointError(f'{what}: NaN in model logits (check the checkpoint and dtype); '
                             'no tokens returned')


def speculative_decode(target: T5Model, draft, input_ids, *, gamma: int, max_new_tokens: int,
                       temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, rng=None,
                       eos_id: int | None = None, trace: bool = False,
                       verify_fn=None) -> DecodeOutput:
  """Exact speculative decoding (Leviathan et al. 2023) of a batch of right-padded prompts.

  `draft` is a smaller T5Model or any draft strategy of specjax.decoding.drafts. The output distribution
  is exactly the target's (after temperature / top-k / top-p); temperature 0 is exact greedy.
  `verify_fn` replaces acceptance.verify (same signature, a module-level function): for research
  on acceptance rules and for the tests' negative controls.
  """
  sampling = _sampling(temperature, top_k, top_p)
  draft = _as_draft(draft)
  vocab_draft = (draft.model.config.vocab_size if isinstance(draft, ModelDraft)
                 else getattr(draft, 'vocab_size', None))
  _check_inputs(input_ids, max_new_tokens, gamma, sampling, target.config.vocab_size,
                vocab_draft)
  eos = target.config.eos_token_id if eos_id is None else int(eos_id)
  out = _speculative_program(target, draft, jnp.asarray(input_ids, jnp.int32), _rng(rng),
                             gamma=int(gamma), max_new_tokens=int(max_new_tokens),
                             sampling=sampling, eos_id=eos, trace=bool(trace),
                             verify_fn=verify_fn or acceptance.verify)
  _raise_on_nan(out.stats.nan, 'speculative_decode')
  return out.to_host()


# ----------------------------------------------------------------------------- autoregressive


@struct.dataclass
class ARState:
  """seq [B, max_new + 1], lengths [B], done [B], cache (max_new + 1 positions), step, nan."""
  seq: jax.Array
  lengths: jax.Array
  done: jax.Array
  cache: Any
  step: jax.Array
  nan: jax.Array


@functools.partial(jax.jit, static_argnames=('max_new_tokens', 'sampling', 'eos_id'))
def _autoregressive_program(model, input_ids_BxS, rng, *, max_new_tokens, sampling, eos_id):
  TRACE_COUNTS['autoregressive'] += 1
  b = input_ids_BxS.shape[0]
  seq = jnp.zeros((b, max_new_tokens + 1), jnp.int32).at[:, 0].set(
      model.config.decoder_start_token_id)
  state = ARState(seq=seq, lengths=jnp.zeros((b,), jnp.int32), done=jnp.zeros((b,), bool),
                  cache=model.init_cache(input_ids_BxS, max_new_tokens + 1), step=jnp.int32(0),
                  nan=jnp.bool_(False))

  def cond_fn(state: ARState):
    return ~jnp.all(state.done)

  def body_fn(state: ARState):
    last_B = jnp.take_along_axis(state.seq, state.lengths[:, None], axis=1)
    logits_Bx1xV, cache = model.decode(state.cache, last_B, state.lengths)
    if sampling.greedy:  # argmax of probs' one-hot of the argmax: the same index, one pass
      tok_B = jnp.argmax(logits_Bx1xV[:, 0], axis=-1).astype(jnp.int32)
    else:
      p_BxV = sampling_lib.probs(logits_Bx1xV[:, 0], sampling)
      tok_B = jax.vmap(sampling_lib.sample)(_row_keys(rng, state.step, b), p_BxV)
    seq, lengths, done = _commit(state.seq, state.lengths, state.done, tok_B[:, None],
                                 jnp.ones((b,), jnp.int32), eos_id, max_new_tokens)
    nan = state.nan | jnp.isnan(logits_Bx1xV).any()
    return ARState(seq=seq, lengths=lengths, done=done | nan, cache=cache, step=state.step + 1,
                   nan=nan)

  state = jax.lax.while_loop(cond_fn, body_fn, state)
  return DecodeOutput(tokens=_finish(state.seq, state.lengths, max_new_tokens,
                                     model.config.pad_token_id),
                      lengths=state.lengths, stats={'steps': state.step, 'nan': state.nan})


def autoregressive_decode(model: T5Model, input_ids, *, max_new_tokens: int,
                          temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, rng=None,
                          eos_id: int | None = None) -> DecodeOutput:
  """The baseline: one token per target call, same model code, one jit'd while_loop."""
  sampling = _sampling(temperature, top_k, top_p)
  _check_inputs(input_ids, max_new_tokens, None, sampling, model.config.vocab_size, None)
  eos = model.config.eos_token_id if eos_id is None else int(eos_id)
  out = _autoregressive_program(model, jnp.asarray(input_ids, jnp.int32), _rng(rng),
                                max_new_tokens=int(max_new_tokens), sampling=sampling,
                                eos_id=eos)
  _raise_on_nan(out.stats['nan'], 'autoregressive_decode')
  return out.to_host()
