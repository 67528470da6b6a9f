"""The draft protocol: what the speculative loop asks of a draft, what a draft hands back, and the
rollout loop that drafts share.

Shape legend: B batch, S source, N decoder-sequence buffer, G the block width (gamma, or G_MAX under
a stop rule), V vocab.

A draft is a pytree (a `flax.struct.dataclass`, so it enters `jax.jit` beside the target) with:

  vocab_size                                  int, must equal the target's
  init(input_ids_BxS, max_len) -> state       per-batch state (a model draft's cache); runs once
  propose(state, seq_BxN, lengths_B, keys_B, gamma, sampling, *, stop, limit_B) -> Proposal
      Up to `gamma` drafts per row after the committed prefix seq[b, :lengths[b] + 1]
      ([start, generated...]; the last committed token is seq[b, lengths[b]]). Row b proposes
      n_B[b] <= limit_B[b] tokens; slots >= n_B[b] are padding and are never accepted. `stop` is a
      `specjax.decoding.stopping.StopRule`: a draft that drafts token by token calls its `before`
      and `after` hooks through `rollout`; one that computes its whole block at once uses `cut`.
      keys_B holds one PRNG key per row, fresh every iteration.
  commit(state, seq_BxN, lengths_B) -> state  called after acceptance with the new committed prefix;
                                              the hook for drafts whose state must follow it

A draft that reads the target's own features (a feature head, specjax.decoding.feature_head)
sets the class attribute `reads_target = True`; the loop then calls

  init(input_ids_BxS, max_len, *, target_cache)              the target's DecoderCache (its
                                                             encoder already ran: no second one)
  commit(state, seq_BxN, lengths_B, *, features)             a TargetFeatures of the block the
                                                             target just verified

and takes the hidden states from the verification pass itself (T5Model.decode_features): no
extra target pass. `init_draft` / `commit_draft` below make both calls for every draft.

Two optional members:

  resync(state, seq_BxN, lengths_B) -> state   brings the state up to the committed prefix after
                                              iterations that did not call the draft (gamma =
                                              'auto' runs plain decoding steps); drafts without
                                              prefix state omit it
  propose_tree(state, seq_BxN, lengths_B, keys_B, shape, sampling) -> TreeProposal
  commit_tree(state, seq_BxN, lengths_B, *, start_B, path_BxD1[, features]) -> state
      a draft that proposes token trees (tree=): candidates for every node of a static
      TreeShape, the law each was drawn from given its parent's path and earlier siblings
      (specjax.decoding.candidates), and after verification the accepted path (node index per
      depth) from the block's offset start_B. A draft may instead return its tree form from
      `as_tree()` (ModelDraft -> TreeModelDraft).

The loop verifies only each row's first n_B drafts: the corrected or bonus token is drawn from the
target at index n (from p[n] itself when all n were accepted). That keeps the output law exact for
any n decided without looking at the drafted token it would include (see specjax.decoding.stopping).
Every q row must be exactly the distribution its token was drawn from, after the same `sampling`
processing the target gets (`specjax.decoding.sampling.probs`); token ids must lie in [0, V).

How to write a new draft: docs/extending.md (a complete example: specjax/decoding/examples.py).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from flax import struct

from specjax import ops
from specjax.decoding import sampling as sampling_lib


@struct.dataclass
class Proposal:
  """What `Draft.propose` returns.

  tokens_BxG: [B, G] int32    drafted tokens (slots >= n_B are padding)
  q_BxGxV:    [B, G, V] f32   the processed distribution each token was drawn from
  n_B:        [B] int32       proposed tokens per row, 0 <= n <= G
  passes:     [] int32        draft forward passes actually made (data-dependent under stop rules)
  state:      pytree          the draft's new state
  rule_state: pytree          the stop rule's state after the rollout (StopRule.start /
                              after_carry; None where the draft did not roll out token by token)
  """
  tokens_BxG: jax.Array
  q_BxGxV: jax.Array
  n_B: jax.Array
  passes: jax.Array
  state: Any
  rule_state: Any = None


@struct.dataclass
class TreeProposal:
  """What `propose_tree` returns.

  tokens_BxM1: [B, M1] int32   node tokens (node 0 = the root, the last committed token)
  q_BxMxV:     [B, M, V] f32   the law node j + 1 was drawn from (given its parent's path and its
                               earlier siblings)
  passes:      [] int32        draft forward passes made
  state:       pytree          the draft's state
  conf_BxM:    [B, M] f32      (optional) the draft's temperature-1 probability of node j + 1's
                               token at its parent: the confidence a dynamic tree ranks nodes by
                               at temperature 0, where q is one-hot (None: not reported)
  """
  tokens_BxM1: jax.Array
  q_BxMxV: jax.Array
  passes: jax.Array
  state: Any
  conf_BxM: Any = None


@struct.dataclass
class TargetFeatures:
  """The target's side of one verification, for drafts with `reads_target = True`.

  hidden_BxG1xD: [B, G+1, D]  the target's final decoder hidden states of the block it scored,
                              [last committed, d_1 .. d_G] at offsets start_B: hidden[:, i] is
                              the state that produced p_i (position start + i)
  start_B:       [B] int32    the block's offset, i.e. the lengths before this commit
  """
  hidden_BxG1xD: jax.Array
  start_B: jax.Array


def reads_target(draft) -> bool:
  """Whether the loop must hand `draft` the target's cache and features."""
  return bool(getattr(draft, 'reads_target', False))


