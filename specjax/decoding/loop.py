"""Speculative and autoregressive decoding, each one jit-compiled `lax.while_loop` program.

Shape legend: B batch, S source, N decoder-sequence buffer, G gamma (the block width; G_MAX under
a stop rule), G1 = gamma + 1, V vocab, I iterations recorded in a trace.

Per row b the loop keeps `seq[b]` = [decoder_start, generated tokens...] and `lengths[b]` = number of
generated tokens L. The target's cache holds input positions 0 .. L-1; the last committed token
seq[b, L] is the first token of the next verification block [seq[L], d_1 .. d_G], written at offset
L in ONE target call. The draft proposes n_B[b] <= G tokens (a stop rule may end a row early; the
draft protocol is specjax.decoding.protocol); only those are verified, and row b commits m+1
tokens (m <= n accepted drafts and one corrected or bonus token drawn at index m); rolling back
rejected drafts is just the new, smaller length. Rows advance by different amounts; finished rows
keep their tokens and lengths.

Public pieces: speculative_decode / autoregressive_decode (validated entry points);
speculative_init / speculative_step and autoregressive_init / autoregressive_step (one iteration,
usable from a Python loop or a custom jit); speculative_program / autoregressive_program (the
jitted whole-loop programs, unchecked: e.g. `.lower(...)` on abstract shapes for compile-only
checks); make_sampling (the static Sampling), as_draft (a T5Model -> ModelDraft).

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

from specjax.decoding import acceptance, protocol
from specjax.decoding import sampling as sampling_lib
from specjax.decoding import stopping
from specjax.decoding.drafts import ModelDraft
from specjax.models.t5 import T5Model

DEFAULT_SEED = 0

# Times each program was traced, keyed by name; tests assert no retracing on same shapes.
TRACE_COUNTS: collections.Counter = collections.Counter()


def per_target_call(count_B, target_calls_B) -> float:
  """sum(count) / sum(target calls): a per-row counter averaged over the batch's target calls."""
  return float(np.sum(count_B) / max(int(np.sum(target_calls_B)), 1))


