"""Draft strategies, each implementing the protocol of specjax.decoding.protocol.

Shape legend: B batch, S source, N decoder-sequence buffer, G gamma (draft block), V vocab.

Every draft has `vocab_size`, `init`, `propose(..., *, stop, limit_B) -> Proposal` (up to gamma
tokens per row, n_B of them proposed, the q they were drawn from, the draft passes made) and
`commit` (see the protocol module for the contract). The speculative loop never looks inside the
state, so drafts with no model (n-gram, prompt lookup) fit the same slot.

Drafts here:
  ModelDraft          a smaller T5; token by token through protocol.rollout (one pass per step)
  UnigramDraft        context-independent q (fit_unigram), no forward passes
  BigramDraft         q(x | previous token), top-K rows + unigram backoff (fit_bigram), through
                      protocol.rollout, no forward passes
  PromptLookupDraft   copies the continuation of the latest n-gram match in the source or the
                      generated prefix; q one-hot on the proposal, no forward passes
Fitted n-gram drafts are cached as .npz with save_ngram / load_ngram. Every draft honours the stop
rule's `before` / `after` hooks and the per-row cap limit_B.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.decoding import protocol
from specjax.decoding import sampling as sampling_lib
from specjax.decoding.protocol import Proposal
from specjax.models.t5 import DecoderCache, T5Model


def _take_rows(seq_BxN, pos_B):
  return jnp.take_along_axis(seq_BxN, pos_B[:, None], axis=1)[:, 0]


@struct.dataclass
class ModelDraft:
  """A smaller T5 as the draft: up to gamma autoregressive steps on its own cache.

  Cache invariant at the start of a proposal: positions 0 .. lengths-2 hold the committed prefix
  (after a full acceptance the last draft token and the bonus token were never fed to the draft).
  So the first step feeds two tokens [seq[L-1], seq[L]] at offset L-1; re-feeding a position that
  is already in the cache rewrites identical keys/values. At L = 0 it feeds [start, filler] at
  offset 0 and reads the logits of position 0; the filler's entry is overwritten by the next step.
  That first pass is made even when no row proposes (it keeps the invariant); every further pass
  feeds draft k at offset L+1+k while any row goes on (protocol.rollout). A row that stops after n
  drafts has fed d_1 .. d_{n-1}, which covers every prefix it can commit.

  argmax=True proposes the draft's argmax at every temperature, with q the one-hot of it (the vLLM
  choice): q is deterministic given the prefix, so the output law stays exact, and so does every
  length rule. Stop rules still judge by the draft's processed distribution (`protocol.views`).
  """
  model: T5Model
  argmax: bool = struct.field(pytree_node=False, default=False)

  @property
  def vocab_size(self) -> int:
    return self.model.config.vocab_size

  def init(self, input_ids_BxS, max_len: int) -> DecoderCache:
    return self.model.init_cache(input_ids_BxS, max_len)

  def commit(self, cache: DecoderCache, seq_BxN, lengths_B) -> DecoderCache:
    return cache

  def step_noise(self, gumbel_BxGxV, i):
    """Step i's own Gumbel noise. (A method so that a test can inject the reused-noise fault.)"""
    return protocol.step_noise(gumbel_BxGxV, i)

  def propose(self, cache: DecoderCache, seq_BxN, lengths_B, keys_B, gamma: int,
              sampling: sampling_lib.Sampling, *, stop, limit_B) -> Proposal:
    start_B = jnp.maximum(lengths_B - 1, 0)
    block_Bx2 = jnp.stack([_take_rows(seq_BxN, start_B), _take_rows(seq_BxN, start_B + 1)], 1)
    logits_Bx2xV, cache = self.model.decode(cache, block_Bx2, start_B)
    logits_BxV = jnp.where((lengths_B >= 1)[:, None], logits_Bx2xV[:, 1], logits_Bx2xV[:, 0])

    def advance(carry, x_B, k):
      cache, nan = carry
      logits_Bx1xV, cache = self.model.decode(cache, x_B[:, None], lengths_B + 1 + k)
      return ((cache, nan | jnp.isnan(logits_Bx1xV).any()),
              *protocol.views(logits_Bx1xV[:, 0], sampling))

    draw = protocol.gumbel_draw(keys_B, gamma, self.vocab_size,
                                sampling_lib.Sampling() if self.argmax else sampling,
                                self.step_noise)  # a greedy Sampling draws the argmax
    q_BxV, view_BxV = protocol.views(logits_BxV, sampling)
    prop = protocol.rollout(advance, (cache, jnp.isnan(logits_BxV).any()), q_BxV, draw,
                            gamma=gamma, stop=stop, limit_B=limit_B, view_BxV=view_BxV)
    cache, nan = prop.state
    if self.argmax:  # the law each token was drawn from: a point mass on it
      prop = prop.replace(q_BxGxV=jax.nn.one_hot(prop.tokens_BxG, self.vocab_size,
                                                 dtype=jnp.float32))
    # A NaN in the draft poisons q (in greedy mode q is a one-hot even of NaN logits); the loop
    # checks q for NaN and stops with a clear error.
    return prop.replace(q_BxGxV=jnp.where(nan, jnp.nan, prop.q_BxGxV), state=cache)