def feature_kw(draft) -> dict:
  """The keyword a feature pass takes for a draft that reads several target layers
  (`feature_taps`, multi-layer fusion); {} for one that reads only the final hidden states, so
  targets written before taps existed keep working."""
  taps = tuple(getattr(draft, 'feature_taps', ()) or ())
  return {'taps': taps} if taps else {}


def init_draft(draft, input_ids_BxS, max_len: int, target_cache):
  """draft.init, with the target's cache for drafts that read the target."""
  if reads_target(draft):
    return draft.init(input_ids_BxS, max_len, target_cache=target_cache)
  return draft.init(input_ids_BxS, max_len)


def commit_draft(draft, state, seq_BxN, lengths_B, features: TargetFeatures | None):
  """draft.commit, with the verified block's target features for drafts that read the target."""
  if reads_target(draft):
    return draft.commit(state, seq_BxN, lengths_B, features=features)
  return draft.commit(state, seq_BxN, lengths_B)


def resync(draft, state, seq_BxN, lengths_B):
  """draft.resync where the draft has one: its state follows the committed prefix again."""
  fn = getattr(draft, 'resync', None)
  return state if fn is None else fn(state, seq_BxN, lengths_B)


def tree_draft(draft):
  """The draft's tree form: itself when it proposes trees, else `draft.as_tree()`; a one-line
  ValueError for drafts that have none."""
  if hasattr(draft, 'propose_tree'):
    return draft
  if hasattr(draft, 'as_tree'):
    return draft.as_tree()
  raise ValueError(f'tree=: the draft {type(draft).__name__} proposes no trees (a model draft, a '
                   'feature head, or a draft with propose_tree; see docs/extending.md)')


def commit_tree(draft, state, seq_BxN, lengths_B, start_B, path_BxD1,
                features: TargetFeatures | None):
  """draft.commit_tree, with the accepted path's target features for drafts that read them."""
  if reads_target(draft):
    return draft.commit_tree(state, seq_BxN, lengths_B, start_B=start_B, path_BxD1=path_BxD1,
                             features=features)
  return draft.commit_tree(state, seq_BxN, lengths_B, start_B=start_B, path_BxD1=path_BxD1)