@struct.dataclass
class SpecStats:
  """On-device statistics of one speculative_decode call.

  iterations:      []       outer loop iterations (= target calls for the batch)
  draft_passes:    []       draft forward passes actually made (data-dependent under stop rules;
                            0 for model-free drafts); `draft_calls` is the same number
  target_calls:    [B]      iterations in which the row was still generating
  proposed_hist:   [B, G1]  how often the row proposed n = 0 .. G drafts in one iteration
  accepted_hist:   [B, G1]  how often m = 0 .. G drafts were accepted in one iteration
  proposed:        [B]      proposed (= verified) draft tokens
  accepted:        [B]      accepted draft tokens
  emitted:         [B]      tokens produced by verification (m + 1 per iteration, before any
                            truncation at EOS or max_new_tokens)
  alpha_sum:       [B]      sum over verified positions whose prefix was accepted of
                            sum_x min(p(x), q(x)) (the paper's beta, Cor. 3.6)
  alpha_count:     [B]      number of such positions
  nan:             []       a NaN appeared in the target's or draft's logits
  bad_draft:       []       a draft proposed a token id outside [0, V) (a broken draft)
  """
  iterations: jax.Array
  draft_passes: jax.Array
  target_calls: jax.Array
  proposed_hist: jax.Array
  accepted_hist: jax.Array
  proposed: jax.Array
  accepted: jax.Array
  emitted: jax.Array
  alpha_sum: jax.Array
  alpha_count: jax.Array
  nan: jax.Array
  bad_draft: jax.Array

  @classmethod
  def zeros(cls, batch: int, gamma: int) -> SpecStats:
    zeros_B, hist_BxG1 = jnp.zeros((batch,), jnp.int32), jnp.zeros((batch, gamma + 1), jnp.int32)
    return cls(iterations=jnp.int32(0), draft_passes=jnp.int32(0), target_calls=zeros_B,
               proposed_hist=hist_BxG1, accepted_hist=hist_BxG1, proposed=zeros_B,
               accepted=zeros_B, emitted=zeros_B, alpha_sum=jnp.zeros((batch,), jnp.float32),
               alpha_count=zeros_B, nan=jnp.bool_(False), bad_draft=jnp.bool_(False))

  def record(self, active_B, n_B, m_B, beta_BxG, passes, nan, bad_draft) -> SpecStats:
    """The statistics after one iteration: rows active_B proposed n_B and accepted m_B drafts."""
    act_B = active_B.astype(jnp.int32)
    idx_G1 = jnp.arange(self.gamma + 1)
    # beta counts at the verified positions whose prefix was accepted: i <= m and i < n.
    on_prefix_BxG = (idx_G1[None, :-1] <= m_B[:, None]) & (idx_G1[None, :-1] < n_B[:, None])
    return self.replace(
        iterations=self.iterations + 1,
        draft_passes=self.draft_passes + passes,
        target_calls=self.target_calls + act_B,
        proposed_hist=self.proposed_hist + act_B[:, None] * (idx_G1[None, :] == n_B[:, None]),
        accepted_hist=self.accepted_hist + act_B[:, None] * (idx_G1[None, :] == m_B[:, None]),
        proposed=self.proposed + act_B * n_B,
        accepted=self.accepted + act_B * m_B,
        emitted=self.emitted + act_B * (m_B + 1),
        alpha_sum=self.alpha_sum + jnp.where(active_B, jnp.sum(
            jnp.where(on_prefix_BxG, beta_BxG, 0.0), axis=1), 0.0),
        alpha_count=self.alpha_count + act_B * jnp.sum(on_prefix_BxG, axis=1),
        nan=self.nan | nan, bad_draft=self.bad_draft | bad_draft)

  @property
  def gamma(self) -> int:
    return self.accepted_hist.shape[-1] - 1

  @property
  def draft_calls(self):
    """Draft forward passes (the former name of draft_passes)."""
    return self.draft_passes

  @property
  def alpha(self) -> float:
    """The paper's alpha = E[sum_x min(p, q)], estimated on the target's own prefixes."""
    return float(np.sum(self.alpha_sum) / max(int(np.sum(self.alpha_count)), 1))

  @property
  def acceptance_rate(self) -> float:
    """Accepted drafts / proposed drafts (the empirical per-token acceptance)."""
    return float(np.sum(self.accepted) / max(int(np.sum(self.proposed)), 1))

  @property
  def tokens_per_target_call(self) -> float:
    return per_target_call(self.emitted, self.target_calls)

  @property
  def proposed_per_target_call(self) -> float:
    return per_target_call(self.proposed, self.target_calls)

  def summary(self) -> dict[str, Any]:
    return {
        'iterations': int(self.iterations),
        'draft_calls': int(self.draft_passes),
        'draft_passes': int(self.draft_passes),
        'target_calls': int(np.sum(self.target_calls)),
        'proposed_hist': np.asarray(self.proposed_hist).sum(0).tolist(),
        'accepted_hist': np.asarray(self.accepted_hist).sum(0).tolist(),
        'alpha': self.alpha,
        'acceptance_rate': self.acceptance_rate,
        'proposed_per_target_call': self.proposed_per_target_call,
        'tokens_per_target_call': self.tokens_per_target_call,
    }


