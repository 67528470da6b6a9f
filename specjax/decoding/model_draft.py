"""A smaller T5 as the draft: chains (ModelDraft) and token trees (TreeModelDraft).

Shape legend: B batch, S source, N decoder-sequence buffer, T cache length, G gamma (draft
block), K nodes of one tree level, D tree depth, D1 = D + 1, M1 tree nodes with the root, V vocab.

Cache invariant at the start of a proposal (both forms): positions 0 .. lengths-2 hold the
committed prefix (after a full acceptance the last draft token and the bonus token were never
fed to the draft). So the first step feeds two tokens [seq[L-1], seq[L]] at offset L-1;
re-feeding a position that is already in the cache rewrites identical keys/values. At L = 0 it
feeds [start, filler] at offset 0 and reads the logits of position 0; the filler's entry is
overwritten by the next step.

Trees. One tree block per level, in the same slot layout as the target's (node j at slot L + j,
position L + depth), fed level by level with decode_tree; leaves are never fed. After acceptance
the path's internal nodes are gathered into chain slots (t5.gather_path). Why not per-branch
caches: they copy the prefix cache once per leaf (memory and bandwidth x leaves, and a gather
back), while the tree block adds only the internal nodes' slots to one cache and reuses the
target's mask code; a level's nodes are one batched call either way.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding import candidates as candidates_lib
from specjax.decoding import protocol
from specjax.decoding import sampling as sampling_lib
from specjax.decoding.protocol import Proposal, TreeProposal
from specjax.decoding.shapes import TreeShape
from specjax.models import t5 as t5_lib
from specjax.models.t5 import DecoderCache, T5Model


def take_at(seq_BxN, pos_B):
  """seq[b, pos[b]] per row, [B]."""
  return jnp.take_along_axis(seq_BxN, pos_B[:, None], axis=1)[:, 0]


def first_logits(model: T5Model, cache: DecoderCache, seq_BxN, lengths_B):
  """The two-token first feed of the cache invariant: (logits [B, V] for the token after seq[L],
  cache)."""
  start_B = jnp.maximum(lengths_B - 1, 0)
  block_Bx2 = jnp.stack([take_at(seq_BxN, start_B), take_at(seq_BxN, start_B + 1)], 1)
  logits_Bx2xV, cache = model.decode(cache, block_Bx2, start_B)
  return jnp.where((lengths_B >= 1)[:, None], logits_Bx2xV[:, 1], logits_Bx2xV[:, 0]), cache


@struct.dataclass
class T5Draft:
  """What both forms of a model draft share: the model, its cache, and `resync`."""
  model: T5Model

  @property
  def vocab_size(self) -> int:
    return self.model.config.vocab_size

  def init(self, input_ids_BxS, max_len: int) -> DecoderCache:
    return self.model.init_cache(input_ids_BxS, max_len)

  def resync(self, cache: DecoderCache, seq_BxN, lengths_B) -> DecoderCache:
    """The whole buffer re-fed teacher-forced in one pass (positions past a row's length are
    masked later): after plain decoding steps the cache lags the committed prefix."""
    del lengths_B
    zeros_B = jnp.zeros((seq_BxN.shape[0],), jnp.int32)
    _, cache = t5_lib.decode_hidden(self.model.params, self.model.config, cache,
                                    seq_BxN[:, :cache.max_len], zeros_B)
    return cache


@struct.dataclass
class ModelDraft(T5Draft):
  """A smaller T5 as the draft: up to gamma autoregressive steps on its own cache.

  The first pass (module docstring) is made even when no row proposes (it keeps the invariant);
  every further pass feeds draft k at offset L+1+k while any row goes on (protocol.rollout). A
  row that stops after n drafts has fed d_1 .. d_{n-1}, which covers every prefix it can commit.

  argmax=True proposes the draft's argmax at every temperature, with q the one-hot of it (the vLLM
  choice): q is deterministic given the prefix, so the output law stays exact, and so does every
  length rule. Stop rules still judge by the draft's processed distribution (`protocol.views`).
  """
  argmax: bool = struct.field(pytree_node=False, default=False)

  def commit(self, cache: DecoderCache, seq_BxN, lengths_B) -> DecoderCache:
    return cache

  def as_tree(self) -> TreeModelDraft:
    if self.argmax:
      raise ValueError('tree=: ModelDraft(argmax=True) has no tree form; pass the T5Model')
    return TreeModelDraft(self.model)

  def propose(self, cache: DecoderCache, seq_BxN, lengths_B, keys_B, gamma: int,
              sampling: sampling_lib.Sampling, *, stop, limit_B) -> Proposal:
    logits_BxV, cache = first_logits(self.model, cache, seq_BxN, lengths_B)

    def advance(carry, x_B, k):
      cache, nan = carry
      logits_Bx1xV, cache = self.model.decode(cache, x_B[:, None], lengths_B + 1 + k)
      return ((cache, nan | jnp.isnan(logits_Bx1xV).any()),
              *protocol.views(logits_Bx1xV[:, 0], sampling))

    draw = protocol.noise_draw(keys_B, gamma, sampling_lib.Sampling() if self.argmax else sampling)
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


@struct.dataclass
class TreeModelDraft(T5Draft):
  """A smaller T5 expanding a token tree level by level (D batched calls per iteration); see the
  module docstring for its cache. `candidates`: 'wor' (default) or 'iid'
  (specjax.decoding.candidates)."""
  candidates: str = struct.field(pytree_node=False, default='wor')

  def propose_tree(self, cache, seq_BxN, lengths_B, keys_B, shape: TreeShape,
                   sampling) -> TreeProposal:
    b = seq_BxN.shape[0]
    logits_BxKxV, cache = first_logits(self.model, cache, seq_BxN, lengths_B)
    logits_BxKxV = logits_BxKxV[:, None]
    depth_M1, anc = shape.depth_of(), shape.ancestors()
    tokens, qs, confs = [take_at(seq_BxN, lengths_B)[:, None]], [], []
    nan = jnp.isnan(logits_BxKxV).any()
    for d, branch in enumerate(shape.branching):
      if d:  # feed level d (its ancestors are in the cache already)
        logits_BxKxV, cache = self.model.decode_tree(cache, tokens[-1], lengths_B, depth_M1, anc,
                                                     shape.level_start[d])
        nan = nan | jnp.isnan(logits_BxKxV).any()
      tok_BxKxb, q_BxKxbxV = candidates_lib.draw_children(
          logits_BxKxV, candidates_lib.level_keys(keys_B, d), branch, sampling, self.candidates)
      tokens.append(tok_BxKxb.reshape(b, shape.level_size[d + 1]))
      qs.append(q_BxKxbxV.reshape(b, shape.level_size[d + 1], -1))
      confs.append(candidates_lib.confidence(logits_BxKxV, tok_BxKxb).reshape(b, -1))
    q_BxMxV = jnp.concatenate(qs, axis=1)
    return TreeProposal(tokens_BxM1=jnp.concatenate(tokens, axis=1),
                        q_BxMxV=jnp.where(nan, jnp.nan, q_BxMxV),
                        passes=jnp.int32(shape.depth), state=cache,
                        conf_BxM=jnp.concatenate(confs, axis=1))

  def commit_tree(self, cache, seq_BxN, lengths_B, *, start_B, path_BxD1):
    """The accepted path's internal nodes into chain slots (leaves were never fed)."""
    del seq_BxN, lengths_B
    return t5_lib.gather_path(cache, start_B, path_BxD1[:, :-1])


def as_draft(draft):
  """A draft implementing specjax.decoding.protocol.Draft: a T5Model becomes a ModelDraft."""
  return ModelDraft(draft) if isinstance(draft, T5Model) else draft