def verify_pass(target, draft, cache, block_BxG1, lengths_B):
  """The target's verification pass: (logits, TargetFeatures or None, cache). The hidden states
  come out of the same pass when the draft reads them."""
  if reads_target(draft):
    logits, hidden, cache = target.decode_features(cache, block_BxG1, lengths_B,
                                                   **feature_kw(draft))
    return logits, TargetFeatures(hidden_BxG1xD=hidden, start_B=lengths_B), cache
  logits, cache = target.decode(cache, block_BxG1, lengths_B)
  return logits, None, cache


@struct.dataclass
class StatelessDraft:
  """A base for drafts without per-batch state: `vocab_size` (from the target by
  `from_target`, how a registered name becomes a draft), an empty state, nothing to commit."""
  vocab_size: int = struct.field(pytree_node=False)

  @classmethod
  def from_target(cls, target):
    return cls(vocab_size=target.config.vocab_size)

  def init(self, input_ids_BxS, max_len: int):
    return ()

  def commit(self, state, seq_BxN, lengths_B):
    return state


@runtime_checkable
class Draft(Protocol):
  """The interface every draft implements (see the module docstring for the contract)."""

  @property
  def vocab_size(self) -> int: ...

  def init(self, input_ids_BxS: jax.Array, max_len: int) -> Any: ...

  def propose(self, state: Any, seq_BxN: jax.Array, lengths_B: jax.Array, keys_B: jax.Array,
              gamma: int, sampling: Any, *, stop: Any, limit_B: jax.Array) -> Proposal: ...

  def commit(self, state: Any, seq_BxN: jax.Array, lengths_B: jax.Array) -> Any: ...


# ----------------------------------------------------------------------------- rollout


def views(logits_xV: jax.Array, sampling: Any) -> tuple[jax.Array, jax.Array]:
  """(q, view) from a draft's logits: q = probs(logits, sampling) is what tokens are drawn from;
  `view` is what stop rules judge confidence by -- q itself, except at temperature 0 (q a one-hot
  that says nothing) the softmax at temperature 1."""
  q_xV = sampling_lib.probs(logits_xV, sampling)
  return q_xV, jax.nn.softmax(logits_xV.astype(jnp.float32), -1) if sampling.greedy else q_xV


def rollout(advance: Callable, carry: Any, q_BxV: jax.Array, draw: Callable, *, gamma: int,
            stop: Any, limit_B: jax.Array, view_BxV=None, passes=1,
            advance_passes: int = 1) -> Proposal:
  """Drafts token by token with a per-row stop; exits when every row has stopped.

    q_BxV                      q_0, the processed distribution of draft 0 (the caller computed it
                               with `passes` forward passes); view_BxV its view for the stop rule
                               (default q_BxV; see `views`)
    draw(k, q_BxV) -> x_B      samples draft k from q_k (argmax when greedy)
    advance(carry, x_B, k) -> (carry, q_BxV) or (carry, q_BxV, view_BxV)
                               feeds draft k and returns q_{k+1}; costs `advance_passes` passes

  Row b drafts step k only while k < limit_B[b]; `stop.before(view_k, k)` ends it before x_k is
  drawn (n = k), `stop.after_carry(.., view_k, x_k, k)` (`after` with the rule's state) after x_k
  is kept (n = k + 1). `advance` runs for the whole batch while any row goes on, so a stopped
  row's later slots hold padding (token 0).
  Returns a Proposal whose `state` is the final carry.
  """
  b, v = q_BxV.shape
  limit_B = jnp.clip(limit_B, 0, gamma)

  def step(k, q_BxV, view_BxV, live_B, tokens_BxG, q_BxGxV, n_B, rule_state):
    keep_B = live_B & ~stop.before(view_BxV, k)
    x_B = draw(k, q_BxV)
    tokens_BxG = jax.lax.dynamic_update_index_in_dim(tokens_BxG, jnp.where(keep_B, x_B, 0), k, 1)
    q_BxGxV = jax.lax.dynamic_update_index_in_dim(q_BxGxV, q_BxV, k, 1)
    stop_B, rule_state = stop.after_carry(rule_state, view_BxV, x_B, k)
    go_B = keep_B & ~stop_B & (k + 1 < limit_B)
    return x_B, go_B, tokens_BxG, q_BxGxV, n_B + keep_B.astype(jnp.int32), rule_state

  out = step(0, q_BxV, q_BxV if view_BxV is None else view_BxV, limit_B > 0,
             jnp.zeros((b, gamma), jnp.int32), jnp.zeros((b, gamma, v), jnp.float32),
             jnp.zeros((b,), jnp.int32), stop.start(b, gamma))

  def cond_fn(c):
    k, _, go_B = c[0], c[1], c[2]
    return (k < gamma) & jnp.any(go_B)

  def body_fn(c):
    k, x_B, go_B, tokens_BxG, q_BxGxV, n_B, rule_state, passes, carry = c
    carry, q_BxV, *view = advance(carry, x_B, k - 1)
    out = step(k, q_BxV, view[0] if view else q_BxV, go_B, tokens_BxG, q_BxGxV, n_B, rule_state)
    return (k + 1, *out, passes + advance_passes, carry)

  c = (jnp.int32(1), *out, jnp.int32(passes), carry)
  _, _, _, tokens_BxG, q_BxGxV, n_B, rule_state, passes, carry = jax.lax.while_loop(
      cond_fn, body_fn, c)
  return Proposal(tokens_BxG=tokens_BxG, q_BxGxV=q_BxGxV, n_B=n_B, passes=passes, state=carry,
                  rule_state=rule_state)