@struct.dataclass
class DecodeOutput:
  """tokens [B, max_new_tokens] (pad after each row's end), lengths [B] (EOS counted), stats.

  With trace=True, `trace_drafts` [B, I, G] holds each iteration's drafted tokens (0 past the
  proposal), `trace_proposed` [B, I] how many were proposed and `trace_accepted` [B, I] how many
  were accepted (both -1 once the row had finished); the committed tokens give the corrected /
  bonus token of each iteration.
  """
  tokens: jax.Array
  lengths: jax.Array
  stats: Any = None
  trace_drafts: Any = None
  trace_accepted: Any = None
  trace_proposed: Any = None

  def to_host(self) -> 'DecodeOutput':
    """tokens and lengths as numpy arrays, which tokenizers' batch_decode accepts (a JAX array
    it does not); kept on device when sharded over several hosts (not addressable here)."""
    host = lambda x: np.asarray(x) if getattr(x, 'is_fully_addressable', True) else x
    return self.replace(tokens=host(self.tokens), lengths=host(self.lengths))


@struct.dataclass
class LoopState:
  """What every speculative loop carries (chains here, trees in specjax.decoding.tree): per-row
  sequences, lengths and done flags, the two models' states, the base key and the statistics."""
  seq: jax.Array
  lengths: jax.Array
  done: jax.Array
  target_cache: Any
  draft_state: Any
  rng: jax.Array
  stats: Any


@struct.dataclass
class SpecState(LoopState):
  """Loop state of speculative decoding.

  seq:            [B, N] int32  decoder inputs [start, generated...], N = max_new + gamma + 2
  lengths:        [B]    int32  generated tokens per row
  done:           [B]    bool   row finished (EOS, max_new_tokens, NaN or a bad draft id)
  target_cache:   DecoderCache  target's cache, max_new + gamma + 1 positions
  draft_state:    pytree        the draft's state (a DecoderCache for a model draft)
  rng:            key           base key; iteration i uses fold_in(rng, i), split per row
  stats:          SpecStats
  trace_drafts / trace_accepted / trace_proposed: see DecodeOutput (shape [B, 0, G] / [B, 0] /
                  [B, 0] when not traced)
  """
  trace_drafts: jax.Array
  trace_accepted: jax.Array
  trace_proposed: jax.Array

  def keys(self) -> tuple[jax.Array, jax.Array]:
    """This iteration's (draft keys [B], verify keys [B]): fold_in(rng, iteration), per row."""
    keys_B = row_keys(self.rng, self.stats.iterations, self.seq.shape[0])
    both_Bx2 = jax.vmap(lambda k: jax.random.split(k, 2))(keys_B)
    return both_Bx2[:, 0], both_Bx2[:, 1]

  def last_tokens(self) -> jax.Array:
    """[B, 1] the last committed token of every row (the first of the verification block)."""
    return jnp.take_along_axis(self.seq, self.lengths[:, None], axis=1)

  def record_trace(self, active_B, draft_BxG, n_B, m_B) -> SpecState:
    """Writes this iteration's drafts and counts into the trace (a no-op when not traced)."""
    if not self.trace_drafts.shape[1]:
      return self
    it = jnp.minimum(self.stats.iterations, self.trace_drafts.shape[1] - 1)
    return self.replace(
        trace_drafts=self.trace_drafts.at[:, it].set(
            jnp.where(active_B[:, None], protocol.pad_after(draft_BxG, n_B), 0)),
        trace_accepted=self.trace_accepted.at[:, it].set(jnp.where(active_B, m_B, -1)),
        trace_proposed=self.trace_proposed.at[:, it].set(jnp.where(active_B, n_B, -1)))


def as_draft(draft):
  """A draft implementing specjax.decoding.protocol.Draft: a T5Model becomes a ModelDraft."""
  return ModelDraft(draft) if isinstance(draft, T5Model) else draft


def make_sampling(temperature: float = 0.0, top_k: int = 0,
                  top_p: float = 1.0) -> sampling_lib.Sampling:
  """The (hashable, static) Sampling for these settings, numbers normalised to Python types."""
  return sampling_lib.Sampling(temperature=float(temperature), top_k=int(top_k),
                               top_p=float(top_p))


def check_inputs(input_ids, max_new_tokens, gamma, sampling, vocab_target, vocab_draft):
  """Bad decoder input -> ValueError, before anything is traced (shared by every loop)."""
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


