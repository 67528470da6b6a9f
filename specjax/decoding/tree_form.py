"""The tree form of engine.block_step: how a tree proposal is drafted, scored in one target call,
verified and committed (specjax.decoding.tree has the loop and the entry points).

Shape legend: B batch, D tree depth, D1 = D + 1, M tree nodes below the root, M1 = M + 1 (with the
root), V vocab, Df the target's d_model, W the verdict's width (D here).

A module of its own so that specjax.decoding.dynamic_tree can extend `Tree` while
specjax.decoding.tree dispatches to both forms without an import cycle.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from specjax.decoding import acceptance, protocol
from specjax.decoding.model_draft import as_draft
from specjax.decoding.protocol import TargetFeatures, TreeProposal
from specjax.decoding.shapes import TreeShape
from specjax.decoding.stats import Verdict
from specjax.models import t5 as t5_lib


def as_tree_draft(draft):
  """A tree draft: a T5Model, a ModelDraft, a feature head or anything with `propose_tree`."""
  return protocol.tree_draft(as_draft(draft))


def decode_tree_features(target, cache, tokens_BxM1, lengths_B, depth_M1, anc_M1xM1, draft=None):
  """decode_tree that also returns the nodes' final hidden states [B, M1, Df] (the features a
  head reads, with the layers `draft` taps), in the same one pass."""
  return target.decode_tree_features(cache, tokens_BxM1, lengths_B, depth_M1, anc_M1xM1,
                                     **protocol.feature_kw(draft))


@dataclasses.dataclass(frozen=True)
class Tree:
  """The tree form of a proposal for engine.block_step (hashable: part of the program)."""
  shape: TreeShape

  @property
  def width(self) -> int:
    return self.shape.depth

  @property
  def block_len(self) -> int:
    return self.shape.nodes + 1

  def propose(self, draft, state, st, keys_B, sampling, stop, limit_B, vocab) -> TreeProposal:
    del stop, limit_B, vocab  # a tree is proposed whole
    return draft.propose_tree(state, st.seq, st.lengths, keys_B, self.shape, sampling)

  def score(self, target, draft, cache, prop: TreeProposal, st):
    """The target's pass over the tree block: (logits, hidden or None, cache)."""
    depth_M1, anc = self.shape.depth_of(), self.shape.ancestors()
    if protocol.reads_target(draft):
      return decode_tree_features(target, cache, prop.tokens_BxM1, st.lengths, depth_M1, anc,
                                  draft)
    logits_BxM1xV, cache = target.decode_tree(cache, prop.tokens_BxM1, st.lengths, depth_M1, anc)
    return logits_BxM1xV, None, cache

  def verify(self, verifier, keys_B, prop: TreeProposal, logits_BxM1xV, sampling) -> Verdict:
    path_BxD1, m_B, next_B, beta_BxD = verifier.tree(keys_B, prop.tokens_BxM1, prop.q_BxMxV,
                                                     logits_BxM1xV, self.shape, sampling)
    full_B = jnp.full(m_B.shape, self.shape.depth, jnp.int32)
    return Verdict(n_B=full_B, m_B=m_B, next_B=next_B, beta_BxW=beta_BxD,
                   tokens_BxW=jnp.take_along_axis(prop.tokens_BxM1, path_BxD1[:, 1:], axis=1),
                   path_BxW1=path_BxD1, verified_B=jnp.full(m_B.shape, self.shape.nodes, jnp.int32))

  def flags(self, prop: TreeProposal, vocab: int):
    return (jnp.isnan(prop.q_BxMxV).any(),
            jnp.any(~acceptance.in_range(prop.tokens_BxM1[:, 1:], vocab)))

  def commit(self, draft, state, seq_BxN, lengths_B, start_B, verdict: Verdict, hidden):
    """The draft commits the accepted path: the target's features by block position
    (path_BxW1), the draft's own state by proposal node (node_path_BxW1 where the block holds a
    selection of the proposed nodes, as a dynamic tree's does)."""
    features = None
    if hidden is not None:  # the accepted path's features, as a chain's block would give them
      on_path = jnp.take_along_axis(hidden, verdict.path_BxW1[:, :, None], axis=1)
      features = TargetFeatures(hidden_BxG1xD=on_path, start_B=start_B)
    nodes = verdict.path_BxW1 if verdict.node_path_BxW1 is None else verdict.node_path_BxW1
    return protocol.commit_tree(draft, state, seq_BxN, lengths_B, start_B, nodes, features)

  def settle(self, cache, start_B, verdict: Verdict):
    return t5_lib.gather_path(cache, start_B, verdict.path_BxW1)