def cut(stop: Any, tokens_BxG: jax.Array, q_BxGxV: jax.Array, limit_B: jax.Array,
        view_BxGxV=None) -> jax.Array:
  """n_B for a block drafted all at once: where `rollout` would have stopped each row.

  For drafts whose tokens do not depend on where a row stops (i.i.d. or deterministic drafts), so
  drafting all G slots and cutting afterwards gives the same n as drafting step by step. The rule
  judges view_BxGxV (default q_BxGxV; see `views`). [B] int32.
  """
  gamma = tokens_BxG.shape[1]
  view_BxGxV = q_BxGxV if view_BxGxV is None else view_BxGxV
  live_B = jnp.ones(tokens_BxG.shape[:1], bool)
  n_B = jnp.zeros(tokens_BxG.shape[:1], jnp.int32)
  rule_state = stop.start(tokens_BxG.shape[0], gamma)
  for k in range(gamma):
    q_BxV = view_BxGxV[:, k]
    live_B = live_B & (k < limit_B) & ~stop.before(q_BxV, k)
    n_B = n_B + live_B.astype(jnp.int32)
    stop_B, rule_state = stop.after_carry(rule_state, q_BxV, tokens_BxG[:, k], k)
    live_B = live_B & ~stop_B
  return n_B


def step_noise(noise_BxG: jax.Array, k) -> jax.Array:
  """Step k's own slice of the block's noise: one uniform per row, [B]."""
  return jax.lax.dynamic_index_in_dim(noise_BxG, k, axis=1, keepdims=False)


def noise_draw(keys_B: jax.Array, gamma: int, sampling: Any) -> Callable:
  """A `draw(k, q_BxV)` for `rollout`: the argmax when greedy (no RNG at all), otherwise the
  inverse-CDF draw from q_k (sampling.sample_uniform) with the G steps' uniforms made by one RNG
  call per row; step k reads its own slice (`step_noise`)."""
  if sampling.greedy:
    return lambda k, q_BxV: ops.argmax(q_BxV)
  noise_BxG = jax.vmap(lambda key: jax.random.uniform(key, (gamma,), jnp.float32))(keys_B)
  return lambda k, q_BxV: sampling_lib.sample_uniform(step_noise(noise_BxG, k), q_BxV)


def pad_after(tokens_BxG: jax.Array, n_B: jax.Array) -> jax.Array:
  """Token slots >= n set to 0 (the padding convention of Proposal.tokens_BxG)."""
  return jnp.where(jnp.arange(tokens_BxG.shape[1])[None, :] < n_B[:, None], tokens_BxG, 0)
