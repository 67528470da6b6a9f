"""Dynamic token trees: per row and iteration, the verify budget goes to the nodes of a drafted
template that the draft rates most likely to be accepted (EAGLE-2's idea, made exact).

Shape legend: B batch, D depth, D1 = D + 1, Mt template nodes below the root, Mt1 = Mt + 1,
M the budget (nodes the target verifies), M1 = M + 1, V vocab, Df the target's d_model.

`DynamicTree(budget, template)` (shapes.py; spelled 'dynamic:8,4,2,1'):
  1. draft    the draft expands the whole template (propose_tree, unchanged: its cost is the
              template's, one batched pass per level);
  2. select   every template node gets an inclusion score from what was known BEFORE its token
              was drawn (below); per row the M best nodes are kept (a stable sort: ties go to
              the lower index, i.e. to parents and earlier siblings);
  3. score    ONE target pass over the M1 chosen nodes, a compiled block of fixed size whose tree
              (depths, ancestor mask) is per row (t5.decode_tree takes [B, M1] / [B, M1, M1]);
  4. verify   recursive rejection sampling over the template with the nodes that were not chosen
              masked out (token -1, q = 0: acceptance.verify_tree skips such a child without
              touching the residual), the target's logits scattered back to template positions;
  5. commit   the accepted path: block positions for the target's cache (t5.gather_path) and the
              features a head reads, template positions for the draft's own state.

The inclusion score ('mass'). For node j, the i-th child of parent pi in draw order:
    I(j) = P(pi) * R_i(j),   P(pi) = prod of q(x) along pi's path (P(root) = 1),
    R_i = the mass of pi's q left before child i was drawn (R_1 = 1, R_{i+1} = R_i - q(x_i)),
q the draft's law at the parent (at temperature > 0 the processed q its children were drawn from;
at temperature 0 its softmax at temperature 1, `TreeProposal.conf_BxM`). I(j) uses x_j's
ancestors and earlier siblings, never x_j. Why that keeps the output law exact (the
non-anticipation rule, specjax.decoding.stopping, applied per node): I(child) <= I(parent) since
q(x_pi) <= R(pi), and I falls along siblings, so the chosen set is closed under parents and
earlier siblings; the nodes that can rank above j are neither j's descendants nor its later
siblings (their scores are <= I(j) and their indices higher), and every other node's token is
drawn independently of x_j given j's parent path and earlier siblings. So whether j is verified
is decided without looking at x_j: given inclusion x_j is still distributed as its reported q_j,
and recursive rejection sampling (which allows a node any number of children fixed that way, as a
chain allows any stop rule) emits exactly the target's law.

The 'reach=LAMBDA' score (reach_scores) estimates each node's chance of being tested, taking an
already drawn node k as accepted with h_k = q(x_k)^LAMBDA: reach(child 1 of pi) = reach(pi) h(pi),
each later sibling times (1 - h) of the one before. It reads the same tokens as 'mass' and falls
the same ways, so the same argument makes it exact. 'mass' (LAMBDA = 1 in effect) ranks a deep node
of a confident chain below a root sibling too early for a well-aligned draft; a small LAMBDA keeps
the chain deeper (bench_tree measures both, docs/performance.md). 'path' ranks by P(j) itself, EAGLE-2's
rerank, which reads x_j's own probability: biased at temperature > 0 (tests/test_dynamic_tree.py
shows it with the law test); at temperature 0 every selection is exact (the draft is a
deterministic function of the prefix).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding import acceptance, protocol
from specjax.decoding import sampling as sampling_lib
from specjax.decoding.protocol import TreeProposal
from specjax.decoding.shapes import DynamicTree, TreeShape
from specjax.decoding.stats import Verdict
from specjax.decoding.tree_form import Tree


@struct.dataclass
class ChosenTree(TreeProposal):
  """A template proposal with each row's chosen nodes.

  sel_BxM1: [B, M1] int32  template index of every block position (0 the root, ascending: a
                           parent precedes its children)
  """
  sel_BxM1: jax.Array = None


def own_and_left(tokens_BxMt1, q_BxMtxV, conf_BxMt, template: TreeShape, greedy: bool):
  """Per template node j > 0: (q(x_j) at its parent, R: the parent's mass left before x_j was
  drawn), [B, Mt] each (module docstring). At temperature 0 from the draft's confidences (1 when
  the draft reports none); else from the reported laws q_j (q_j(x_j) = q(x_j) / R_j)."""
  b = tokens_BxMt1.shape[0]
  if greedy:
    q_BxMt = (jnp.ones(tokens_BxMt1[:, 1:].shape, jnp.float32) if conf_BxMt is None
              else conf_BxMt.astype(jnp.float32))
  else:
    x_BxMt = jnp.clip(tokens_BxMt1[:, 1:], 0, q_BxMtxV.shape[-1] - 1)
    q_BxMt = jnp.take_along_axis(q_BxMtxV.astype(jnp.float32), x_BxMt[..., None], axis=2)[..., 0]
  owns, lefts = [], []
  for d, br in enumerate(template.branching):
    lo, hi = template.level_start[d + 1] - 1, template.level_start[d + 2] - 1
    q_BxKxb = q_BxMt[:, lo:hi].reshape(b, -1, br)
    if greedy:  # q_BxKxb holds q(x) itself (own <= left keeps the choice closed, whatever
      # the draft reports)
      left_BxKxb = jnp.maximum(1.0 - (jnp.cumsum(q_BxKxb, axis=2) - q_BxKxb), 0.0)
      own_BxKxb = jnp.minimum(q_BxKxb, left_BxKxb)
    else:  # q_BxKxb holds q_i(x_i) = q(x_i) / R_i, and R_{i+1} = R_i (1 - q_i(x_i))
      shifted = jnp.concatenate([jnp.ones_like(q_BxKxb[:, :, :1]), 1.0 - q_BxKxb[:, :, :-1]], 2)
      left_BxKxb = jnp.cumprod(jnp.maximum(shifted, 0.0), axis=2)
      own_BxKxb = q_BxKxb * left_BxKxb
    owns.append(own_BxKxb.reshape(b, -1))
    lefts.append(left_BxKxb.reshape(b, -1))
  return jnp.concatenate(owns, axis=1), jnp.concatenate(lefts, axis=1)


def reach_scores(own_BxMt, template: TreeShape, power: float):
  """[B, Mt] 'reach': each node's estimated chance of being tested by recursive rejection
  sampling, an ancestor or earlier sibling k taken to be accepted with h_k = q(x_k)^power:
      reach(j) = reach(pi) h(pi) prod over j's earlier siblings k of (1 - h(x_k)).
  Exact like 'mass' (module docstring): reach(j) reads x_j's ancestors and earlier siblings only,
  and falls from parent to child (h <= 1) and along siblings, so the chosen set stays closed."""
  b = own_BxMt.shape[0]
  h_BxMt = jnp.clip(own_BxMt, 0.0, 1.0) ** power
  parent_Mt = template.parent()[1:]
  tested = [jnp.ones((b, 1), jnp.float32)]  # reach(j) h(j) per node, root first
  out = []
  for d, br in enumerate(template.branching):
    lo, hi = template.level_start[d + 1] - 1, template.level_start[d + 2] - 1
    h_BxKxb = h_BxMt[:, lo:hi].reshape(b, -1, br)
    missed = jnp.concatenate([jnp.ones_like(h_BxKxb[:, :, :1]), 1.0 - h_BxKxb[:, :, :-1]], 2)
    siblings_BxK = jnp.cumprod(missed, axis=2).reshape(b, -1)
    reach_BxK = jnp.concatenate(tested, axis=1)[:, parent_Mt[lo:hi]] * siblings_BxK
    out.append(reach_BxK)
    tested.append(reach_BxK * h_BxMt[:, lo:hi])
  return jnp.concatenate(out, axis=1)


def inclusion_scores(tokens_BxMt1, q_BxMtxV, conf_BxMt, template: TreeShape, greedy: bool,
                     score: str = 'mass', power: float = 1.0):
  """[B, Mt] each template node's score: 'mass' I(j) = P(parent) R(j) and 'reach' (exact),
  'path' P(j)."""
  own_BxMt, left_BxMt = own_and_left(tokens_BxMt1, q_BxMtxV, conf_BxMt, template, greedy)
  if score == 'reach':
    return reach_scores(own_BxMt, template, power)
  parent_Mt = template.parent()[1:]
  path = [jnp.ones(tokens_BxMt1[:, :1].shape, jnp.float32)]  # P per node, root first
  for d in range(template.depth):
    lo, hi = template.level_start[d + 1], template.level_start[d + 2]
    p_parent_BxK = jnp.concatenate(path, axis=1)[:, parent_Mt[lo - 1:hi - 1]]
    path.append(p_parent_BxK * own_BxMt[:, lo - 1:hi - 1])
  p_BxMt1 = jnp.concatenate(path, axis=1)
  if score == 'path':
    return p_BxMt1[:, 1:]
  return p_BxMt1[:, parent_Mt] * left_BxMt


def choose(scores_BxMt, budget: int):
  """[B, M1] the root and each row's `budget` best nodes (template indices, ascending)."""
  order_BxMt = jnp.argsort(-scores_BxMt, axis=1, stable=True)
  best_BxM = jnp.sort(order_BxMt[:, :budget], axis=1) + 1
  return jnp.concatenate([jnp.zeros_like(best_BxM[:, :1]), best_BxM], axis=1).astype(jnp.int32)


