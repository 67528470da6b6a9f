"""The speculative engine: the loop state, input checks and ONE block step that the chain loop,
the tree loop and slot refill all call.

Shape legend: B batch, S source, N decoder-sequence buffer, W the proposal's width (gamma for a
chain, the depth D for a tree), W1 = W + 1, K the target's block (W1 for a chain, the M1 nodes of a
tree), V vocab, Df the target's d_model.

Per row b the state keeps `seq[b]` = [decoder_start, generated tokens...] and `lengths[b]` = the
number L of generated tokens. The target's cache holds input positions 0 .. L-1; the last
committed token seq[b, L] is the first token of the next block. One block step, for every row:
  1. propose  the draft proposes a chain of n <= W tokens (any stop rule) or a tree (the `form`)
  2. score    ONE target pass over the block at offset L (with its hidden states when the draft
              reads the target's features)
  3. verify   the verifier accepts m <= n proposed tokens and draws one more from the target
  4. commit   m + 1 tokens at seq[L+1:]; rows end at EOS / max_new_tokens; the target's cache
              follows the accepted path; the draft is told what was committed.
Rolling back rejected tokens is just the new, smaller length. Rows advance by different amounts;
finished rows keep their tokens and lengths. What the loops add is where the keys come from, the
trace, the tree's shape and the queue.

A `form` says what a proposal looks like: `Chain(gamma)` here, `tree_form.Tree(shape)` for trees. It
has `width`, `block_len` (cache slots a block needs) and six small methods (propose, score,
verify, flags, commit, settle) that block_step calls in order.

The verified block follows the proposal. Under a stop rule that can propose fewer than G drafts
(`Chain.for_rule`), the chain's score is a `lax.switch` over a few compiled block widths
(`stopping.block_widths`): the target scores the narrowest width >= max_b n_B[b] + 1 and its
logits (and hidden states) are padded back to G + 1 rows with zeros, so verify and commit see one
shape.
Nothing reads a padded row: the verifiers accept among the first n drafts and draw the next
token from p[m], m <= n < width; the statistics keep beta only below n; a feature head stores
hidden[i] for i <= m. The cache holds the block's width of new positions from offset L, and the
committed prefix needs L .. L + m < L + width of them. A fixed gamma keeps the one full block.

Buffers are sized so that no block is ever written out of range (`lax.dynamic_update_slice`
clamps silently): caches hold max_new_tokens + block_len positions, seq holds 1 + max_new_tokens
+ W + 1 tokens.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.decoding import acceptance, protocol, stopping
from specjax.decoding.protocol import Proposal, TargetFeatures
from specjax.decoding.stats import SpecStats, Verdict

DEFAULT_SEED = 0


# ----------------------------------------------------------------------------- state


@struct.dataclass
class LoopState:
  """What every speculative loop carries.

  seq:          [B, N] int32  decoder inputs [start, generated...]
  lengths:      [B]    int32  generated tokens per row
  done:         [B]    bool   row finished (EOS, max_new_tokens, NaN or a bad draft id)
  target_cache: DecoderCache  the target's cache
  draft_state:  pytree        the draft's state (a DecoderCache for a model draft)
  rng:          key           base key (how iteration keys derive from it is the loop's choice)
  stats:        SpecStats     per row
  """
  seq: jax.Array
  lengths: jax.Array
  done: jax.Array
  target_cache: Any
  draft_state: Any
  rng: jax.Array
  stats: Any

  def keys(self) -> tuple[jax.Array, jax.Array]:
    """This iteration's (draft keys [B], verify keys [B]): fold_in(rng, iteration), per row."""
    return split_keys(row_keys(self.rng, self.stats.iterations, self.seq.shape[0]))

  def last_tokens(self) -> jax.Array:
    """[B, 1] the last committed token of every row (the first of the next block)."""
    return jnp.take_along_axis(self.seq, self.lengths[:, None], axis=1)


def init_state(target, draft, input_ids_BxS, rng, *, form, max_new_tokens: int, cls=LoopState,
               stats_cls=SpecStats, **extra) -> LoopState:
  """Runs the target's encoder (and the draft's, if it has one) once and builds the state of
  class `cls` (a LoopState; `extra` are the fields a subclass adds)."""
  b = input_ids_BxS.shape[0]
  cache_len = max_new_tokens + form.block_len
  seq = jnp.zeros((b, max_new_tokens + form.width + 2), jnp.int32)
  seq = seq.at[:, 0].set(target.config.decoder_start_token_id)
  target_cache = target.init_cache(input_ids_BxS, cache_len)
  draft_state = (() if draft is None else
                 protocol.init_draft(draft, input_ids_BxS, cache_len, target_cache))
  return cls(seq=seq, lengths=jnp.zeros((b,), jnp.int32), done=jnp.zeros((b,), bool),
             target_cache=target_cache, draft_state=draft_state, rng=rng,
             stats=stats_cls.zeros(b, form.width), **extra)


def as_key(rng):
  """A PRNG key from None (DEFAULT_SEED), an int seed or a key."""
  if rng is None:
    return jax.random.PRNGKey(DEFAULT_SEED)
  if isinstance(rng, int):
    return jax.random.PRNGKey(rng)
  return rng


def row_keys(rng, step, batch):
  """One PRNG key per row for iteration `step`: split(fold_in(rng, step), batch)."""
  return jax.random.split(jax.random.fold_in(rng, step), batch)


def split_keys(keys_B):
  """(draft keys [B], verify keys [B]) from one key per row."""
  both_Bx2 = jax.vmap(lambda k: jax.random.split(k, 2))(keys_B)
  return both_Bx2[:, 0], both_Bx2[:, 1]


# ----------------------------------------------------------------------------- tokens


def commit_tokens(seq_BxN, lengths_B, done_B, block_BxK, n_emit_B, eos_id, max_new_tokens):
  """Writes each row's block at seq[L+1:], ends rows at EOS / max_new_tokens.

  block_BxK holds the candidate tokens; the first n_emit_B[b] of row b are committed. Returns
  (seq_BxN, lengths_B, done_B); finished rows are left as they were.
  """
  valid_BxK = jnp.arange(block_BxK.shape[1])[None, :] < n_emit_B[:, None]
  is_eos_BxK = valid_BxK & (block_BxK == eos_id)
  has_eos_B = is_eos_BxK.any(axis=1)
  n_keep_B = jnp.where(has_eos_B, jnp.argmax(is_eos_BxK, axis=1) + 1, n_emit_B)
  new_len_B = jnp.minimum(lengths_B + n_keep_B, max_new_tokens)
  new_done_B = has_eos_B | (new_len_B >= max_new_tokens)
  write = jax.vmap(lambda s, blk, start: jax.lax.dynamic_update_slice(s, blk, (start,)))
  new_seq_BxN = write(seq_BxN, block_BxK, lengths_B + 1)
  seq_BxN = jnp.where(done_B[:, None], seq_BxN, new_seq_BxN)
  lengths_B = jnp.where(done_B, lengths_B, new_len_B)
  return seq_BxN, lengths_B, done_B | new_done_B


def finish_tokens(seq_BxN, lengths_B, max_new_tokens, pad_id):
  """[B, M] generated tokens of the sequence buffer, pad past each row's length."""
  gen_BxM = seq_BxN[:, 1:1 + max_new_tokens]
  keep = jnp.arange(max_new_tokens)[None, :] < lengths_B[:, None]
  return jnp.where(keep, gen_BxM, pad_id)


# ----------------------------------------------------------------------------- the chain form


@dataclasses.dataclass(frozen=True)
class Chain:
  """A proposal of up to `gamma` tokens in a row (gamma = 0: a plain decoding step, no draft call;
  the token is drawn from p[0]). `widths`: the target block widths compiled as branches of one
  switch (ascending, the last gamma + 1; module docstring); () scores the full block only."""
  gamma: int
  widths: tuple[int, ...] = ()

  @classmethod
  def for_rule(cls, gamma: int, stop) -> Chain:
    """The chain form for `stop`: narrower blocks only when the rule can propose fewer than gamma
    drafts (stopping.may_shorten); Fixed keeps today's single full-width program."""
    if gamma < 1 or not stopping.may_shorten(stop):
      return cls(gamma)
    return cls(gamma, stopping.block_widths(gamma))

  @property
  def width(self) -> int:
    return self.gamma

  @property
  def block_len(self) -> int:
    return self.gamma + 1

  def propose(self, draft, state, st: LoopState, keys_B, sampling, stop, limit_B,
              vocab: int) -> Proposal:
    if self.gamma == 0:  # nothing to draft
      b = st.seq.shape[0]
      return Proposal(tokens_BxG=jnp.zeros((b, 0), jnp.int32),
                      q_BxGxV=jnp.zeros((b, 0, vocab), jnp.float32),
                      n_B=jnp.zeros((b,), jnp.int32), passes=jnp.int32(0), state=state)
    prop = draft.propose(state, st.seq, st.lengths, keys_B, self.gamma, sampling, stop=stop,
                         limit_B=limit_B)
    return prop.replace(n_B=stop.truncate(prop.tokens_BxG, prop.q_BxGxV, prop.n_B))

  def score(self, target, draft, cache, prop: Proposal, st: LoopState):
    """The target's pass over [last committed, d_1 .. d_G]: (logits, hidden or None, cache).
    With `widths`, over its first K columns only, K the narrowest width >= max n_B + 1 over the
    unfinished rows, padded back to G + 1 rows."""
    block_BxG1 = jnp.concatenate([st.last_tokens(), prop.tokens_BxG], axis=1)
    if len(self.widths) <= 1:
      return _score_width(target, draft, cache, block_BxG1, st.lengths, self.gamma + 1)
    need = jnp.max(jnp.where(st.done, 0, prop.n_B)) + 1
    branch = jnp.searchsorted(jnp.asarray(self.widths, jnp.int32), need)
    branches = [functools.partial(_score_width, target, draft, width=w) for w in self.widths]
    return jax.lax.switch(jnp.minimum(branch, len(self.widths) - 1), branches, cache, block_BxG1,
                          st.lengths)

  def verify(self, verifier, keys_B, prop: Proposal, logits_BxG1xV, sampling) -> Verdict:
    m_B, next_B, beta_BxG = verifier.chain(keys_B, prop.tokens_BxG, prop.q_BxGxV, logits_BxG1xV,
                                           prop.n_B, sampling)
    return Verdict(n_B=prop.n_B, m_B=m_B, next_B=next_B, beta_BxW=beta_BxG,
                   tokens_BxW=prop.tokens_BxG, path_BxW1=None, verified_B=prop.n_B)

  def settle(self, cache, start_B, verdict: Verdict):
    """A chain's accepted prefix is already in place: the new length masks the rest."""
    return cache

  def commit(self, draft, state, seq_BxN, lengths_B, start_B, verdict: Verdict, hidden):
    if draft is None:
      return state
    features = None if hidden is None else TargetFeatures(hidden_BxG1xD=hidden, start_B=start_B)
    return protocol.commit_draft(draft, state, seq_BxN, lengths_B, features)

  def flags(self, prop: Proposal, vocab: int):
    """(NaN in q, a proposed id outside [0, vocab)) as [] bools."""
    return (jnp.isnan(prop.q_BxGxV).any(),
            acceptance.out_of_range(prop.tokens_BxG, prop.n_B, vocab))


def _score_width(target, draft, cache, block_BxG1, lengths_B, width: int):
  """The verification pass over the block's first `width` tokens; logits (and hidden states)
  padded with zero rows to G + 1 (rows >= width are never read: module docstring)."""
  logits_BxKxV, features, cache = protocol.verify_pass(target, draft, cache,
                                                       block_BxG1[:, :width], lengths_B)
  pad = ((0, 0), (0, block_BxG1.shape[1] - width), (0, 0))
  hidden = None if features is None else jnp.pad(features.hidden_BxG1xD, pad)
  return jnp.pad(logits_BxKxV, pad), hidden, cache


# ----------------------------------------------------------------------------- the step


def block_step(target, draft, form, st: LoopState, keys, *, sampling, verifier, stop, eos_id: int,
               max_new_tokens: int, with_rule_state: bool = False):
  """One iteration for every unfinished row: propose, one target pass, verify, commit (module
  docstring). `keys` = (draft keys [B], verify keys [B]). Returns the new state and the verdict
  (for the loop's own bookkeeping: trace, per-request statistics), and with `with_rule_state` the
  stop rule's state after the rollout (Proposal.rule_state: an
  acceptance_predictor.Recorder's log)."""
  draft_keys_B, verify_keys_B = keys
  vocab = target.config.vocab_size
  limit_B = (jnp.where(st.done, 0, stop.limit(st.stats, form.width)) if form.width
             else jnp.zeros_like(st.lengths))
  prop = form.propose(draft, st.draft_state, st, draft_keys_B, sampling, stop, limit_B, vocab)
  logits_BxKxV, hidden, target_cache = form.score(target, draft, st.target_cache, prop, st)
  verdict = form.verify(verifier, verify_keys_B, prop, logits_BxKxV, sampling)
  w = verdict.tokens_BxW.shape[1]
  cand_BxW1 = jnp.where(jnp.arange(w + 1)[None, :] == verdict.m_B[:, None],
                        verdict.next_B[:, None], jnp.pad(verdict.tokens_BxW, ((0, 0), (0, 1))))
  seq, lengths, done = commit_tokens(st.seq, st.lengths, st.done, cand_BxW1, verdict.m_B + 1,
                                     eos_id, max_new_tokens)
  nan_q, bad = form.flags(prop, vocab)
  stats = st.stats.record(~st.done, verdict, prop.passes, jnp.isnan(logits_BxKxV).any() | nan_q,
                          bad)
  draft_state = form.commit(draft, prop.state, seq, lengths, st.lengths, verdict, hidden)
  new = st.replace(seq=seq, lengths=lengths, done=done | stats.nan | stats.bad_draft,
                   target_cache=form.settle(target_cache, st.lengths, verdict),
                   draft_state=draft_state, stats=stats)
  if with_rule_state:
    return new, verdict, getattr(prop, 'rule_state', None)
  return new, verdict


def run_loop(state, step):
  """`step` until every row is done, as one lax.while_loop."""
  def cond_fn(state):
    return ~jnp.all(state.done)

  def body_fn(state):
    return step(state)

  return jax.lax.while_loop(cond_fn, body_fn, state)


# ----------------------------------------------------------------------------- checks


def check_inputs(input_ids, max_new_tokens, gamma, sampling, vocab_target, vocab_draft):
  """Bad decoder input -> ValueError naming the field, before anything is traced."""
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


def eos_of(target, eos_id) -> int:
  """The token that ends a row: `eos_id`, or the target's eos_token_id when None."""
  return target.config.eos_token_id if eos_id is None else int(eos_id)


def draft_vocab(draft) -> int:
  """The draft's vocab_size, or a one-line ValueError for an object that is no draft."""
  vocab = getattr(draft, 'vocab_size', None)
  if vocab is None:
    raise ValueError(f'draft {type(draft).__name__} has no vocab_size: a draft implements '
                     'specjax.decoding.protocol.Draft (see docs/extending.md)')
  return int(vocab)


def raise_on_nan(nan, what):
  """The loops' NaN flag (set on device) as a FloatingPointError after the call."""
  if bool(nan):
    raise FloatingPointError(f'{what}: NaN in model logits (check the checkpoint and dtype); '
                             'no tokens returned')


def checked(out, what: str, draft, vocab: int):
  """The output on the host, after the device flags are turned into errors (NaN, a bad id)."""
  raise_on_nan(out.stats.nan, what)
  if bool(out.stats.bad_draft):
    raise ValueError(f'{what}: the draft {type(draft).__name__} proposed a token id outside '
                     f'[0, {vocab}) (vocab_size); no tokens returned')
  return out.to_host()