def finish_tokens(seq_BxN, lengths_B, max_new_tokens, pad_id):
  """[B, M] generated tokens of the sequence buffer, pad past each row's length."""
  gen_BxM = seq_BxN[:, 1:1 + max_new_tokens]
  keep = jnp.arange(max_new_tokens)[None, :] < lengths_B[:, None]
  return jnp.where(keep, gen_BxM, pad_id)


def commit_tokens(seq_BxN, lengths_B, done_B, block_BxK, n_emit_B, eos_id, max_new_tokens):
  """Writes each row's block at seq[L+1:], ends rows at EOS / max_new_tokens.

  block_BxK holds the candidate tokens; the first n_emit_B[b] of row b are committed. Returns
  (seq_BxN, lengths_B, done_B); finished rows are left as they were.
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
  draft = as_draft(draft)
  b = input_ids_BxS.shape[0]
  cache_len = max_new_tokens + gamma + 1
  seq = jnp.zeros((b, max_new_tokens + gamma + 2), jnp.int32)
  seq = seq.at[:, 0].set(target.config.decoder_start_token_id)
  # The trace has one slot per possible iteration (at least one token per iteration).
  n_trace = max_new_tokens if trace else 0
  target_cache = target.init_cache(input_ids_BxS, cache_len)
  return SpecState(
      seq=seq, lengths=jnp.zeros((b,), jnp.int32), done=jnp.zeros((b,), bool),
      target_cache=target_cache,
      draft_state=protocol.init_draft(draft, input_ids_BxS, cache_len, target_cache), rng=rng,
      stats=SpecStats.zeros(b, gamma),
      trace_drafts=jnp.zeros((b, n_trace, gamma), jnp.int32),
      trace_accepted=jnp.full((b, n_trace), -1, jnp.int32),
      trace_proposed=jnp.full((b, n_trace), -1, jnp.int32))


def speculative_step(target: T5Model, draft, state: SpecState, *, gamma: int,
                     max_new_tokens: int, sampling: sampling_lib.Sampling, eos_id: int,
                     stop: stopping.StopRule | None = None, verifier: str = 'token',
                     verify_fn=None) -> SpecState:
  """One iteration of Algorithm 1 for every unfinished row: draft, score, verify, commit.

  `stop` (default stopping.Fixed()) sets how many of the gamma slots each row proposes;
  `verifier` names a rule of acceptance.VERIFIERS; a `verify_fn` replaces it in every mode
  (see acceptance.verify_batch).
  """
  draft, stop = as_draft(draft), stop or stopping.Fixed()
  draft_keys_B, verify_keys_B = state.keys()
  # 1. The draft proposes up to gamma tokens per row, n_B of them, with the q they came from.
  limit_B = jnp.where(state.done, 0, stop.limit(state.stats, gamma))
  prop = draft.propose(state.draft_state, state.seq, state.lengths, draft_keys_B, gamma,
                       sampling, stop=stop, limit_B=limit_B)
  n_B = stop.truncate(prop.tokens_BxG, prop.q_BxGxV, prop.n_B)
  # 2. The target scores the block [last committed, d_1 .. d_G] in one call: p_0 .. p_G.
  block_BxG1 = jnp.concatenate([state.last_tokens(), prop.tokens_BxG], axis=1)
  logits_BxG1xV, features, target_cache = protocol.verify_pass(target, draft, state.target_cache,
                                                               block_BxG1, state.lengths)
  # 3. Accept m <= n drafts, then one token from the target at index m (residual or bonus).
  m_B, next_B, beta_BxG = acceptance.verify_batch(
      verify_keys_B, prop.tokens_BxG, prop.q_BxGxV, logits_BxG1xV, n_B, sampling,
      verifier=verifier, verify_fn=verify_fn)
  # 4. Commit d_1 .. d_m and the target's token; rows end at EOS / max_new_tokens.
  padded_BxG1 = jnp.pad(prop.tokens_BxG, ((0, 0), (0, 1)))
  cand_BxG1 = jnp.where(jnp.arange(gamma + 1)[None, :] == m_B[:, None], next_B[:, None],
                        padded_BxG1)
  seq, lengths, done = commit_tokens(state.seq, state.lengths, state.done, cand_BxG1, m_B + 1,
                                     eos_id, max_new_tokens)
  nan = jnp.isnan(logits_BxG1xV).any() | jnp.isnan(prop.q_BxGxV).any()
  bad = acceptance.out_of_range(prop.tokens_BxG, n_B, target.config.vocab_size)
  active_B = ~state.done
  state = state.record_trace(active_B, prop.tokens_BxG, n_B, m_B)
  stats = state.stats.record(active_B, n_B, m_B, beta_BxG, prop.passes, nan, bad)
  return state.replace(seq=seq, lengths=lengths, done=done | stats.nan | stats.bad_draft,
                       target_cache=target_cache, stats=stats,
                       draft_state=protocol.commit_draft(draft, prop.state, seq, lengths,
                                                         features))


@functools.partial(jax.jit, static_argnames=('gamma', 'max_new_tokens', 'sampling', 'eos_id',
                                             'trace', 'stop', 'verifier', 'verify_fn'))
def speculative_program(target, draft, input_ids_BxS, rng, *, gamma, max_new_tokens, sampling,
                        eos_id, trace=False, stop=None, verifier='token', verify_fn=None):
  """The whole speculative loop as one jitted program (static: gamma .. verify_fn; `sampling` from
  make_sampling, `stop` a StopRule or None). No input checks (speculative_decode does them): the
  handle for compile-only checks, `speculative_program.lower(...)`."""
  TRACE_COUNTS['speculative'] += 1
  state = speculative_init(target, draft, input_ids_BxS, rng, gamma=gamma,
                           max_new_tokens=max_new_tokens, trace=trace)

  def cond_fn(state: SpecState):
    return ~jnp.all(state.done)

  def body_fn(state: SpecState):
    return speculative_step(target, draft, state, gamma=gamma, max_new_tokens=max_new_tokens,
                            sampling=sampling, eos_id=eos_id, stop=stop, verifier=verifier,
                            verify_fn=verify_fn)

  state = jax.lax.while_loop(cond_fn, body_fn, state)
  return DecodeOutput(
      tokens=finish_tokens(state.seq, state.lengths, max_new_tokens, target.config.pad_token_id),
      lengths=state.lengths, stats=state.stats,
      trace_drafts=state.trace_drafts if trace else None,
      trace_accepted=state.trace_accepted if trace else None,
      trace_proposed=state.trace_proposed if trace else None)


def raise_on_nan(nan, what):
  """The loops' NaN flag (set on device) as a FloatingPointError after the call."""
  if bool(nan):
    raise FloatingPointError(f'{what}: NaN in model logits (check the checkpoint and dtype); '
                             'no tokens returned')


