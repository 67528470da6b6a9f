"""n-gram drafts: the paper's unigram and bigram approximation models (Section 3, Table 3).

Shape legend: B batch, S source, N decoder-sequence buffer, G gamma (draft block), V vocab,
K successors kept per token.

  UnigramDraft   context-independent q (fit_unigram), no forward passes
  BigramDraft    q(x | previous token), top-K rows + unigram backoff (fit_bigram), through
                 protocol.rollout, no forward passes
Fitted drafts are cached as .npz with save_ngram / load_ngram.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.decoding import protocol
from specjax.decoding import sampling as sampling_lib
from specjax.decoding.protocol import Proposal


def _take_rows(seq_BxN, pos_B):
  return jnp.take_along_axis(seq_BxN, pos_B[:, None], axis=1)[:, 0]


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
    draw = protocol.noise_draw(keys_B, gamma, sampling)
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
