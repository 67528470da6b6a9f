"""FeatureHeadDraft: drafting from the target's own features (EAGLE-style) for T5.

Shape legend: B batch, S source, N decoder-sequence buffer, T cache length, G gamma (block
width), G1 = G + 1, V vocab, D the head's width, Df the target's d_model, K nodes of one tree
level, C their children, M tree nodes below the root, M1 = M + 1.

The head (specjax.models.head) is one narrow T5 decoder block that reads, at decoder position j,
the target's final hidden state f_{j-1} and the token y_j, and predicts f_j and the next token.
The loop hands it what the target computes anyway (protocol: `reads_target = True`):

  init    the target's DecoderCache: the head cross-attends through the target's last-layer
          cross-attention keys/values (no encoder of its own, no second encoder call)
  commit  the target's hidden states of the block it just verified (TargetFeatures)

State: the head's self-attention cache and a buffer `prev_BxNxDf` with prev[j] = f_{j-1}, the
target feature position j reads (prev[0] = the learned start feature). Invariant after every
commit: prev[j] is the target's feature for every j <= L (L = the row's length), because each
verification block rewrites the positions after the previous block's accepted prefix.

propose, per row with L generated tokens:
  1. one pass over the window of G1 positions w .. w+G, w = max(L - G, 0), with the *true*
     features prev[w .. w+G]: it rewrites the head's cache entries that the last rollout wrote
     from its own predicted features (at most m + 1 <= G1 positions since the last proposal)
     and yields, at window index L - w, q for d_1 and the predicted f_L;
  2. token by token through protocol.rollout: feed d_k with the head's own predicted feature,
     get q for d_{k+1} and the next predicted feature.
So a proposal of n tokens makes 1 window pass + (n - 1) one-token passes. q is the head's
processed distribution, exactly what each token was drawn from: verification is the usual exact
rule and greedy output is token-identical to greedy decoding.

Trees (propose_tree): the same window pass gives the root's children (its top candidates,
specjax.decoding.candidates) and its predicted feature; then level by level every internal node
is fed with its parent's predicted feature, each on its own copy of the head's cache (the head is
narrow, so per-node copies are cheap and its block needs no tree mask), which gives that node's
children and its own predicted feature: D passes for depth D. The kept cache is the window's; the
target's hidden states along the accepted path arrive in commit, as after a chain. The window of
the next proposal (D + 1 positions) rewrites every position since. After plain decoding steps
(gamma='auto' picks 0) the features still arrive through commit, and `resync` re-feeds the whole
prefix once with them.

Parallel mode (`for_target(..., parallel=True)`, draft name 'DIR:parallel=1'; a head trained
with parallel blocks, HeadConfig.parallel_depth): the window pass is the block's only head pass.
Its state z at the last verified position gives q for d_1 as above; small residual MLPs on z
(head_lib.parallel_step) give q for d_2 .. d_G, each either from z alone (Medusa-style) or
chained through the previous state and the draft just drawn (parallel_tokens, Hydra-style). Each
q_k depends only on the prefix and d_1 .. d_{k-1}, and each d_k is drawn from it: the usual rule
is exact. Chains only (a tree expands level by level); gamma <= parallel_depth + 1.

Truncated draft vocabulary (FR-Spec, EAGLE-3): `for_target(..., vocab=V_d)` keeps the lm_head
columns of the V_d most frequent target ids (the head directory's vocab.json) and `slot_V` maps
every target id to its column, V_d for a dropped id, whose logit is then -inf: q over the full
vocabulary is the softmax over the kept ids and 0 elsewhere. Exactness needs nothing else: a
dropped id is never drafted (inverse-CDF and argmax draws never pick a zero-mass id), acceptance
tests u q(x) < p(x) at drafted ids only (q(x) > 0 there), and the residual norm(max(0, p - q))
is simply p on the dropped ids -- the target's mass there comes back through the rejection path.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.decoding import candidates as candidates_lib
from specjax.decoding import protocol
from specjax.decoding import sampling as sampling_lib
from specjax.decoding.model_draft import take_at
from specjax.decoding.protocol import Proposal, TargetFeatures, TreeProposal
from specjax.decoding.shapes import TreeShape
from specjax.models import cpu_kernels
from specjax.models import head as head_lib
from specjax.models.t5 import T5Model


@struct.dataclass
class HeadState:
  """cache: the head's self-attention cache (T positions); cross_k / cross_v [B, S, Hc, Dkc] and
  enc_mask [B, S]: the target's last-layer cross-attention keys/values (the same arrays as in the
  target's cache); prev_BxNxDf: prev[j] = the target's feature f_{j-1} (N = T + 1)."""
  cache: head_lib.HeadCache
  cross_k: jax.Array
  cross_v: jax.Array
  enc_mask: jax.Array
  prev_BxNxDf: jax.Array


def _rows(x_BxN, start_B, width: int):
  """x[b, start[b] : start[b] + width] per row (along axis 1)."""
  return jax.vmap(lambda x, s: jax.lax.dynamic_slice_in_dim(x, s, width, axis=0))(x_BxN, start_B)


@struct.dataclass
class FeatureHeadDraft:
  """A feature head as a draft (see the module docstring). Build with `for_target`."""
  params: Any
  target_embed_VxDf: jax.Array        # the target's embedding (shared, never copied)
  config: head_lib.HeadConfig = struct.field(pytree_node=False)
  candidates: str = struct.field(pytree_node=False, default='wor')
  packed: Any = None                  # head_lib.pack_head's weights when the target runs packed
  slot_V: Any = None  # truncated vocabulary: target id -> lm_head column (V_d: dropped); None: all
  parallel: bool = struct.field(pytree_node=False, default=False)  # one pass drafts the block

  reads_target = True  # protocol: the loop passes the target's cache and features

  @property
  def feature_taps(self) -> tuple[int, ...]:
    """The target layers fused beside its final state (protocol.feature_kw)."""
    return self.config.feature_taps

  @classmethod
  def for_target(cls, target: T5Model, head, vocab=None, weights: str | None = None,
                 parallel: bool = False) -> 'FeatureHeadDraft':
    """`head`: a head directory (save_head's files) or (params, HeadConfig). `vocab`: None (the
    full vocabulary), V_d (the V_d most frequent ids of the directory's vocab.json) or the kept
    ids themselves. `weights`: how the CPU kernels store the head's matrices ('float32',
    'bfloat16', 'int8'); None stores them in bf16 where that changes no value (a head saved in
    bf16, as the shipped one; half the bytes a pass, the same q) or with the target, else
    float32. A draft's weights change only q, never the output law, so 'int8' is exact too.
    `parallel`: draft each block from one pass (`propose_parallel`; the head needs its
    parallel blocks, HeadConfig.parallel_depth). A one-line ValueError for a bad file or
    option, before anything compiles."""
    if weights not in (None, *cpu_kernels.WEIGHTS):
      raise ValueError(f'feature head weights={weights!r}: expected one of {cpu_kernels.WEIGHTS}')
    directory = isinstance(head, (str, bytes)) or hasattr(head, '__fspath__')
    if directory:
      params, config = head_lib.load_head(head, dtype=target.dtype)
    else:
      params, config = head
    config.check_target(target.config)
    if parallel and not config.parallel_depth:
      raise ValueError(f'feature head {head if directory else "params"}: parallel=1 needs a head '
                       'trained with parallel blocks (head.parallel_depth > 0), this one has none')
    params = jax.tree.map(lambda p: jnp.asarray(p).astype(target.dtype), params)
    slot_V = None
    if vocab is not None:
      keep_Vd = cls.kept_ids(head if directory else None, vocab, config.vocab_size)
      if len(keep_Vd) < config.vocab_size:
        params = head_lib.truncate(params, keep_Vd)
        slot = np.full((config.vocab_size,), len(keep_Vd), np.int32)
        slot[keep_Vd] = np.arange(len(keep_Vd), dtype=np.int32)
        slot_V = jnp.asarray(slot)
    # The head's passes go through the CPU kernels wherever the target's decode steps do.
    if weights is None:
      lossless = target.dtype == jnp.bfloat16 or all(
          bool(jnp.all(p.astype(jnp.bfloat16).astype(p.dtype) == p))
          for p in jax.tree.leaves(params))
      weights = 'bfloat16' if lossless else 'float32'
    packed = head_lib.pack_head(params, weights) if target.packed is not None else None
    params = head_lib.quantize_head(params, weights)  # every path computes the head it stores
    return cls(params=params, target_embed_VxDf=target.params['shared'], config=config,
               slot_V=slot_V, packed=packed, parallel=bool(parallel))

  @staticmethod
  def kept_ids(directory, vocab, vocab_size: int) -> np.ndarray:
    """The kept ids (sorted int32) for `for_target`'s `vocab` option."""
    if isinstance(vocab, (int, np.integer)) and not isinstance(vocab, bool):
      if directory is None:
        raise ValueError(f'feature head: vocab={vocab} needs a head directory (its '
                         f'{head_lib.VOCAB_NAME}); pass the kept ids for in-memory params')
      return head_lib.keep_ids(directory, int(vocab), vocab_size)
    ids = np.asarray(vocab)
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in 'iu' or ids.min() < 0 or (
        ids.max() >= vocab_size) or len(np.unique(ids)) != ids.size:
      raise ValueError(f'feature head: vocab must be a count or distinct ids in [0, {vocab_size})'
                       f', got {vocab!r}'[:200])
    return np.sort(ids).astype(np.int32)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def draft_vocab(self) -> int:
    """V_d: the ids the head can draft (the target's V unless truncated)."""
    return self.params['lm_head'].shape[-1]

  def full_vocab(self, logits_xVd):
    """Logits over the target's V: the kept ids' own, -inf (q = 0) at the dropped ones."""
    if self.slot_V is None:
      return logits_xVd
    dropped = jnp.full(logits_xVd.shape[:-1] + (1,), -jnp.inf, logits_xVd.dtype)
    return jnp.take(jnp.concatenate([logits_xVd, dropped], axis=-1), self.slot_V, axis=-1,
                    mode='clip')

  def init(self, input_ids_BxS, max_len: int, *, target_cache) -> HeadState:
    del input_ids_BxS
    b = target_cache.enc_mask.shape[0]
    dtype = self.params['in_proj'].dtype
    prev = jnp.zeros((b, max_len + 1, self.config.input_dim), dtype)
    prev = prev.at[:, 0].set(self.params['start_feature'].astype(dtype))
    return HeadState(cache=head_lib.init_cache(self.config, b, max_len, dtype),
                     cross_k=target_cache.cross_k[-1], cross_v=target_cache.cross_v[-1],
                     enc_mask=target_cache.enc_mask, prev_BxNxDf=prev)

  def commit(self, state: HeadState, seq_BxN, lengths_B, *, features: TargetFeatures
             ) -> HeadState:
    """prev[start + 1 + i] = hidden[i]: the block's features at the positions after them."""
    del seq_BxN, lengths_B
    write = jax.vmap(lambda p, h, s: jax.lax.dynamic_update_slice_in_dim(p, h.astype(p.dtype),
                                                                         s, axis=0))
    return state.replace(prev_BxNxDf=write(state.prev_BxNxDf, features.hidden_BxG1xD,
                                           features.start_B + 1))

  def _block_d(self, state: HeadState, cache, tokens_BxK, features_BxKxDf, lengths_B):
    """head_lib.block: (predicted features, logits over the V_d drafted ids, cache)."""
    return head_lib.block(
        self.params, self.config, cache, self.target_embed_VxDf, state.cross_k, state.cross_v,
        state.enc_mask, tokens_BxK, features_BxKxDf, lengths_B, fast=self.packed)

  def _block(self, state: HeadState, cache, tokens_BxK, features_BxKxDf, lengths_B):
    """head_lib.block with the logits over the target's V (`full_vocab`)."""
    feat_BxKxDf, logits_BxKxVd, cache = self._block_d(state, cache, tokens_BxK, features_BxKxDf,
                                                      lengths_B)
    return feat_BxKxDf, self.full_vocab(logits_BxKxVd), cache

  def decode(self, state: HeadState, tokens_BxK, lengths_B):
    """One head pass over K tokens per row at offsets lengths_B, reading the stored features
    prev[lengths .. lengths + K - 1]: (logits [B, K, V], state). The cost of one draft step
    (what `runner.metrics.measure_c` times)."""
    feats = _rows(state.prev_BxNxDf, lengths_B, tokens_BxK.shape[1])
    _, logits, cache = self._block(state, state.cache, tokens_BxK, feats, lengths_B)
    return logits, state.replace(cache=cache)

  def resync(self, state: HeadState, seq_BxN, lengths_B) -> HeadState:
    """The head's cache re-fed over the whole buffer with the target's features (one pass;
    positions past a row's length are masked later): after plain decoding steps."""
    del lengths_B
    t = state.cache.max_len
    zeros_B = jnp.zeros((seq_BxN.shape[0],), jnp.int32)
    _, _, cache = self._block(state, state.cache, seq_BxN[:, :t], state.prev_BxNxDf[:, :t],
                              zeros_B)
    return state.replace(cache=cache)

  def window_state(self, state: HeadState, seq_BxN, lengths_B, gamma: int):
    """`window`'s pass up to the head's final norm: (its state z at the last position [B, D],
    cache)."""
    w_B = jnp.maximum(lengths_B - gamma, 0)
    z_BxG1xD, cache = head_lib.block_state(
        self.params, self.config, state.cache, self.target_embed_VxDf, state.cross_k,
        state.cross_v, state.enc_mask, _rows(seq_BxN, w_B, gamma + 1),
        _rows(state.prev_BxNxDf, w_B, gamma + 1), w_B, fast=self.packed)
    return jnp.take_along_axis(z_BxG1xD, (lengths_B - w_B)[:, None, None], axis=1)[:, 0], cache

  def window(self, state: HeadState, seq_BxN, lengths_B, gamma: int):
    """The pass over positions w .. w + gamma (w = max(L - gamma, 0)) with the true features:
    (logits [B, V] for the token after seq[L], the predicted f_L [B, Df], cache)."""
    z_BxD, cache = self.window_state(state, seq_BxN, lengths_B, gamma)
    # The output layers (and `full_vocab`'s gather over V) run on the one position used only.
    feat_Bx1xDf, logits_Bx1xVd = head_lib.outputs(self.params, self.config, z_BxD[:, None],
                                                  self.packed)
    return self.full_vocab(logits_Bx1xVd[:, 0]), feat_Bx1xDf[:, 0], cache

  def propose(self, state: HeadState, seq_BxN, lengths_B, keys_B, gamma: int,
              sampling: sampling_lib.Sampling, *, stop, limit_B) -> Proposal:
    if self.parallel:
      return self.propose_parallel(state, seq_BxN, lengths_B, keys_B, gamma, sampling,
                                   stop=stop, limit_B=limit_B)
    logits_BxV, feat_BxDf, cache = self.window(state, seq_BxN, lengths_B, gamma)

    def advance(carry, x_B, k):
      cache, feat_BxDf, nan = carry
      feat_Bx1xDf, logits_Bx1xVd, cache = self._block_d(state, cache, x_B[:, None],
                                                        feat_BxDf[:, None], lengths_B + 1 + k)
      # NaN is looked for over the V_d drafted ids: full_vocab adds only -inf.
      return ((cache, feat_Bx1xDf[:, 0], nan | jnp.isnan(logits_Bx1xVd).any()),
              *protocol.views(self.full_vocab(logits_Bx1xVd[:, 0]), sampling))

    draw = protocol.noise_draw(keys_B, gamma, sampling)
    q_BxV, view_BxV = protocol.views(logits_BxV, sampling)
    prop = protocol.rollout(advance, (cache, feat_BxDf, jnp.isnan(logits_BxV).any()), q_BxV,
                            draw, gamma=gamma, stop=stop, limit_B=limit_B, view_BxV=view_BxV)
    cache, _, nan = prop.state
    return prop.replace(q_BxGxV=jnp.where(nan, jnp.nan, prop.q_BxGxV),
                        state=state.replace(cache=cache))

  def propose_parallel(self, state: HeadState, seq_BxN, lengths_B, keys_B, gamma: int,
                       sampling: sampling_lib.Sampling, *, stop, limit_B) -> Proposal:
    """The whole block from the window's one pass: q for draft k is the output layer on the
    k-th parallel state (head_lib.parallel_step), which depends on the verified prefix and, with
    parallel_tokens, on drafts 1 .. k - 1 -- a valid draft law, verified by the usual exact rule."""
    depth = self.config.parallel_depth + 1
    if gamma > depth:
      raise ValueError(f'feature head parallel=1: gamma={gamma} exceeds the {depth} drafts one '
                       f'pass of this head makes (head.parallel_depth={depth - 1})')
    z_BxD, cache = self.window_state(state, seq_BxN, lengths_B, gamma)
    draw = protocol.noise_draw(keys_B, gamma, sampling)
    if self.config.parallel_tokens:  # draft k feeds the state of draft k + 1
      s_BxD, tokens, logits, qs, views = z_BxD, [], [], [], []
      for k in range(gamma):
        if k:
          s_BxD = head_lib.parallel_step(self.params, self.config, s_BxD, z_BxD, k - 1,
                                         self.target_embed_VxDf[tokens[-1]])
        logits.append(self.full_vocab(
            head_lib.outputs(self.params, self.config, s_BxD[:, None], self.packed)[1][:, 0]))
        q_BxV, view_BxV = protocol.views(logits[-1], sampling)  # each step's q, made once
        qs.append(q_BxV)
        views.append(view_BxV)
        tokens.append(draw(k, q_BxV))
      logits_BxGxV, tokens_BxG = jnp.stack(logits, 1), jnp.stack(tokens, 1)
      q_BxGxV, view_BxGxV = jnp.stack(qs, 1), jnp.stack(views, 1)
    else:
      states_BxGxD = head_lib.parallel_states(self.params, self.config, z_BxD, gamma)
      logits_BxGxV = self.full_vocab(
          head_lib.outputs(self.params, self.config, states_BxGxD, self.packed)[1])
      q_BxGxV, view_BxGxV = protocol.views(logits_BxGxV, sampling)
      tokens_BxG = jnp.stack([draw(k, q_BxGxV[:, k]) for k in range(gamma)], axis=1)
    n_B = protocol.cut(stop, tokens_BxG, q_BxGxV, limit_B, view_BxGxV)
    q_BxGxV = jnp.where(jnp.isnan(logits_BxGxV).any(), jnp.nan, q_BxGxV)
    return Proposal(protocol.pad_after(tokens_BxG, n_B), q_BxGxV, n_B, jnp.int32(1),
                    state.replace(cache=cache))

  def feed_children(self, state: HeadState, caches_K, feats_KxBxDf, tokens_BxC, branch: int,
                    pos_B):
    """Each of C = K * branch children fed on a copy of its parent's cache, with its parent's
    predicted feature: (logits [B, C, V], their predicted features [C, B, Df], caches [C])."""
    parent_C = jnp.arange(tokens_BxC.shape[1]) // branch
    caches_C = jax.tree.map(lambda x: x[parent_C], caches_K)
    feed = lambda c, tok_B, f_BxDf: self._block(state, c, tok_B[:, None], f_BxDf[:, None], pos_B)
    feat_CxBx1xDf, logits_CxBx1xV, caches_C = jax.vmap(feed)(caches_C, tokens_BxC.T,
                                                            feats_KxBxDf[parent_C])
    return jnp.swapaxes(logits_CxBx1xV[:, :, 0], 0, 1), feat_CxBx1xDf[:, :, 0], caches_C

  def propose_tree(self, state: HeadState, seq_BxN, lengths_B, keys_B, shape: TreeShape,
                   sampling) -> TreeProposal:
    """The tree of `shape` from the head's own predictions (module docstring)."""
    if self.parallel:
      raise ValueError('feature head parallel=1 drafts chains; a tree expands level by level '
                       '(drop parallel=1 for tree=)')
    b = seq_BxN.shape[0]
    logits_BxV, feat_BxDf, cache = self.window(state, seq_BxN, lengths_B, shape.depth)
    logits_BxKxV, feats_KxBxDf = logits_BxV[:, None], feat_BxDf[None]
    caches_K = jax.tree.map(lambda x: x[None], cache)
    tokens, qs, confs = [take_at(seq_BxN, lengths_B)[:, None]], [], []
    nan = jnp.isnan(logits_BxV).any()
    for d, branch in enumerate(shape.branching):
      tok_BxKxb, q_BxKxbxV = candidates_lib.draw_children(
          logits_BxKxV, candidates_lib.level_keys(keys_B, d), branch, sampling, self.candidates)
      tokens.append(tok_BxKxb.reshape(b, shape.level_size[d + 1]))
      qs.append(q_BxKxbxV.reshape(b, shape.level_size[d + 1], -1))
      confs.append(candidates_lib.confidence(logits_BxKxV, tok_BxKxb).reshape(b, -1))
      if d + 1 < shape.depth:  # the children are internal: feed them for their own children
        logits_BxKxV, feats_KxBxDf, caches_K = self.feed_children(
            state, caches_K, feats_KxBxDf, tokens[-1], branch, lengths_B + 1 + d)
        nan = nan | jnp.isnan(logits_BxKxV).any()
    q_BxMxV = jnp.concatenate(qs, axis=1)
    return TreeProposal(tokens_BxM1=jnp.concatenate(tokens, axis=1),
                        q_BxMxV=jnp.where(nan, jnp.nan, q_BxMxV),
                        passes=jnp.int32(shape.depth), state=state.replace(cache=cache),
                        conf_BxM=jnp.concatenate(confs, axis=1))

  def commit_tree(self, state: HeadState, seq_BxN, lengths_B, *, start_B, path_BxD1,
                  features: TargetFeatures) -> HeadState:
    """The accepted path's target features (the cache needs nothing: the next window rewrites
    every position since this proposal's)."""
    del start_B, path_BxD1
    return self.commit(state, seq_BxN, lengths_B, features=features)
