"""Exact tree speculative decoding: several candidates per position, one target call per tree.

Shape legend: B batch, S source, N decoder-sequence buffer, D tree depth, D1 = D + 1, M tree nodes
below the root, M1 = M + 1 (with the root), V vocab, Df the target's d_model.

A tree is a static shape (specjax.decoding.shapes: `tree=(3, 2, 1)` gives the root 3 children,
each of them 2, each of those 1; the depth D plays the role of gamma), or a dynamic tree
(`tree='dynamic:8,4,2,1'`: per row the 8 nodes of the drafted template (4, 2, 1) the draft rates
most likely to be accepted; specjax.decoding.dynamic_tree). One iteration per row is
engine.block_step with the form `Tree(shape)` (specjax.decoding.tree_form):
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

import functools

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding import acceptance, engine, stopping
from specjax.decoding.candidates import (CANDIDATES, draw_children, draw_tokens,  # noqa: F401
                                         sibling_laws)
from specjax.decoding.dynamic_tree import DynamicForm
from specjax.decoding.model_draft import TreeModelDraft
from specjax.decoding.options import SpecOptions, check_call
from specjax.decoding.protocol import TreeProposal
from specjax.decoding.shapes import DynamicTree, TreeShape, parse_tree, parse_trees
from specjax.decoding.stats import DecodeOutput, TreeStats
from specjax.decoding.tree_form import Tree, as_tree_draft, decode_tree_features  # noqa: F401
from specjax.programs import typed_jit

verify_tree = acceptance.verify_tree
verify_tree_greedy_batch = acceptance.verify_tree_greedy_batch

__all__ = ['TreeShape', 'DynamicTree', 'form_for', 'parse_tree', 'parse_trees', 'TreeModelDraft', 'TreeProposal',
           'TreeStats', 'TreeState', 'Tree', 'verify_tree', 'verify_tree_greedy_batch',
           'tree_init', 'tree_step', 'tree_program', 'tree_decode', 'CANDIDATES']


def form_for(shape):
  """The block_step form of a tree spec: Tree for a static shape, DynamicForm for a DynamicTree."""
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


@typed_jit(static_argnames=('shape', 'max_new_tokens', 'sampling', 'eos_id',
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