def chosen_structure(sel_BxM1, template: TreeShape):
  """(depth [B, M1], ancestors [B, M1, M1]) of each row's chosen subtree."""
  depth_Mt1 = jnp.asarray(template.depth_of())
  anc_Mt1xMt1 = jnp.asarray(template.ancestors())
  anc_BxM1xMt1 = anc_Mt1xMt1[sel_BxM1]
  return depth_Mt1[sel_BxM1], jnp.take_along_axis(anc_BxM1xMt1, sel_BxM1[:, None, :], axis=2)


def take_rows(a_BxM1, idx_BxK):
  return jnp.take_along_axis(a_BxM1, idx_BxK, axis=1)


@dataclasses.dataclass(frozen=True)
class DynamicForm(Tree):
  """The dynamic tree form of a proposal for engine.block_step (module docstring); flags,
  commit (by node_path_BxW1) and settle (by block position) are Tree's."""
  shape: DynamicTree

  @property
  def template(self) -> TreeShape:
    return self.shape.template

  @property
  def width(self) -> int:
    return self.shape.depth

  @property
  def block_len(self) -> int:
    """Cache slots one iteration may write: the draft writes the template's internal nodes."""
    return self.template.nodes + 1

  def propose(self, draft, state, st, keys_B, sampling, stop, limit_B, vocab) -> ChosenTree:
    del stop, limit_B, vocab
    prop = draft.propose_tree(state, st.seq, st.lengths, keys_B, self.template, sampling)
    scores_BxMt = inclusion_scores(prop.tokens_BxM1, prop.q_BxMxV, prop.conf_BxM, self.template,
                                   sampling.greedy, self.shape.score, self.shape.power)
    return ChosenTree(tokens_BxM1=prop.tokens_BxM1, q_BxMxV=prop.q_BxMxV, passes=prop.passes,
                      state=prop.state, conf_BxM=prop.conf_BxM,
                      sel_BxM1=choose(scores_BxMt, self.shape.budget))

  def score(self, target, draft, cache, prop: ChosenTree, st):
    """The target's pass over each row's chosen nodes: (logits [B, M1, V], hidden, cache)."""
    depth_BxM1, anc_BxM1xM1 = chosen_structure(prop.sel_BxM1, self.template)
    block_BxM1 = take_rows(prop.tokens_BxM1, prop.sel_BxM1)
    if protocol.reads_target(draft):
      return target.decode_tree_features(cache, block_BxM1, st.lengths, depth_BxM1, anc_BxM1xM1,
                                         **protocol.feature_kw(draft))
    logits_BxM1xV, cache = target.decode_tree(cache, block_BxM1, st.lengths, depth_BxM1,
                                              anc_BxM1xM1)
    return logits_BxM1xV, None, cache

  def verify(self, verifier, keys_B, prop: ChosenTree, logits_BxM1xV, sampling) -> Verdict:
    b, mt1 = prop.tokens_BxM1.shape
    rows_B1 = jnp.arange(b)[:, None]
    chosen_BxMt1 = jnp.zeros((b, mt1), bool).at[rows_B1, prop.sel_BxM1].set(True)
    tokens_BxMt1 = jnp.where(chosen_BxMt1, prop.tokens_BxM1, -1)
    q_BxMtxV = jnp.where(chosen_BxMt1[:, 1:, None], prop.q_BxMxV, 0.0)
    logits_BxMt1xV = jnp.zeros((b, mt1) + logits_BxM1xV.shape[2:], logits_BxM1xV.dtype)
    logits_BxMt1xV = logits_BxMt1xV.at[rows_B1, prop.sel_BxM1].set(logits_BxM1xV)
    node_path_BxD1, m_B, next_B, _ = verifier.tree(keys_B, tokens_BxMt1, q_BxMtxV,
                                                   logits_BxMt1xV, self.template, sampling)
    # The alpha terms with the unmasked laws (a node whose children were all left out still
    # had its draft law).
    on_path_BxDxV = jnp.take_along_axis(logits_BxMt1xV, node_path_BxD1[:, :-1, None], axis=1)
    beta_BxD = acceptance.path_betas(node_path_BxD1, prop.q_BxMxV,
                                     sampling_lib.probs(on_path_BxDxV, sampling), self.template)
    block_pos_BxMt1 = jnp.zeros((b, mt1), jnp.int32).at[rows_B1, prop.sel_BxM1].set(
        jnp.broadcast_to(jnp.arange(prop.sel_BxM1.shape[1], dtype=jnp.int32),
                         prop.sel_BxM1.shape))
    return Verdict(n_B=jnp.full(m_B.shape, self.width, jnp.int32), m_B=m_B, next_B=next_B,
                   beta_BxW=beta_BxD,
                   tokens_BxW=take_rows(prop.tokens_BxM1, node_path_BxD1[:, 1:]),
                   path_BxW1=take_rows(block_pos_BxMt1, node_path_BxD1),
                   verified_B=jnp.full(m_B.shape, self.shape.budget, jnp.int32),
                   node_path_BxW1=node_path_BxD1)