def _speculative_args(target, draft, input_ids, *, gamma, max_new_tokens, temperature, top_k,
                      top_p, rng, eos_id, trace, stop, verifier, verify_fn):
  """Validated (args, static kwargs) of speculative_program; raises before any compile."""
  sampling = make_sampling(temperature, top_k, top_p)
  draft = as_draft(draft)
  vocab_draft = getattr(draft, 'vocab_size', None)
  if vocab_draft is None:
    raise ValueError(f'draft {type(draft).__name__} has no vocab_size: a draft implements '
                     'specjax.decoding.protocol.Draft (see docs/extending.md)')
  if verify_fn is None and verifier not in acceptance.VERIFIERS:
    raise ValueError(f'verifier {verifier!r} unknown; choose from {sorted(acceptance.VERIFIERS)}')
  check_inputs(input_ids, max_new_tokens, gamma, sampling, target.config.vocab_size,
               int(vocab_draft))
  eos = target.config.eos_token_id if eos_id is None else int(eos_id)
  args = (target, draft, jnp.asarray(input_ids, jnp.int32), as_key(rng))
  return args, dict(gamma=int(gamma), max_new_tokens=int(max_new_tokens), sampling=sampling,
                    eos_id=eos, trace=bool(trace), stop=stop or stopping.Fixed(),
                    verifier=verifier, verify_fn=verify_fn)


