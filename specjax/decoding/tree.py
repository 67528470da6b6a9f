"""Exact tree speculative decoding: several candidates per position, one target call per tree.

Shape legend: B batch, S source, N decoder-sequence buffer, D tree depth, D1 = D + 1,
M tree nodes below the root, M1 = M + 1 (with the root), P internal nodes (root included, the
nodes that have children), V vocab.

The tree. `tree=(3, 2, 1)` gives the root 3 children, each of them 2, each of those 1: a static
shape, so one compiled program. Nodes are numbered depth by depth (node 0 the root = the last
committed token); the children of node j at depth d, the i-th of its level, are the nodes
level_start[d+1] + i * b_{d+1} + c, c < b_{d+1}. The depth D plays the role of gamma.

One iteration per row:
  1. draft: the draft expands every node of a level in one batched call (D calls in all); each
     internal node gets b children drawn from its q (see "Candidates" below);
  2. target: ONE call over the whole tree block (specjax.models.t5.decode_tree: each node sees the
     committed prefix and its ancestors; positions by depth), giving p at every node;
  3. verification: from the root down, the children of the current node are tried in order by
     recursive rejection sampling (below); an accepted child becomes the current node, a node whose
     children are all rejected emits one token from the final residual, a leaf reached emits the
     bonus token from its own p;
  4. commit: the accepted path (m <= D tokens) and the emitted token; both caches move the path's
     keys/values into chain slots (t5.gather_path), so the next iteration sees an ordinary prefix.

Candidates. A draft reports, for every non-root node, the law q_i the node's token was drawn from
GIVEN its parent's path and its earlier siblings. `TreeModelDraft` draws them
  * 'wor' (default): without replacement (Gumbel-top-b of log q: the sequential draw without
    replacement), so q_i = q with the earlier siblings' tokens removed, renormalised; siblings are
    distinct, which never wastes a candidate on a token already rejected;
  * 'iid': independently from q, so q_i = q;
  * at temperature 0: the draft's top-b tokens (one-hot q_i; verification is argmax matching).

Verification (recursive rejection sampling, SpecInfer arXiv 2305.09781; RSD arXiv 2402.14160 for
candidates without replacement). At a node with target law p and children x_1 .. x_b:
    r_1 = p
    child i: accept x_i with probability min(1, r_i(x_i) / q_i(x_i));
             if rejected, r_{i+1} = norm(max(0, r_i - q_i))
    all rejected: the emitted token ~ r_{b+1}.
Invariant: given the node's path and the history of rejected siblings x_1 .. x_{i-1}, the token
that this node's procedure emits from step i on (an accepted x_j, or the final residual draw) is
distributed as r_i. Proof, from i = b + 1 (a draw from r_{b+1}) down: x_i ~ q_i given the history,
so P(emit x at step i) = q_i(x) min(1, r_i(x)/q_i(x)) = min(q_i(x), r_i(x)), P(reject) =
1 - sum_x min(q_i, r_i) = sum_x max(0, r_i - q_i) =: Z, and by the invariant for i + 1 the rest
emits Z * r_{i+1}(x) = max(0, r_i(x) - q_i(x)); the sum is r_i(x). At i = 1 the node emits p. An
accepted child's subtree was drawn given the child alone, independent of the acceptance coin, so
the argument repeats one level down with p of the child; a reached leaf emits from its own p (the
bonus). Hence every emitted token follows the target's law given the tokens before it. A rejected
x_i always has r_i(x_i) < q_i(x_i), so r_{i+1}(x_i) = 0: a repeated sibling (i.i.d.) can never be
accepted afterwards, and 'wor' never spends a slot on one. A child with q_i(x_i) = 0 (the draft's
support ran out, e.g. top-k smaller than b) is skipped (no accept, no update), which leaves the
invariant intact. The rule must get the q_i of the scheme the candidates were drawn with: q
instead of the without-replacement q_i (or the reverse), or r not updated between siblings,
breaks the law, and tests/test_tree.py shows the chi-square test rejects each.

Greedy (temperature 0): accept the longest path whose tokens match the target's argmax at each
parent; the emitted token is the argmax at the last accepted node: token-identical to greedy
decoding for any tree.

The draft's cache (TreeModelDraft). One tree block per level, in the same slot layout as the
target's (node j at slot L + j, position L + depth), fed level by level with decode_tree; leaves
are never fed. After acceptance the path's internal nodes are gathered into chain slots. Why not
per-branch caches: they copy the prefix cache once per leaf (memory and bandwidth x leaves, and a
gather back), while the tree block adds only P slots to one cache and reuses the target's mask
code; a level's nodes are one batched call either way. Cache invariant at the start of an
expansion, as ModelDraft's: slots 0 .. L-2 hold the committed prefix, so the first call feeds
[seq[L-1], seq[L]] at L-1 (the root lands in its tree slot L).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.decoding import loop
from specjax.decoding import sampling as sampling_lib
from specjax.decoding.acceptance import in_range, residual
from specjax.decoding.drafts import ModelDraft
from specjax.models import t5 as t5_lib
from specjax.models.t5 import DecoderCache, T5Model

__all__ = ['TreeShape', 'parse_tree', 'parse_trees', 'TreeModelDraft', 'TreeProposal',
           'TreeStats', 'TreeState', 'verify_tree', 'verify_tree_greedy_batch', 'tree_init',
           'tree_step', 'tree_program', 'tree_decode', 'CANDIDATES']

CANDIDATES = ('wor', 'iid')

# ----------------------------------------------------------------------------- tree shape


@dataclasses.dataclass(frozen=True)
class TreeShape:
  """A static tree given by its branching per depth (hashable: a jit static argument)."""
  branching: tuple[int, ...]

  def __post_init__(self):
    b = self.branching
    if (not isinstance(b, tuple) or not b
        or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 1
                   for x in b)):
      raise ValueError(f'tree must be a non-empty tuple of branching factors >= 1, got {b!r}')
    object.__setattr__(self, 'branching', tuple(int(x) for x in b))

  @property
  def depth(self) -> int:
    return len(self.branching)

  @property
  def level_size(self) -> tuple[int, ...]:
    """Nodes per depth 0 .. D (the root level has 1)."""
    return tuple(int(np.prod(self.branching[:d])) for d in range(self.depth + 1))

  @property
  def level_start(self) -> tuple[int, ...]:
    """Index of the first node of each depth 0 .. D, and the total M1 at the end."""
    return tuple(int(x) for x in np.concatenate([[0], np.cumsum(self.level_size)]))

  @property
  def nodes(self) -> int:
    """M: nodes below the root (the tokens the target verifies per call)."""
    return self.level_start[-1] - 1

  @property
  def internal(self) -> int:
    """P: nodes with children (depth < D), the root included."""
    return self.level_start[self.depth]

  def parent(self) -> np.ndarray:
    """[M1] parent index of every node (-1 for the root)."""
    par = [-1]
    for d, b in enumerate(self.branching):
      par += [self.level_start[d] + i // b for i in range(self.level_size[d + 1])]
    return np.asarray(par, np.int32)

  def depth_of(self) -> np.ndarray:
    """[M1] depth of every node."""
    return np.repeat(np.arange(self.depth + 1), self.level_size).astype(np.int32)

  def ancestors(self) -> np.ndarray:
    """[M1, M1] bool: anc[j, i] iff node i is node j or one of its ancestors."""
    par, m1 = self.parent(), self.nodes + 1
    anc = np.eye(m1, dtype=bool)
    for j in range(1, m1):
      anc[j] |= anc[par[j]]
    return anc

  def paths(self) -> np.ndarray:
    """[leaves, D1] the node indices of every root-to-leaf path."""
    anc, depth = self.ancestors(), self.depth_of()
    leaves = range(self.level_start[self.depth], self.nodes + 1)
    return np.asarray([sorted(np.nonzero(anc[j])[0], key=lambda i: depth[i]) for j in leaves],
                      np.int32)

  def __str__(self) -> str:
    return '(' + ','.join(map(str, self.branching)) + ')'


def parse_tree(spec) -> TreeShape:
  """A TreeShape from a tuple/list of ints, a TreeShape or a string like '(3,2,1)' / '3,2,1'."""
  if isinstance(spec, TreeShape):
    return spec
  if isinstance(spec, str):
    try:
      spec = ast.literal_eval(spec.strip() if spec.strip().startswith('(') else f'({spec},)')
    except (ValueError, SyntaxError):
      raise ValueError(f'tree must look like (3,2,1), got {spec!r}') from None
  if isinstance(spec, int):
    spec = (spec,)
  if not isinstance(spec, (tuple, list)):
    raise ValueError(f'tree must be a tuple of branching factors like (3,2,1), got {spec!r}')
  return TreeShape(tuple(spec))


def parse_trees(spec) -> tuple[TreeShape, ...]:
  """Several trees: '((3,2,1), (2,2,2,1))', a list of tuples, or one tree."""
  if isinstance(spec, str):
    try:
      spec = ast.literal_eval(spec.strip())
    except (ValueError, SyntaxError):
      raise ValueError(f'trees must look like ((3,2,1), (2,2,2,1)), got {spec!r}') from None
  if isinstance(spec, TreeShape) or (isinstance(spec, (tuple, list)) and spec
                                     and all(isinstance(x, int) for x in spec)):
    return (parse_tree(spec),)
  if not isinstance(spec, (tuple, list)) or not spec:
    raise ValueError(f'trees must be a non-empty list of trees like ((3,2,1),), got {spec!r}')
  return tuple(parse_tree(s) for s in spec)


# ----------------------------------------------------------------------------- candidates


def sibling_laws(q_BxKxV, tok_BxKxb, scheme: str):
  """q_i [B, K, b, V]: the law child i was drawn from given its earlier siblings, under `scheme`
  ('iid': q itself; 'wor': q without the earlier siblings' tokens, renormalised, all zero once
  q's support is used up)."""
  bsz, k, v = q_BxKxV.shape
  b = tok_BxKxb.shape[-1]
  if scheme == 'iid':
    return jnp.broadcast_to(q_BxKxV[:, :, None, :], (bsz, k, b, v))
  if scheme != 'wor':
    raise ValueError(f'candidates must be one of {CANDIDATES}, got {scheme!r}')
  onehot_BxKxbxV = jax.nn.one_hot(tok_BxKxb, v, dtype=jnp.float32)
  earlier_BxKxbxV = jnp.cumsum(onehot_BxKxbxV, axis=2) - onehot_BxKxbxV
  qi_BxKxbxV = jnp.where(earlier_BxKxbxV > 0, 0.0, q_BxKxV[:, :, None, :])
  total = jnp.sum(qi_BxKxbxV, axis=-1, keepdims=True)
  return jnp.where(total > 0, qi_BxKxbxV / jnp.maximum(total, 1e-30), 0.0)


def draw_tokens(q_BxKxV, keys_B, b: int, scheme: str):
  """b candidate tokens [B, K, b] per node: 'iid' b independent draws from q (Gumbel-max), 'wor'
  the sequential draw without replacement (Gumbel-top-b of log q, in order)."""
  _, k, v = q_BxKxV.shape
  logq_BxKxV = sampling_lib.log_probs(q_BxKxV)
  if scheme == 'iid':
    g_BxKxbxV = jax.vmap(lambda key: jax.random.gumbel(key, (k, b, v), jnp.float32))(keys_B)
    return jnp.argmax(logq_BxKxV[:, :, None, :] + g_BxKxbxV, axis=-1).astype(jnp.int32)
  if scheme != 'wor':
    raise ValueError(f'candidates must be one of {CANDIDATES}, got {scheme!r}')
  g_BxKxV = jax.vmap(lambda key: jax.random.gumbel(key, (k, v), jnp.float32))(keys_B)
  return jax.lax.top_k(logq_BxKxV + g_BxKxV, b)[1].astype(jnp.int32)


def draw_children(logits_BxKxV, keys_B, b: int, sampling, scheme: str):
  """b children of each of K nodes: (tokens [B, K, b] int32, q_i [B, K, b, V] f32), q_i the law
  child i was drawn from given the earlier siblings (see the module docstring). Greedy: the
  draft's top-b tokens, one-hot q_i."""
  v = logits_BxKxV.shape[-1]
  if sampling.greedy:
    tok_BxKxb = jax.lax.top_k(logits_BxKxV.astype(jnp.float32), b)[1].astype(jnp.int32)
    return tok_BxKxb, jax.nn.one_hot(tok_BxKxb, v, dtype=jnp.float32)
  q_BxKxV = sampling_lib.probs(logits_BxKxV, sampling)
  tok_BxKxb = draw_tokens(q_BxKxV, keys_B, b, scheme)
  return tok_BxKxb, sibling_laws(q_BxKxV, tok_BxKxb, scheme)


# ----------------------------------------------------------------------------- drafts


@struct.dataclass
class TreeProposal:
  """What a tree draft's `expand` returns.

  tokens_BxM1: [B, M1] int32   node tokens (node 0 = the root, the last committed token)
  q_BxMxV:     [B, M, V] f32   the law node j + 1 was drawn from (given its parent's path and its
                               earlier siblings)
  passes:      [] int32        draft forward passes made
  state:       pytree          the draft's state
  """
  tokens_BxM1: jax.Array
  q_BxMxV: jax.Array
  passes: jax.Array
  state: Any


@struct.dataclass
class TreeModelDraft:
  """A smaller T5 expanding the tree level by level (D batched calls per iteration); see the
  module docstring for its cache. `candidates`: 'wor' (default) or 'iid'."""
  model: T5Model
  candidates: str = struct.field(pytree_node=False, default='wor')

  @property
  def vocab_size(self) -> int:
    return self.model.config.vocab_size

  def init(self, input_ids_BxS, max_len: int) -> DecoderCache:
    return self.model.init_cache(input_ids_BxS, max_len)

  def children(self, logits_BxKxV, keys_B, b: int, sampling):
    """(tokens, q_i) of b children per node. (A method so that a test can inject a mislabel.)"""
    return draw_children(logits_BxKxV, keys_B, b, sampling, self.candidates)

  def expand(self, cache, seq_BxN, lengths_B, keys_B, shape: TreeShape, sampling) -> TreeProposal:
    b = seq_BxN.shape[0]
    take = lambda pos_B: jnp.take_along_axis(seq_BxN, pos_B[:, None], axis=1)[:, 0]
    start_B = jnp.maximum(lengths_B - 1, 0)
    block_Bx2 = jnp.stack([take(start_B), take(start_B + 1)], 1)
    logits_Bx2xV, cache = self.model.decode(cache, block_Bx2, start_B)
    logits_BxKxV = jnp.where((lengths_B >= 1)[:, None, None], logits_Bx2xV[:, 1:],
                             logits_Bx2xV[:, :1])
    depth_M1, anc = shape.depth_of(), shape.ancestors()
    starts, sizes = shape.level_start, shape.level_size
    tokens = [take(lengths_B)[:, None]]
    qs = []
    nan = jnp.isnan(logits_BxKxV).any()
    for d, branch in enumerate(shape.branching):
      if d:  # feed level d (its ancestors are in the cache already)
        logits_BxKxV, cache = self.model.decode_tree(cache, tokens[-1], lengths_B, depth_M1, anc,
                                                     starts[d])
        nan = nan | jnp.isnan(logits_BxKxV).any()
      keys_d = jax.vmap(lambda k, d=d: jax.random.fold_in(k, d))(keys_B)
      tok_BxKxb, q_BxKxbxV = self.children(logits_BxKxV, keys_d, branch, sampling)
      tokens.append(tok_BxKxb.reshape(b, sizes[d + 1]))
      qs.append(q_BxKxbxV.reshape(b, sizes[d + 1], -1))
    q_BxMxV = jnp.concatenate(qs, axis=1)
    return TreeProposal(tokens_BxM1=jnp.concatenate(tokens, axis=1),
                        q_BxMxV=jnp.where(nan, jnp.nan, q_BxMxV),
                        passes=jnp.int32(shape.depth), state=cache)

  def commit(self, cache, seq_BxN, old_lengths_B, path_BxD1, lengths_B):
    """The accepted path's internal nodes into chain slots (leaves were never fed)."""
    del seq_BxN, lengths_B
    return t5_lib.gather_path(cache, old_lengths_B, path_BxD1[:, :-1])


def as_tree_draft(draft):
  """A tree draft: a T5Model or a (non-argmax) ModelDraft becomes a TreeModelDraft."""
  if isinstance(draft, T5Model):
    return TreeModelDraft(draft)
  if isinstance(draft, ModelDraft):
    if draft.argmax:
      raise ValueError('tree=: ModelDraft(argmax=True) has no tree form; pass the T5Model')
    return TreeModelDraft(draft.model)
  if not (hasattr(draft, 'expand') and hasattr(draft, 'vocab_size')):
    raise ValueError(f'tree= needs a model draft (T5Model, ModelDraft or TreeModelDraft), got '
                     f'{type(draft).__name__}')
  return draft


# ----------------------------------------------------------------------------- verification


def verify_tree(key, tokens_M1, q_MxV, p_M1xV, shape: TreeShape, residual_fn=residual):
  """Recursive rejection sampling down one row's tree (module docstring: rule and invariant).

  tokens_M1 node tokens (node 0 the root), q_MxV the law of node j+1 given its history, p_M1xV the
  target's processed law at every node. Returns (path_D1 int32: accepted node per depth, path[0] =
  0, entries past m are 0; m accepted tokens in [0, D]; the emitted token).
  """
  v = p_M1xV.shape[-1]
  key_u, key_next = jax.random.split(key)
  u_M1 = jax.random.uniform(key_u, (shape.nodes + 1,), jnp.float32)
  starts = shape.level_start
  node, alive, m = jnp.int32(0), jnp.bool_(True), jnp.int32(0)
  path = [jnp.int32(0)]
  final_V = p_M1xV[0]
  for d, b in enumerate(shape.branching):
    r_V = p_M1xV[node]
    child0 = starts[d + 1] + (node - starts[d]) * b
    acc, chosen = jnp.bool_(False), child0
    for i in range(b):
      c = child0 + i
      x = tokens_M1[c]
      q_V = q_MxV[c - 1]
      xc = jnp.clip(x, 0, v - 1)
      valid = (q_V[xc] > 0) & in_range(x, v)
      take = ~acc & valid & (u_M1[c] * q_V[xc] < r_V[xc])
      rejected = ~acc & valid & ~take
      chosen = jnp.where(take, c, chosen)
      r_V = jnp.where(rejected, residual_fn(r_V, q_V), r_V)
      acc = acc | take
    final_V = jnp.where(alive & ~acc, r_V, final_V)
    go = alive & acc
    m = m + go.astype(jnp.int32)
    node = jnp.where(go, chosen, node)
    path.append(jnp.where(go, chosen, 0))
    alive = go
  final_V = jnp.where(alive, p_M1xV[node], final_V)  # a leaf reached: the bonus token
  return jnp.stack(path).astype(jnp.int32), m, sampling_lib.sample(key_next, final_V)


def verify_tree_greedy_batch(tokens_BxM1, logits_BxM1xV, shape: TreeShape):
  """Temperature 0: the longest path matching the target's argmax; (path_BxD1, m_B, next_B)."""
  top_BxM1 = jnp.argmax(logits_BxM1xV, axis=-1).astype(jnp.int32)
  bsz = tokens_BxM1.shape[0]
  take = lambda a_BxM1, i_B: jnp.take_along_axis(a_BxM1, i_B[:, None], axis=1)[:, 0]
  starts = shape.level_start
  node_B, alive_B = jnp.zeros((bsz,), jnp.int32), jnp.ones((bsz,), bool)
  m_B, path = jnp.zeros((bsz,), jnp.int32), [jnp.zeros((bsz,), jnp.int32)]
  for d, b in enumerate(shape.branching):
    want_B = take(top_BxM1, node_B)
    child0_B = starts[d + 1] + (node_B - starts[d]) * b
    kids_Bxb = child0_B[:, None] + jnp.arange(b)[None, :]
    match_Bxb = jnp.take_along_axis(tokens_BxM1, kids_Bxb, axis=1) == want_B[:, None]
    go_B = alive_B & match_Bxb.any(axis=1)
    chosen_B = take(kids_Bxb, jnp.argmax(match_Bxb, axis=1))
    node_B = jnp.where(go_B, chosen_B, node_B)
    path.append(jnp.where(go_B, chosen_B, 0))
    m_B = m_B + go_B.astype(jnp.int32)
    alive_B = go_B
  return jnp.stack(path, axis=1), m_B, take(top_BxM1, node_B)


# ----------------------------------------------------------------------------- loop


@struct.dataclass
class TreeStats:
  """On-device statistics of one tree decoding call.

  iterations:    []       outer loop iterations (= target calls for the batch)
  draft_passes:  []       draft forward passes (D per iteration)
  target_calls:  [B]      iterations in which the row was still generating
  accepted_hist: [B, D1]  how often the accepted path had length m = 0 .. D
  accepted:      [B]      accepted draft tokens
  emitted:       [B]      tokens produced by verification (m + 1 per iteration)
  verified:      [B]      tree nodes the target verified (M per call)
  levels:        [B]      depths at which candidates were tried (m + 1, or D for a full path)
  nan:           []       a NaN appeared in the target's or draft's logits
  bad_draft:     []       a draft token id outside [0, V)
  """
  iterations: jax.Array
  draft_passes: jax.Array
  target_calls: jax.Array
  accepted_hist: jax.Array
  accepted: jax.Array
  emitted: jax.Array
  verified: jax.Array
  levels: jax.Array
  nan: jax.Array
  bad_draft: jax.Array

  @classmethod
  def zeros(cls, batch: int, depth: int) -> TreeStats:
    z_B = jnp.zeros((batch,), jnp.int32)
    return cls(iterations=jnp.int32(0), draft_passes=jnp.int32(0), target_calls=z_B,
               accepted_hist=jnp.zeros((batch, depth + 1), jnp.int32), accepted=z_B, emitted=z_B,
               verified=z_B, levels=z_B, nan=jnp.bool_(False), bad_draft=jnp.bool_(False))

  def record(self, active_B, m_B, nodes: int, passes, nan, bad) -> TreeStats:
    act_B = active_B.astype(jnp.int32)
    d1 = self.accepted_hist.shape[-1]
    return self.replace(
        iterations=self.iterations + 1, draft_passes=self.draft_passes + passes,
        target_calls=self.target_calls + act_B,
        accepted_hist=self.accepted_hist + act_B[:, None] * (jnp.arange(d1)[None] == m_B[:, None]),
        accepted=self.accepted + act_B * m_B, emitted=self.emitted + act_B * (m_B + 1),
        verified=self.verified + act_B * nodes,
        levels=self.levels + act_B * jnp.minimum(m_B + 1, d1 - 1),
        nan=self.nan | nan, bad_draft=self.bad_draft | bad)

  @property
  def draft_calls(self):
    return self.draft_passes

  @property
  def tokens_per_target_call(self) -> float:
    return loop.per_target_call(self.emitted, self.target_calls)

  @property
  def nodes_per_target_call(self) -> float:
    return loop.per_target_call(self.verified, self.target_calls)

  @property
  def acceptance_rate(self) -> float:
    """Per-level acceptance: accepted levels / levels tried (a chain's accepted / proposed; with
    more candidates per node it grows, which is the point of the tree)."""
    return float(np.sum(self.accepted) / max(int(np.sum(self.levels)), 1))

  @property
  def alpha(self) -> float:
    """The runner's alpha column for a tree: the per-level acceptance (acceptance_rate)."""
    return self.acceptance_rate

  @property
  def proposed_per_target_call(self) -> float:
    """Nodes verified per target call (a chain's proposed tokens per call)."""
    return self.nodes_per_target_call

  @property
  def mean_accepted(self) -> float:
    """Mean accepted path length per target call."""
    return loop.per_target_call(self.accepted, self.target_calls)

  def summary(self) -> dict[str, Any]:
    return {
        'iterations': int(self.iterations),
        'draft_passes': int(self.draft_passes),
        'target_calls': int(np.sum(self.target_calls)),
        'accepted_hist': np.asarray(self.accepted_hist).sum(0).tolist(),
        'accepted': int(np.sum(self.accepted)),
        'emitted': int(np.sum(self.emitted)),
        'verified': int(np.sum(self.verified)),
        'tokens_per_target_call': self.tokens_per_target_call,
        'nodes_per_target_call': self.nodes_per_target_call,
        'mean_accepted': self.mean_accepted,
        'acceptance_rate': self.acceptance_rate,
    }


@struct.dataclass
class TreeState(loop.LoopState):
  """Loop state of tree decoding (loop.LoopState's fields, no trace; stats a TreeStats).

  seq [B, N], lengths [B], done [B], target_cache, draft_state, rng, stats (TreeStats); the caches
  hold max_new + M1 slots, seq 1 + max_new + D + 1 tokens.
  """

  def keys(self):
    keys_B = loop.row_keys(self.rng, self.stats.iterations, self.seq.shape[0])
    both_Bx2 = jax.vmap(lambda k: jax.random.split(k, 2))(keys_B)
    return both_Bx2[:, 0], both_Bx2[:, 1]


def tree_init(target, draft, input_ids_BxS, rng, *, shape: TreeShape,
              max_new_tokens: int) -> TreeState:
  draft = as_tree_draft(draft)
  b = input_ids_BxS.shape[0]
  cache_len = max_new_tokens + shape.nodes + 1
  seq = jnp.zeros((b, max_new_tokens + shape.depth + 2), jnp.int32)
  seq = seq.at[:, 0].set(target.config.decoder_start_token_id)
  return TreeState(seq=seq, lengths=jnp.zeros((b,), jnp.int32), done=jnp.zeros((b,), bool),
                   target_cache=target.init_cache(input_ids_BxS, cache_len),
                   draft_state=draft.init(input_ids_BxS, cache_len), rng=rng,
                   stats=TreeStats.zeros(b, shape.depth))


def tree_step(target, draft, state: TreeState, *, shape: TreeShape, max_new_tokens: int,
              sampling, eos_id: int, verify_fn=None) -> TreeState:
  """One iteration for every unfinished row: expand, score the tree in one call, verify, commit.
  `verify_fn` (verify_tree's signature, a module-level function) replaces the rule, greedy too."""
  draft = as_tree_draft(draft)
  draft_keys_B, verify_keys_B = state.keys()
  prop = draft.expand(state.draft_state, state.seq, state.lengths, draft_keys_B, shape, sampling)
  depth_M1, anc = shape.depth_of(), shape.ancestors()
  logits_BxM1xV, target_cache = target.decode_tree(state.target_cache, prop.tokens_BxM1,
                                                   state.lengths, depth_M1, anc)
  if sampling.greedy and verify_fn is None:
    path_BxD1, m_B, next_B = verify_tree_greedy_batch(prop.tokens_BxM1, logits_BxM1xV, shape)
  else:
    p_BxM1xV = sampling_lib.probs(logits_BxM1xV, sampling)
    fn = functools.partial(verify_fn or verify_tree, shape=shape)
    path_BxD1, m_B, next_B = jax.vmap(fn)(verify_keys_B, prop.tokens_BxM1, prop.q_BxMxV,
                                          p_BxM1xV)
  d = shape.depth
  path_tok_BxD = jnp.take_along_axis(prop.tokens_BxM1, path_BxD1[:, 1:], axis=1)
  cand_BxD1 = jnp.where(jnp.arange(d + 1)[None, :] == m_B[:, None], next_B[:, None],
                        jnp.pad(path_tok_BxD, ((0, 0), (0, 1))))
  seq, lengths, done = loop.commit_tokens(state.seq, state.lengths, state.done, cand_BxD1,
                                          m_B + 1, eos_id, max_new_tokens)
  nan = jnp.isnan(logits_BxM1xV).any() | jnp.isnan(prop.q_BxMxV).any()
  v = target.config.vocab_size
  bad = jnp.any(~in_range(prop.tokens_BxM1[:, 1:], v) & ~state.done[:, None])
  stats = state.stats.record(~state.done, m_B, shape.nodes, prop.passes, nan, bad)
  return state.replace(
      seq=seq, lengths=lengths, done=done | stats.nan | stats.bad_draft,
      target_cache=t5_lib.gather_path(target_cache, state.lengths, path_BxD1),
      draft_state=draft.commit(prop.state, seq, state.lengths, path_BxD1, lengths), stats=stats)


@functools.partial(jax.jit, static_argnames=('shape', 'max_new_tokens', 'sampling', 'eos_id',
                                             'verify_fn'))
def tree_program(target, draft, input_ids_BxS, rng, *, shape, max_new_tokens, sampling, eos_id,
                 verify_fn=None):
  """The whole tree loop as one jitted program (unchecked; tree_decode validates)."""
  loop.TRACE_COUNTS['tree'] += 1
  state = tree_init(target, draft, input_ids_BxS, rng, shape=shape, max_new_tokens=max_new_tokens)

  def cond_fn(state: TreeState):
    return ~jnp.all(state.done)

  def body_fn(state: TreeState):
    return tree_step(target, draft, state, shape=shape, max_new_tokens=max_new_tokens,
                     sampling=sampling, eos_id=eos_id, verify_fn=verify_fn)

  state = jax.lax.while_loop(cond_fn, body_fn, state)
  return loop.DecodeOutput(
      tokens=loop.finish_tokens(state.seq, state.lengths, max_new_tokens,
                               target.config.pad_token_id),
      lengths=state.lengths, stats=state.stats)


def tree_decode(target, draft, input_ids, *, tree, max_new_tokens: int, temperature: float = 0.0,
                top_k: int = 0, top_p: float = 1.0, rng=None, eos_id: int | None = None,
                verify_fn=None) -> loop.DecodeOutput:
  """Exact tree speculative decoding (`speculative_decode(..., tree=...)` lands here).

  `tree` a branching tuple like (3, 2, 1) (or '(3,2,1)'); `draft` a T5Model, ModelDraft or
  TreeModelDraft (candidates 'wor' or 'iid'). The output law is exactly the target's; temperature
  0 is token-identical to greedy decoding. stats is a TreeStats.
  """
  shape = parse_tree(tree)
  sampling = loop.make_sampling(temperature, top_k, top_p)
  draft = as_tree_draft(draft)
  if not hasattr(target, 'decode_tree'):
    raise ValueError(f'tree=: the target {type(target).__name__} has no decode_tree '
                     '(a specjax T5Model is needed)')
  # the chain loop's helpers: both loops validate, seed and report NaNs alike
  loop.check_inputs(input_ids, max_new_tokens, shape.depth, sampling, target.config.vocab_size,
                    int(draft.vocab_size))
  eos = target.config.eos_token_id if eos_id is None else int(eos_id)
  out = tree_program(target, draft, jnp.asarray(input_ids, jnp.int32), loop.as_key(rng),
                     shape=shape, max_new_tokens=int(max_new_tokens), sampling=sampling, eos_id=eos,
                     verify_fn=verify_fn)
  loop.raise_on_nan(out.stats.nan, 'speculative_decode(tree=...)')
  if bool(out.stats.bad_draft):
    raise ValueError(f'speculative_decode: the tree draft {type(draft).__name__} proposed a '
                     f'token id outside [0, {target.config.vocab_size}) (vocab_size)')
  return out.to_host()
