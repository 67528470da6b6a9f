"""Exact tree speculative decoding: several candidates per position, one target call per tree.

Shape legend: B batch, S source, N decoder-sequence buffer, D tree depth, D1 = D + 1, M tree nodes
below the root, M1 = M + 1 (with the root), V vocab, Df the target's d_model.

A tree is a static shape (specjax.decoding.shapes: `tree=(3, 2, 1)` gives the root 3 children,
each of them 2, each of those 1; the depth D plays the role of gamma), or a dynamic tree
(`tree='dynamic:8,4,2,1'`: per row the 8 nodes of the drafted template (4, 2, 1) the draft rates
most likely to be accepted; specjax.decoding.dynamic_tree). One iteration per row is
engine.block_step with the form `Tree(shape)`:
  1. draft: the draft's tree form (`propose_tree`) gives every internal node its children and the
     law each was drawn from (specjax.decoding.candidates: without replacement by default);
  2. target: ONE call over the whole tree block (T5Model.decode_tree: each node sees the committed
     prefix and its ancestors; positions by depth), giving p at every node;
  3. verification: recursive rejection sampling from the root down (acceptance.verify_tree; the
     verifier's tree form), or the longest argmax-matching path at temperature 0;
  4. commit: the accepted path (m <= D tokens) and the emitted token; both caches move the path's
     keys/values into chain slots (t5.gather_path), so the next iteration sees an ordinary prefix.

Drafts with trees: a model draft (TreeModelDraft, one batched call per level) and the feature
head (it expands its own top candidates level by level from its own predicted features; the
target's hidden states of the accepted path are handed back as after a chain).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding import acceptance, engine, protocol, stopping
from specjax.decoding.candidates import (CANDIDATES, draw_children, draw_tokens,  # noqa: F401
                                         sibling_laws)
from specjax.decoding.model_draft import TreeModelDraft, as_draft
from specjax.decoding.options import SpecOptions, check_call
from specjax.decoding.protocol import TargetFeatures, TreeProposal
from specjax.decoding.shapes import DynamicTree, TreeShape, parse_tree, parse_trees
from specjax.decoding.stats import DecodeOutput, TreeStats, Verdict
from specjax.models import t5 as t5_lib

verify_tree = acceptance.verify_tree
verify_tree_greedy_batch = acceptance.verify_tree_greedy_batch

__all__ = ['TreeShape', 'DynamicTree', 'form_for', 'parse_tree', 'parse_trees', 'TreeModelDraft', 'TreeProposal',
           'TreeStats', 'TreeState', 'Tree', 'verify_tree', 'verify_tree_greedy_batch',
           'tree_init', 'tree_step', 'tree_program', 'tree_decode', 'CANDIDATES']


def as_tree_draft(draft):
  """A tree draft: a T5Model, a ModelDraft, a feature head or anything with `propose_tree`."""
  return protocol.tree_draft(as_draft(draft))


def decode_tree_features(target, cache, tokens_BxM1, lengths_B, depth_M1, anc_M1xM1):
  """decode_tree that also returns the nodes' final hidden states [B, M1, Df] (the features a
  head reads), in the same one pass."""
  return target.decode_tree_features(cache, tokens_BxM1, lengths_B, depth_M1, anc_M1xM1)


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
      return decode_tree_features(target, cache, prop.tokens_BxM1, st.lengths, depth_M1, anc)
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


def form_for(shape):
  """The block_step form of a tree spec: Tree for a static shape, DynamicForm for a DynamicTree."""
  # Imported here: dynamic_tree's form extends Tree (it shares flags, commit and settle).
  from specjax.decoding.dynamic_tree import DynamicForm  # pylint: disable=import-outside-toplevel
  return DynamicForm(shape) if isinstance(shape, DynamicTree) else Tree(shape)


@struct.dataclass
class TreeState(engine.LoopState):
  """Loop state of tree decoding: engine.LoopState's fields, stats a TreeStats; the caches hold
  max_new + M1 slots, seq 1 + max_new + D + 1 tokens."""


def tree_init(target, draft, input_ids_BxS, rng, *, shape: TreeShape | DynamicTree,
              max_new_tokens: int) -> TreeState:
  return engine.init_state(target, as_tree_draft(draft), input_ids_BxS, rng, form=form_for(shape),
                           max_new_tokens=max_new_tokens, stats_cls=TreeStats, cls=TreeState)


def tree_step(target, draft, state: TreeState, *, shape: TreeShape | DynamicTree,
              max_new_tokens: int, sampling, eos_id: int, verifier='token') -> TreeState:
  """One iteration for every unfinished row: expand, score the tree in one call, verify, commit.
  `verifier`: a name or an acceptance.Verifier with a tree form."""
  new, _ = engine.block_step(target, as_tree_draft(draft), form_for(shape), state, state.keys(),
                             sampling=sampling, verifier=acceptance.verifier_for(verifier),
                             stop=stopping.Fixed(), eos_id=eos_id, max_new_tokens=max_new_tokens)
  return new


@functools.partial(jax.jit, static_argnames=('shape', 'max_new_tokens', 'sampling', 'eos_id',
                                             'verifier'))
def tree_program(target, draft, input_ids_BxS, rng, *, shape, max_new_tokens, sampling, eos_id,
                 verifier='token'):
  """The whole tree loop as one jitted program (unchecked; tree_decode validates)."""
  state = tree_init(target, draft, input_ids_BxS, rng, shape=shape, max_new_tokens=max_new_tokens)
  step = functools.partial(tree_step, target, draft, shape=shape, max_new_tokens=max_new_tokens,
                           sampling=sampling, eos_id=eos_id, verifier=verifier)
  state = engine.run_loop(state, step)
  return DecodeOutput(tokens=engine.finish_tokens(state.seq, state.lengths, max_new_tokens,
                                                  target.config.pad_token_id),
                      lengths=state.lengths, stats=state.stats)


def tree_decode(target, draft, input_ids, *, tree, max_new_tokens: int, temperature: float = 0.0,
                top_k: int = 0, top_p: float = 1.0, rng=None, eos_id: int | None = None,
                verifier='token') -> DecodeOutput:
  """Exact tree speculative decoding: `speculative_decode(..., tree=...)`, validated. stats is a
  TreeStats."""
  opts = SpecOptions.from_kwargs(tree=tree, max_new_tokens=max_new_tokens,
                                 temperature=temperature, top_k=top_k, top_p=top_p,
                                 eos_id=eos_id, verifier=verifier)
  return run(target, check_call(target, draft, input_ids, opts), input_ids, opts, rng)


def run(target, draft, input_ids, opts: SpecOptions, rng) -> DecodeOutput:
  """The tree loop for validated options (loop.speculative_decode dispatches here)."""
  draft = as_tree_draft(draft)
  out = tree_program(target, draft, jnp.asarray(input_ids, jnp.int32), engine.as_key(rng),
                     shape=opts.tree, max_new_tokens=opts.max_new_tokens, sampling=opts.sampling,
                     eos_id=opts.eos_for(target), verifier=opts.verifier)
  return engine.checked(out, 'speculative_decode(tree=...)', draft, target.config.vocab_size)