def speculative_decode(target: T5Model, draft, input_ids, *, gamma: int | None = None,
                       max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
                       top_p: float = 1.0, rng=None, eos_id: int | None = None,
                       trace: bool = False, stop: stopping.StopRule | None = None,
                       verifier: str = 'token', verify_fn=None, tree=None,
                       slots: int | None = None) -> DecodeOutput:
  """Exact speculative decoding (Leviathan et al. 2023) of a batch of right-padded prompts.

  `draft` is a smaller T5Model or any draft of specjax.decoding.drafts (anything implementing
  specjax.decoding.protocol.Draft). The output distribution is exactly the target's (after
  temperature / top-k / top-p); temperature 0 is exact greedy. `gamma` is the block width;
  `stop` (a specjax.decoding.stopping rule; None = Fixed(), the paper) decides per row how many of
  the gamma slots are proposed. `verifier` names a rule of acceptance.VERIFIERS. `verify_fn`
  replaces it (signature of acceptance.verify, a module-level function), in greedy mode too: for
  research on acceptance rules and for the tests' negative controls.
  `tree` (a branching tuple like (3, 2, 1); gamma = its depth) verifies a token tree instead of a
  chain: specjax.decoding.tree.tree_decode (verify_fn then has tree.verify_tree's signature).
  `slots=B` decodes the Q rows of input_ids as a queue through B rows of one loop (a finished row
  takes the next prompt); gamma='auto' (or 'auto:G_MAX') picks gamma in 0 .. G_MAX per iteration
  from measured costs and the running alpha: specjax.decoding.refill.
  """
  if (tree is not None or slots is not None or isinstance(gamma, str)) and protocol.reads_target(
      as_draft(draft)):
    raise ValueError(f'speculative_decode: {type(draft).__name__} reads the target\'s features; '
                     'it runs with a chain (no tree=), without slots= and with an integer gamma')
  if tree is not None:
    from specjax.decoding import tree as tree_lib  # pylint: disable=import-outside-toplevel
    shape = tree_lib.parse_tree(tree)
    if gamma is not None and int(gamma) != shape.depth:
      raise ValueError(f'gamma={gamma} but tree={tree} has depth {shape.depth} (gamma = depth)')
    if trace or stop is not None or verifier != 'token':
      raise ValueError('tree= does not take trace, stop or verifier')
    return tree_lib.tree_decode(target, draft, input_ids, tree=shape,
                                max_new_tokens=max_new_tokens, temperature=temperature,
                                top_k=top_k, top_p=top_p, rng=rng, eos_id=eos_id,
                                verify_fn=verify_fn)
  if gamma is None:
    raise ValueError('speculative_decode: gamma is required (or tree=)')
  if slots is not None or isinstance(gamma, str) or not isinstance(gamma, (int, np.integer)):
    # slots=B refills finished rows from the queue; gamma='auto' picks gamma per iteration.
    from specjax.decoding import refill  # pylint: disable=import-outside-toplevel
    if trace:
      raise ValueError('speculative_decode: trace=True does not combine with slots= or gamma=auto')
    return refill.refill_decode(target, draft, input_ids, slots=slots, gamma=gamma,
                                max_new_tokens=max_new_tokens, temperature=temperature,
                                top_k=top_k, top_p=top_p, rng=rng, eos_id=eos_id, stop=stop,
                                verifier=verifier, verify_fn=verify_fn)
  args, static = _speculative_args(
      target, draft, input_ids, gamma=gamma, max_new_tokens=max_new_tokens,
      temperature=temperature, top_k=top_k, top_p=top_p, rng=rng, eos_id=eos_id, trace=trace,
      stop=stop, verifier=verifier, verify_fn=verify_fn)
  out = speculative_program(*args, **static)
  raise_on_nan(out.stats.nan, 'speculative_decode')
  if bool(out.stats.bad_draft):
    raise ValueError(f'speculative_decode: the draft {type(args[1]).__name__} proposed a token id '
                     f'outside [0, {target.config.vocab_size}) (vocab_size); no tokens returned')
  return out.to_host()