# ----------------------------------------------------------------------------- n-gram drafts
#
# Drafts without a model (paper §3, Table 3: "unigram" and "bigram" approximation models with
# c ~ 0). They are exact under sampling for the same reason a model draft is: `propose` returns,
# at each position, exactly the distribution the token was drawn from (after the same `sampling`
# processing the target gets), so acceptance.verify sees the true q.
#
# Fitting data are *target* sequences as the decoder emits them: [start] + ids + [EOS]. The
# helpers take lists of token ids (or a 2-D padded array): trailing `pad_id` tokens are stripped and
# `eos_id` is appended to a sequence that does not already end with it; the bigram additionally
# prepends the decoder start token, so its row `start_id` is the distribution of first tokens.

NGRAM_FORMAT_VERSION = 1


def _target_sequences(token_id_lists, vocab_size: int, eos_id, pad_id) -> list[np.ndarray]:
  """Normalised int64 sequences: trailing pad stripped, EOS appended; ids checked in [0, V)."""
  if isinstance(token_id_lists, np.ndarray) and token_id_lists.ndim == 1:
    token_id_lists = [token_id_lists]
  token_id_lists = list(token_id_lists)
  if token_id_lists and np.ndim(token_id_lists[0]) == 0:
    raise ValueError('expected a list of token-id sequences (or a 2-D array), got a flat list of '
                     'ids: wrap a single sequence as [ids]')
  out = []
  for ids in token_id_lists:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if pad_id is not None:
      keep = np.nonzero(ids != pad_id)[0]
      ids = ids[:keep[-1] + 1] if keep.size else ids[:0]
    if eos_id is not None and (ids.size == 0 or ids[-1] != eos_id):
      ids = np.append(ids, eos_id)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
      raise ValueError(f'token ids out of range [0, {vocab_size}): '
                       f'min {ids.min()}, max {ids.max()}')
    out.append(ids)
  return out


def _smoothed_unigram(seqs, vocab_size: int, smoothing: float) -> np.ndarray:
  if smoothing < 0:
    raise ValueError(f'smoothing must be >= 0, got {smoothing}')
  counts = np.zeros((vocab_size,), np.float64)
  for ids in seqs:
    counts += np.bincount(ids, minlength=vocab_size)
  total = counts.sum() + smoothing * vocab_size
  if total <= 0:
    raise ValueError('fit_unigram: no tokens and smoothing == 0 (q would be undefined)')
  return (counts + smoothing) / total


@struct.dataclass
class UnigramDraft:
  """Context-independent draft q(x) = softmax(log_probs_V) (paper Table 3, "unigram").

  q does not depend on the prefix, so the gamma drafts of a block are i.i.d. from
  probs(log_probs_V, sampling) (temperature / top-k / top-p exactly as for the target;
  temperature 0 -> the argmax, repeated), drawn at once and cut where the stop rule ends each row
  (protocol.cut). No forward passes. The state is empty. Memory: 4 V bytes.
  """
  log_probs_V: jax.Array

  @property
  def vocab_size(self) -> int:
    return self.log_probs_V.shape[-1]

  def init(self, input_ids_BxS, max_len: int):
    return ()

  def commit(self, state, seq_BxN, lengths_B):
    return state

  def propose(self, state, seq_BxN, lengths_B, keys_B, gamma: int,
              sampling: sampling_lib.Sampling, *, stop, limit_B) -> Proposal:
    b, vocab = seq_BxN.shape[0], self.vocab_size
    q_V = sampling_lib.probs(self.log_probs_V, sampling)
    if sampling.greedy:
      draft_BxG = jnp.full((b, gamma), jnp.argmax(q_V), jnp.int32)
    else:
      q_GxV = jnp.broadcast_to(q_V, (gamma, vocab))
      draft_BxG = jax.vmap(lambda k: sampling_lib.sample(k, q_GxV))(keys_B)
    q_BxGxV = jnp.broadcast_to(q_V, (b, gamma, vocab))
    _, view_V = protocol.views(self.log_probs_V, sampling)
    n_B = protocol.cut(stop, draft_BxG, q_BxGxV, limit_B,
                       jnp.broadcast_to(view_V, (b, gamma, vocab)))
    return Proposal(protocol.pad_after(draft_BxG, n_B), q_BxGxV, n_B, jnp.int32(0), state)

  def save(self, path) -> None:
    save_ngram(self, path)


