"""FeatureHeadDraft: drafting from the target's own features (EAGLE-style) for T5.

Shape legend: B batch, S source, N decoder-sequence buffer, T cache length, G gamma (block
width), G1 = G + 1, V vocab, D the head's width, Df the target's d_model.

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
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding import protocol
from specjax.decoding import sampling as sampling_lib
from specjax.decoding.protocol import Proposal, TargetFeatures
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

  reads_target = True  # protocol: the loop passes the target's cache and features

  @classmethod
  def for_target(cls, target: T5Model, head) -> 'FeatureHeadDraft':
    """`head`: a head directory (save_head's files) or (params, HeadConfig)."""
    if isinstance(head, (str, bytes)) or hasattr(head, '__fspath__'):
      params, config = head_lib.load_head(head, dtype=target.dtype)
    else:
      params, config = head
    config.check_target(target.config)
    params = jax.tree.map(lambda p: jnp.asarray(p).astype(target.dtype), params)
    return cls(params=params, target_embed_VxDf=target.params['shared'], config=config)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def init(self, input_ids_BxS, max_len: int, *, target_cache) -> HeadState:
    del input_ids_BxS
    b = target_cache.enc_mask.shape[0]
    dtype = self.params['in_proj'].dtype
    prev = jnp.zeros((b, max_len + 1, self.config.feature_dim), dtype)
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

  def _block(self, state: HeadState, cache, tokens_BxK, features_BxKxDf, lengths_B):
    return head_lib.block(self.params, self.config, cache, self.target_embed_VxDf, state.cross_k,
                          state.cross_v, state.enc_mask, tokens_BxK, features_BxKxDf, lengths_B)

  def decode(self, state: HeadState, tokens_BxK, lengths_B):
    """One head pass over K tokens per row at offsets lengths_B, reading the stored features
    prev[lengths .. lengths + K - 1]: (logits [B, K, V], state). The cost of one draft step
    (what `runner.metrics.measure_c` times)."""
    feats = _rows(state.prev_BxNxDf, lengths_B, tokens_BxK.shape[1])
    _, logits, cache = self._block(state, state.cache, tokens_BxK, feats, lengths_B)
    return logits, state.replace(cache=cache)

  def step_noise(self, gumbel_BxGxV, i):
    return protocol.step_noise(gumbel_BxGxV, i)

  def propose(self, state: HeadState, seq_BxN, lengths_B, keys_B, gamma: int,
              sampling: sampling_lib.Sampling, *, stop, limit_B) -> Proposal:
    g1 = gamma + 1
    w_B = jnp.maximum(lengths_B - gamma, 0)
    feat_BxG1xDf, logits_BxG1xV, cache = self._block(
        state, state.cache, _rows(seq_BxN, w_B, g1), _rows(state.prev_BxNxDf, w_B, g1), w_B)
    at_B = (lengths_B - w_B)[:, None, None]
    logits_BxV = jnp.take_along_axis(logits_BxG1xV, at_B, axis=1)[:, 0]
    feat_BxDf = jnp.take_along_axis(feat_BxG1xDf, at_B, axis=1)[:, 0]

    def advance(carry, x_B, k):
      cache, feat_BxDf, nan = carry
      feat_Bx1xDf, logits_Bx1xV, cache = self._block(state, cache, x_B[:, None],
                                                     feat_BxDf[:, None], lengths_B + 1 + k)
      return ((cache, feat_Bx1xDf[:, 0], nan | jnp.isnan(logits_Bx1xV).any()),
              *protocol.views(logits_Bx1xV[:, 0], sampling))

    draw = protocol.gumbel_draw(keys_B, gamma, self.vocab_size, sampling, self.step_noise)
    q_BxV, view_BxV = protocol.views(logits_BxV, sampling)
    prop = protocol.rollout(advance, (cache, feat_BxDf, jnp.isnan(logits_BxV).any()), q_BxV,
                            draw, gamma=gamma, stop=stop, limit_B=limit_B, view_BxV=view_BxV)
    cache, _, nan = prop.state
    return prop.replace(q_BxGxV=jnp.where(nan, jnp.nan, prop.q_BxGxV),
                        state=state.replace(cache=cache))