# ----------------------------------------------------------------------------- autoregressive


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
    tok_B = jnp.argmax(logits_Bx1xV[:, 0], axis=-1).astype(jnp.int32)
  else:
    p_BxV = sampling_lib.probs(logits_Bx1xV[:, 0], sampling)
    tok_B = jax.vmap(sampling_lib.sample)(row_keys(state.rng, state.step, b), p_BxV)
  seq, lengths, done = commit_tokens(state.seq, state.lengths, state.done, tok_B[:, None],
                                     jnp.ones((b,), jnp.int32), eos_id, max_new_tokens)
  nan = state.nan | jnp.isnan(logits_Bx1xV).any()
  return state.replace(seq=seq, lengths=lengths, done=done | nan, cache=cache,
                       step=state.step + 1, nan=nan)


@functools.partial(jax.jit, static_argnames=('max_new_tokens', 'sampling', 'eos_id'))
def autoregressive_program(model, input_ids_BxS, rng, *, max_new_tokens, sampling, eos_id):
  """The whole autoregressive loop as one jitted program (static: max_new_tokens, sampling from
  make_sampling, eos_id). No input checks (autoregressive_decode does them)."""
  TRACE_COUNTS['autoregressive'] += 1
  state = autoregressive_init(model, input_ids_BxS, rng, max_new_tokens=max_new_tokens)

  def cond_fn(state: ARState):
    return ~jnp.all(state.done)

  def body_fn(state: ARState):
    return autoregressive_step(model, state, max_new_tokens=max_new_tokens, sampling=sampling,
                               eos_id=eos_id)

  state = jax.lax.while_loop(cond_fn, body_fn, state)
  return DecodeOutput(tokens=finish_tokens(state.seq, state.lengths, max_new_tokens,
                                           model.config.pad_token_id),
                      lengths=state.lengths, stats={'steps': state.step, 'nan': state.nan})


def autoregressive_decode(model: T5Model, input_ids, *, max_new_tokens: int,
                          temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, rng=None,
                          eos_id: int | None = None, slots: int | None = None) -> DecodeOutput:
  """The baseline: one token per target call, same model code, one jit'd while_loop.
  `slots=B`: B rows live in the loop and a finished row takes the next prompt
  (specjax.decoding.refill)."""
  if slots is not None:
    from specjax.decoding import refill  # pylint: disable=import-outside-toplevel
    return refill.refill_decode(model, None, input_ids, slots=slots, gamma=0,
                                max_new_tokens=max_new_tokens, temperature=temperature,
                                top_k=top_k, top_p=top_p, rng=rng, eos_id=eos_id,
                                what='autoregressive_decode')
  sampling = make_sampling(temperature, top_k, top_p)
  check_inputs(input_ids, max_new_tokens, None, sampling, model.config.vocab_size, None)
  eos = model.config.eos_token_id if eos_id is None else int(eos_id)
  out = autoregressive_program(model, jnp.asarray(input_ids, jnp.int32), as_key(rng),
                               max_new_tokens=int(max_new_tokens), sampling=sampling, eos_id=eos)
  raise_on_nan(out.stats['nan'], 'autoregressive_decode')
  return out.to_host()