@struct.dataclass
class BigramDraft:
  """q(x | a), a = the previous token, stored sparsely (exact, bounded memory).

    q(. | a) = sum_k weights_VxK[a, k] * onehot(ids_VxK[a, k]) + backoff_V[a] * unigram_V

  i.e. the top-K successors of `a` carry their own (discounted) mass and the rest of the row is a
  backed-off unigram, with backoff_V[a] = 1 - sum_k weights_VxK[a, k]: a proper distribution over
  the whole vocabulary (full support when the unigram has it). The dense row is built per step for
  the B rows only ([B, V]), never for the whole table.

  Memory: ids int32 [V, K] + weights float32 [V, K] + backoff [V] + unigram [V]
  = V * (8 K + 8) bytes: 8.48 MB for V = 32128, K = 32 (a dense V x V float32 table is 4.13 GB).

  Rollout: step 1 conditions on the last committed token seq[b, lengths[b]] (the decoder start at
  L = 0, matching the fitting data), step i > 1 on draft token i-1; each step's q is
  probs(log q(. | prev), sampling) and the token is sampled from exactly that (argmax when greedy).
  Token by token through protocol.rollout (a row can stop early); no forward passes.
  """
  ids_VxK: jax.Array
  weights_VxK: jax.Array
  backoff_V: jax.Array
  unigram_V: jax.Array

  @property
  def vocab_size(self) -> int:
    return self.unigram_V.shape[-1]

  @property
  def top_k(self) -> int:
    return self.ids_VxK.shape[-1]

  @property
  def nbytes(self) -> int:
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(self))

  def init(self, input_ids_BxS, max_len: int):
    return ()

  def commit(self, state, seq_BxN, lengths_B):
    return state

  def conditional(self, prev_B) -> jax.Array:
    """Dense q(. | prev) [B, V] float32 (unprocessed) for a batch of previous tokens."""
    prev_B = jnp.asarray(prev_B, jnp.int32)
    q_BxV = self.backoff_V[prev_B][:, None] * self.unigram_V[None, :]
    rows_Bx1 = jnp.arange(prev_B.shape[0])[:, None]
    return q_BxV.at[rows_Bx1, self.ids_VxK[prev_B]].add(self.weights_VxK[prev_B])

  def propose(self, state, seq_BxN, lengths_B, keys_B, gamma: int,
              sampling: sampling_lib.Sampling, *, stop, limit_B) -> Proposal:
    views = lambda prev_B: protocol.views(jnp.log(self.conditional(prev_B)), sampling)  # noqa: E731
    advance = lambda carry, x_B, k: (carry, *views(x_B))  # noqa: E731
    draw = protocol.gumbel_draw(keys_B, gamma, self.vocab_size, sampling)
    q_BxV, view_BxV = views(_take_rows(seq_BxN, lengths_B))
    return protocol.rollout(advance, state, q_BxV, draw, gamma=gamma, stop=stop, limit_B=limit_B,
                            view_BxV=view_BxV, passes=0, advance_passes=0)

  def save(self, path) -> None:
    save_ngram(self, path)


def fit_unigram(token_id_lists, vocab_size: int, smoothing: float = 1.0, *, eos_id: int = 1,
                pad_id: int | None = 0) -> UnigramDraft:
  """Unigram LM of the target tokens with add-`smoothing` (add-k) smoothing.

  q(x) = (count(x) + k) / (total + k V): every token gets mass > 0 when k > 0 (so every target
  token can be drafted); k = 0 is the maximum-likelihood unigram (still exact, tokens never seen
  are just never proposed). Counts include one EOS per sequence (see _target_sequences).
  """
  seqs = _target_sequences(token_id_lists, vocab_size, eos_id, pad_id)
  probs_V = _smoothed_unigram(seqs, vocab_size, smoothing)
  with np.errstate(divide='ignore'):
    return UnigramDraft(log_probs_V=jnp.asarray(np.log(probs_V), jnp.float32))


def fit_bigram(token_id_lists, vocab_size: int, smoothing: float = 1.0, *, top_k: int = 32,
               unigram_smoothing: float = 1.0, start_id: int = 0, eos_id: int = 1,
               pad_id: int | None = 0) -> BigramDraft:
  """Bigram LM with interpolated backoff to the add-k unigram, top-K successors per row.

  With c(a, x) the bigram counts of [start] + ids + [EOS], N_a = sum_x c(a, x), u the add-
  `unigram_smoothing` unigram (fit_unigram) and beta = `smoothing` (the prior strength):

    q(x | a) = c_K(a, x) / (N_a + beta) + (N_a - C_a + beta) / (N_a + beta) * u(x)

  where c_K keeps the `top_k` largest counts of row a (ties: lower id first) and C_a is their sum.
  When a row has <= top_k distinct successors this is exactly the Dirichlet-smoothed bigram
  (c(a, x) + beta u(x)) / (N_a + beta); the counts beyond the top K go to the backoff mass, so each
  row still sums to 1. Rows never seen (N_a = 0) are the unigram. Needs beta > 0 or every row seen.
  """
  if smoothing < 0:
    raise ValueError(f'smoothing must be >= 0, got {smoothing}')
  if top_k < 1:
    raise ValueError(f'top_k must be >= 1, got {top_k}')
  if not 0 <= start_id < vocab_size:
    raise ValueError(f'start_id {start_id} out of range [0, {vocab_size})')
  v = int(vocab_size)
  seqs = _target_sequences(token_id_lists, v, eos_id, pad_id)
  unigram_V = _smoothed_unigram(seqs, v, unigram_smoothing)
  empty = np.zeros((0,), np.int64)
  prev = np.concatenate([np.concatenate([[start_id], s[:-1]]) for s in seqs] + [empty])
  nxt = np.concatenate(seqs + [empty])
  pairs, counts = np.unique(prev.astype(np.int64) * v + nxt, return_counts=True)
  a, x = pairs // v, pairs % v
  n_a = np.bincount(a, weights=counts, minlength=v)
  order = np.lexsort((x, -counts, a))  # by row, then count descending, then id ascending
  a, x, counts = a[order], x[order], counts[order]
  rank = np.arange(a.size) - np.searchsorted(a, a, side='left')
  keep = rank < top_k
  ids_VxK = np.zeros((v, top_k), np.int32)
  kept_VxK = np.zeros((v, top_k), np.float64)
  ids_VxK[a[keep], rank[keep]] = x[keep]
  kept_VxK[a[keep], rank[keep]] = counts[keep]
  denom_V = n_a + smoothing
  if np.any(denom_V <= 0):
    raise ValueError('fit_bigram: smoothing == 0 leaves unseen rows undefined; use smoothing > 0')
  weights_VxK = kept_VxK / denom_V[:, None]
  backoff_V = (n_a - kept_VxK.sum(1) + smoothing) / denom_V
  return BigramDraft(ids_VxK=jnp.asarray(ids_VxK),
                     weights_VxK=jnp.asarray(weights_VxK, jnp.float32),
                     backoff_V=jnp.asarray(backoff_V, jnp.float32),
                     unigram_V=jnp.asarray(unigram_V, jnp.float32))


def save_ngram(draft, path) -> None:
  """Writes a fitted UnigramDraft / BigramDraft to an .npz file (load with load_ngram)."""
  if isinstance(draft, UnigramDraft):
    arrays = {'log_probs_V': draft.log_probs_V}
  elif isinstance(draft, BigramDraft):
    arrays = {'ids_VxK': draft.ids_VxK, 'weights_VxK': draft.weights_VxK,
              'backoff_V': draft.backoff_V, 'unigram_V': draft.unigram_V}
  else:
    raise TypeError(f'save_ngram: expected UnigramDraft or BigramDraft, got {type(draft).__name__}')
  with open(path, 'wb') as f:  # an open file keeps numpy from appending '.npz' to the name
    np.savez(f, kind=np.asarray(type(draft).__name__), version=np.asarray(NGRAM_FORMAT_VERSION),
             **{k: np.asarray(v) for k, v in arrays.items()})


def load_ngram(path):
  """Reads a draft written by save_ngram (UnigramDraft or BigramDraft)."""
  with np.load(path, allow_pickle=False) as f:
    kind, version = str(f['kind']), int(f['version'])
    if version != NGRAM_FORMAT_VERSION:
      raise ValueError(f'{path}: n-gram draft format version {version}, '
                       f'expected {NGRAM_FORMAT_VERSION}')
    cls = {'UnigramDraft': UnigramDraft, 'BigramDraft': BigramDraft}.get(kind)
    if cls is None:
      raise ValueError(f'{path}: unknown draft kind {kind!r}')
    fields = {k: jnp.asarray(f[k]) for k in f.files if k not in ('kind', 'version')}
  return cls(**fields)


# ----------------------------------------------------------------------------- prompt lookup


@struct.dataclass
class PromptLookupState:
  """source_BxS: the prompt ids; source_len_B: tokens up to the last non-pad one."""
  source_BxS: jax.Array
  source_len_B: jax.Array


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
