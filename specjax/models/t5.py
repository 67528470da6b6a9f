"""T5 encoder-decoder as pure functions of an explicit params pytree and cache pytree.

Shape legend: B batch, S source length, K tokens in a decoder block (1 for plain decoding, gamma+1
for verification), T cache length, D d_model, H heads, Dk d_kv, F d_ff, V vocab, NB buckets.

One implementation serves both families, chosen by the checkpoint's config:
  * original T5 (t5-small ... t5-11b): ReLU FFN, lm_head tied to the embedding, decoder output
    scaled by d_model**-0.5 before the head;
  * T5 v1.1 (google/t5-v1_1-*): gated-GELU (tanh approximation) FFN, untied lm_head, no scaling.

Params (weights stored [in, out], i.e. transposed from PyTorch's Linear):
  shared [V, D]
  encoder: rel_bias [NB, H], final_norm [D],
           layers[i]: attn_norm [D], q/k/v [D, H*Dk], o [H*Dk, D], ffn_norm [D],
                      wi [D, F] (relu) or wi_0, wi_1 [D, F] (gated), wo [F, D]
  decoder: rel_bias [NB, H], final_norm [D],
           layers[i]: self_norm, self_q/k/v/o, cross_norm, cross_q/k/v/o, ffn_norm, wi.., wo
  lm_head [D, V]  (only when untied)

Decoding uses per-row lengths: a block of K tokens for row b is written at cache positions
lengths[b] .. lengths[b]+K-1. Rolling back is calling with a smaller length: entries past a row's
length are masked out and overwritten later. The caller sizes the cache (`max_len`) so that
lengths + K <= max_len always holds (XLA's dynamic_update_slice would clamp silently otherwise).

Caches are head-major ([B, H, T, Dk]) so that attention reads them without a per-step transpose.
On CPU, a model may carry its decoder weights a second time in the packed layout of
`specjax.models.cpu_kernels` (`T5Model.pack`): decode steps of up to MAX_ROWS token rows then stream
each weight once, whatever the block length (one fused matmul for q/k/v, one for the FFN's input).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specjax.models import cpu_kernels
from specjax.programs import typed_jit

Params = dict[str, Any]

NEG_INF = -1e30  # additive mask in float32; finite so that fully masked rows stay NaN-free


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Architecture of one T5 model (hashable, so it can be a static jit argument)."""

  vocab_size: int
  d_model: int
  d_kv: int
  d_ff: int
  num_layers: int
  num_decoder_layers: int
  num_heads: int
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  gated: bool = False  # v1.1: gated-GELU FFN; original: ReLU
  tie_word_embeddings: bool = True  # lm_head is shared.T
  scale_logits: bool = True  # multiply decoder output by d_model**-0.5 before the head
  pad_token_id: int = 0
  eos_token_id: int = 1
  decoder_start_token_id: int = 0

  def __post_init__(self):
    for name in ('vocab_size', 'd_model', 'd_kv', 'd_ff', 'num_layers', 'num_decoder_layers',
                 'num_heads', 'relative_attention_num_buckets', 'relative_attention_max_distance'):
      if int(getattr(self, name)) <= 0:
        raise ValueError(f'T5Config.{name} must be positive, got {getattr(self, name)!r}')

  @classmethod
  def from_hf(cls, hf: dict[str, Any]) -> 'T5Config':
    """Reads a Hugging Face T5 config.json dict (transformers 4 or 5 conventions)."""
    proj = hf.get('feed_forward_proj', 'relu')
    act = proj.split('-')
    gated = act[0] == 'gated'
    act_fn = act[-1]
    if act_fn not in ('relu', 'gelu', 'gelu_new', 'gelu_pytorch_tanh') or len(act) > 2 or (
        len(act) == 2 and not gated):
      raise ValueError(f'config.json: feed_forward_proj={proj!r} is not supported '
                       "(expected 'relu' or 'gated-gelu')")
    if not gated and act_fn != 'relu':
      raise ValueError(f'config.json: feed_forward_proj={proj!r} is not supported '
                       "(expected 'relu' or 'gated-gelu')")
    tie = hf.get('tie_word_embeddings', True) is not False
    # transformers 5 writes `scale_decoder_outputs`; older configs signal it with tie_word_embeddings.
    scale = hf.get('scale_decoder_outputs', tie)
    eos = hf.get('eos_token_id', 1)
    if isinstance(eos, (list, tuple)):
      eos = eos[0]
    num_layers = hf.get('num_layers', 6)
    start = hf.get('decoder_start_token_id')
    pad = hf.get('pad_token_id')
    return cls(
        vocab_size=int(hf.get('vocab_size', 32128)),
        d_model=int(hf.get('d_model', 512)),
        d_kv=int(hf.get('d_kv', 64)),
        d_ff=int(hf.get('d_ff', 2048)),
        num_layers=int(num_layers),
        num_decoder_layers=int(hf.get('num_decoder_layers') or num_layers),
        num_heads=int(hf.get('num_heads', 8)),
        relative_attention_num_buckets=int(hf.get('relative_attention_num_buckets', 32)),
        relative_attention_max_distance=int(hf.get('relative_attention_max_distance', 128)),
        layer_norm_epsilon=float(hf.get('layer_norm_epsilon', 1e-6)),
        gated=gated,
        tie_word_embeddings=tie,
        scale_logits=bool(scale),
        pad_token_id=0 if pad is None else int(pad),
        eos_token_id=1 if eos is None else int(eos),
        decoder_start_token_id=0 if start is None else int(start),
    )

  def to_hf(self) -> dict[str, Any]:
    """The config.json dict transformers' T5ForConditionalGeneration reads."""
    return {
        'architectures': ['T5ForConditionalGeneration'],
        'model_type': 't5',
        'vocab_size': self.vocab_size,
        'd_model': self.d_model,
        'd_kv': self.d_kv,
        'd_ff': self.d_ff,
        'num_layers': self.num_layers,
        'num_decoder_layers': self.num_decoder_layers,
        'num_heads': self.num_heads,
        'relative_attention_num_buckets': self.relative_attention_num_buckets,
        'relative_attention_max_distance': self.relative_attention_max_distance,
        'layer_norm_epsilon': self.layer_norm_epsilon,
        'feed_forward_proj': 'gated-gelu' if self.gated else 'relu',
        'tie_word_embeddings': self.tie_word_embeddings,
        'scale_decoder_outputs': self.scale_logits,
        'pad_token_id': self.pad_token_id,
        'eos_token_id': self.eos_token_id,
        'decoder_start_token_id': self.decoder_start_token_id,
        'is_encoder_decoder': True,
        'dropout_rate': 0.0,
    }

  @property
  def inner_dim(self) -> int:
    return self.num_heads * self.d_kv


# ----------------------------------------------------------------------------- building blocks


def rms_norm(x, w, eps):
  """T5's LayerNorm: no mean subtraction, no bias; statistics in float32."""
  x32 = x.astype(jnp.float32)
  var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
  return (x32 * jax.lax.rsqrt(var + eps)).astype(w.dtype) * w


@struct.dataclass
class Dropout:
  """Training-time dropout (rate, key), as T5: on the embeddings, inside the FFN, on every
  sublayer's output before the residual add and on the stacks' outputs. Inference passes None."""
  key: jax.Array
  rate: float = struct.field(pytree_node=False, default=0.1)

  def __call__(self, x, site: int):
    keep = jax.random.bernoulli(jax.random.fold_in(self.key, site), 1.0 - self.rate, x.shape)
    return jnp.where(keep, x / (1.0 - self.rate), 0).astype(x.dtype)


def _drop(dropout, x, site: int):
  return x if dropout is None else dropout(x, site)


def relative_position_bucket(rel, *, bidirectional: bool, num_buckets: int, max_distance: int):
  """T5's bucketing of (key position - query position), as in Mesh TensorFlow and transformers."""
  buckets = jnp.zeros_like(rel)
  if bidirectional:
    num_buckets //= 2
    buckets = buckets + (rel > 0).astype(rel.dtype) * num_buckets
    n = jnp.abs(rel)
  else:
    n = -jnp.minimum(rel, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  # float32 like the reference implementation; n >= max_exact >= 1 wherever the value is used.
  nf = jnp.maximum(n, 1).astype(jnp.float32)
  large = max_exact + (jnp.log(nf / max_exact) / math.log(max_distance / max_exact) *
                       (num_buckets - max_exact)).astype(rel.dtype)
  large = jnp.minimum(large, num_buckets - 1)
  return buckets + jnp.where(is_small, n, large)


def position_bias(table_NBxH, q_pos_BxQ, k_pos_BxT, *, bidirectional, config: T5Config):
  """Additive attention bias [B, H, Q, T] from per-row query/key positions."""
  rel = k_pos_BxT[:, None, :] - q_pos_BxQ[:, :, None]
  bucket = relative_position_bucket(
      rel, bidirectional=bidirectional, num_buckets=config.relative_attention_num_buckets,
      max_distance=config.relative_attention_max_distance)
  bias_BxQxTxH = table_NBxH.astype(jnp.float32)[bucket]
  return jnp.transpose(bias_BxQxTxH, (0, 3, 1, 2))


def split_heads(x_BxLxHDk, heads: int, d_kv: int):
  """[B, L, H*Dk] -> head-major [B, H, L, Dk] (the layout of the caches and of `attend`)."""
  b, l, _ = x_BxLxHDk.shape
  return x_BxLxHDk.reshape(b, l, heads, d_kv).transpose(0, 2, 1, 3)


def _heads(x_BxLxHDk, config):
  return split_heads(x_BxLxHDk, config.num_heads, config.d_kv)


def attend(q_BxHxQxDk, k_BxHxTxDk, v_BxHxTxDk, bias_BxHxQxT):
  """T5 attention: no 1/sqrt(d) scaling, float32 scores and softmax. Returns [B, Q, H*Dk].

  Head-major operands: XLA:CPU then runs both products without transposing K or V (with
  [B, T, H, Dk] caches it copied every layer's K and V each step, ~17% of a decode step)."""
  scores = jnp.einsum('bhqd,bhtd->bhqt', q_BxHxQxDk, k_BxHxTxDk,
                      preferred_element_type=jnp.float32) + bias_BxHxQxT
  weights = jax.nn.softmax(scores, axis=-1).astype(v_BxHxTxDk.dtype)
  out = jnp.einsum('bhqt,bhtd->bqhd', weights, v_BxHxTxDk)
  b, q, h, d = out.shape
  return out.reshape(b, q, h * d)


def attend_fast(q_BxQxHDk, k_BxHxTxDk, v_BxHxTxDk, bias_xHxQxT, config: T5Config, fast):
  """`attend` for a decode step: the CPU kernel (query rows as the projection returns them, one
  call for all heads) when the model runs packed and the cache is float32, else XLA."""
  if (fast is not None and k_BxHxTxDk.dtype == jnp.float32
      and kernel_rows(q_BxQxHDk) <= cpu_kernels.MAX_ROWS):
    b, q, _ = q_BxQxHDk.shape
    q_BxQxHxDk = q_BxQxHDk.reshape(b, q, config.num_heads, config.d_kv)
    return cpu_kernels.attention(q_BxQxHxDk, k_BxHxTxDk, v_BxHxTxDk, bias_xHxQxT)
  return attend(_heads(q_BxQxHDk, config), k_BxHxTxDk, v_BxHxTxDk, bias_xHxQxT)


def dense(x_xI, layer: Params, fast: Params | None, name: str, rows_B=None):
  """x @ layer[name], through the packed CPU kernel when the model carries packed weights and the
  block is small (cpu_kernels.MAX_ROWS rows), else XLA's dot on the canonical weight. `rows_B`
  (x [B, S, I]): the kernel skips rows s >= rows_B[b] (padding; they come out zero)."""
  if fast is not None and name in fast and kernel_rows(x_xI) <= cpu_kernels.MAX_ROWS:
    return cpu_kernels.matmul(x_xI, fast[name], rows_B).astype(x_xI.dtype)
  return x_xI @ layer[name]


def embed(table_VxD, ids, packed):
  """table[ids]: on the CPU kernels' path (`packed` weights) and for a block of 2 .. MAX_ROWS
  rows one copy per row (cpu_kernels.take_rows), where XLA splits its gather over its thread pool
  (a one-row gather it runs inline)."""
  if (packed is not None and 1 < ids.size <= cpu_kernels.MAX_ROWS
      and cpu_kernels.small_ops('take_rows')):
    return cpu_kernels.take_rows(table_VxD, ids)
  return table_VxD[ids]


def kernel_rows(x) -> int:
  """The token rows a product of x makes (all leading dims): the kernels take up to MAX_ROWS."""
  return math.prod(x.shape[:-1])


def fast_split(x_xI, layer, fast, fused: str, names: tuple[str, ...], rows_B=None):
  """The products x @ layer[n] for n in names: one fused packed matmul (`fast[fused]`, the
  weights side by side) on the kernel path, separate dots otherwise."""
  if fast is not None and fused in fast and kernel_rows(x_xI) <= cpu_kernels.MAX_ROWS:
    return jnp.split(dense(x_xI, layer, fast, fused, rows_B), len(names), axis=-1)
  return [x_xI @ layer[n] for n in names]


def feed_forward(layer, x, config: T5Config, dropout=None, site: int = 0, fast=None, rows_B=None):
  if config.gated:
    a, b = fast_split(x, layer, fast, 'wi', ('wi_0', 'wi_1'), rows_B)
    h = jax.nn.gelu(a, approximate=True) * b
  else:
    h = jax.nn.relu(dense(x, layer, fast, 'wi', rows_B))
  return dense(_drop(dropout, h, site), layer, fast, 'wo', rows_B)


def source_rows(mask_BxS):
  """Per source, 1 + its last unmasked position (0 if none): the rows the encoder's products
  need on the kernel path (past them are only pads, masked out of every attention)."""
  s = mask_BxS.shape[1]
  return jnp.max(jnp.where(mask_BxS, jnp.arange(1, s + 1, dtype=jnp.int32), 0), axis=1)


# ----------------------------------------------------------------------------- encoder


def encode(params: Params, config: T5Config, input_ids_BxS, dropout: Dropout | None = None,
           packed: Params | None = None):
  """Encoder output [B, S, D] (params dtype) and its key mask [B, S] (pad id masked).
  `packed` (`pack_model`): the same weights in the CPU kernels' layout."""
  enc = params['encoder']
  mask_BxS = input_ids_BxS != config.pad_token_id
  x = _drop(dropout, embed(params['shared'], input_ids_BxS, packed), 0)
  b, s = input_ids_BxS.shape
  pos_BxS = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
  bias = position_bias(enc['rel_bias'], pos_BxS, pos_BxS, bidirectional=True, config=config)
  bias = bias + jnp.where(mask_BxS[:, None, None, :], 0.0, NEG_INF)
  rows_B = source_rows(mask_BxS)
  for i, layer in enumerate(enc['layers']):
    site = 1 + 3 * i
    fast = None if packed is None else packed['encoder'][i]
    h = rms_norm(x, layer['attn_norm'], config.layer_norm_epsilon)
    q, k, v = fast_split(h, layer, fast, 'qkv', ('q', 'k', 'v'), rows_B)
    att = attend_fast(q, _heads(k, config), _heads(v, config), bias, config, fast)
    x = x + _drop(dropout, dense(att, layer, fast, 'o', rows_B), site)
    h = rms_norm(x, layer['ffn_norm'], config.layer_norm_epsilon)
    x = x + _drop(dropout, feed_forward(layer, h, config, dropout, site + 1, fast, rows_B),
                  site + 2)
  out = rms_norm(x, enc['final_norm'], config.layer_norm_epsilon)
  return _drop(dropout, out, 999), mask_BxS


# ----------------------------------------------------------------------------- decoder cache


@struct.dataclass
class DecoderCache:
  """Decoder state for one batch of sources. Per layer l:

  self_k[l], self_v[l]:   [B, H, T, Dk]  self-attention keys/values, valid below each row's length
  cross_k[l], cross_v[l]: [B, H, S, Dk]  cross-attention keys/values, computed once from the encoder
  enc_mask:               [B, S] bool    source positions that are not padding
  """
  self_k: tuple
  self_v: tuple
  cross_k: tuple
  cross_v: tuple
  enc_mask: jax.Array

  @property
  def max_len(self) -> int:
    return self.self_k[0].shape[2]


def init_cache(params: Params, config: T5Config, input_ids_BxS, max_len: int,
               dropout: Dropout | None = None, packed: Params | None = None) -> DecoderCache:
  """Runs the encoder once and returns an empty decoder cache of `max_len` target positions."""
  enc_BxSxD, mask_BxS = encode(params, config, input_ids_BxS, dropout, packed)
  b = input_ids_BxS.shape[0]
  dtype = params['shared'].dtype
  zeros = jnp.zeros((b, config.num_heads, max_len, config.d_kv), dtype)
  layers = params['decoder']['layers']
  if packed is not None and kernel_rows(enc_BxSxD) <= cpu_kernels.MAX_ROWS:
    # Every layer's cross keys and values in one product (`pack_model`'s 'cross_kv').
    kv = jnp.split(cpu_kernels.matmul(enc_BxSxD, packed['cross_kv'], source_rows(mask_BxS))
                   .astype(enc_BxSxD.dtype), 2 * len(layers), axis=-1)
  else:
    kv = [enc_BxSxD @ layer[n] for layer in layers for n in ('cross_k', 'cross_v')]
  cross_k = [_heads(y, config) for y in kv[0::2]]
  cross_v = [_heads(y, config) for y in kv[1::2]]
  n = config.num_decoder_layers
  return DecoderCache(self_k=(zeros,) * n, self_v=(zeros,) * n, cross_k=tuple(cross_k),
                      cross_v=tuple(cross_v), enc_mask=mask_BxS)


def write_rows(cache_BxHxTxDk, new_BxHxKxDk, lengths_B):
  """Writes each row's block at its own offset (per-row dynamic_update_slice)."""
  def write(c, n, start):
    return jax.lax.dynamic_update_slice(c, n.astype(c.dtype), (0, start, 0))
  return jax.vmap(write)(cache_BxHxTxDk, new_BxHxKxDk, lengths_B)


def output_logits(params: Params, config: T5Config, x_BxKxD, packed: Params | None = None):
  """Final head in float32: tied heads use the embedding (and original T5 scales by d_model**-0.5)."""
  if config.scale_logits:
    x_BxKxD = x_BxKxD * (config.d_model ** -0.5)
  if packed is not None and kernel_rows(x_BxKxD) <= cpu_kernels.MAX_ROWS:
    return cpu_kernels.matmul(x_BxKxD, packed['lm_head'])
  if config.tie_word_embeddings:
    return jnp.einsum('bkd,vd->bkv', x_BxKxD, params['shared'], preferred_element_type=jnp.float32)
  return jnp.einsum('bkd,dv->bkv', x_BxKxD, params['lm_head'], preferred_element_type=jnp.float32)


def decode_hidden(params: Params, config: T5Config, cache: DecoderCache, tokens_BxK, lengths_B,
                  dropout: Dropout | None = None, packed: Params | None = None,
                  taps: tuple[int, ...] = ()):
  """Decoder block without the head: hidden states [B, K, D] and the updated cache. `taps`:
  decoder layers whose output residual streams follow the final state, [B, K, D (1 + #taps)]
  (a feature head's multi-layer fusion; the same pass)."""
  b, k = tokens_BxK.shape
  t = cache.max_len
  lengths_B = lengths_B.astype(jnp.int32)
  q_pos_BxK = lengths_B[:, None] + jnp.arange(k, dtype=jnp.int32)[None, :]
  k_pos_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  self_bias = position_bias(params['decoder']['rel_bias'], q_pos_BxK, k_pos_BxT,
                            bidirectional=False, config=config)
  causal_BxKxT = k_pos_BxT[:, None, :] <= q_pos_BxK[:, :, None]
  self_bias = self_bias + jnp.where(causal_BxKxT[:, None], 0.0, NEG_INF)
  return _decoder_stack(params, config, cache, tokens_BxK, lengths_B, self_bias, dropout, packed,
                        taps)


def _decoder_stack(params: Params, config: T5Config, cache: DecoderCache, tokens_BxK, write_B,
                   self_bias_BxHxKxT, dropout: Dropout | None = None, packed: Params | None = None,
                   taps: tuple[int, ...] = ()):
  """The decoder layers over a block whose keys/values are written at per-row offsets write_B,
  with the given self-attention bias (relative positions plus mask). Hidden [B, K, D], cache.
  `packed` (`pack_model`): the same weights in the CPU kernel's layout. `taps`: as decode_hidden."""
  check_taps(config, taps)
  tapped = {}
  dec = params['decoder']
  cross_bias = jnp.where(cache.enc_mask[:, None, None, :], 0.0, NEG_INF).astype(jnp.float32)
  x = _drop(dropout, embed(params['shared'], tokens_BxK, packed), 1000)
  new_k, new_v = [], []
  eps = config.layer_norm_epsilon
  for i, layer in enumerate(dec['layers']):
    site = 1001 + 4 * i
    fast = None if packed is None else packed['layers'][i]
    h = rms_norm(x, layer['self_norm'], eps)
    q, k, v = fast_split(h, layer, fast, 'self_qkv', ('self_q', 'self_k', 'self_v'))
    ck = write_rows(cache.self_k[i], _heads(k, config), write_B)
    cv = write_rows(cache.self_v[i], _heads(v, config), write_B)
    new_k.append(ck)
    new_v.append(cv)
    att = attend_fast(q, ck, cv, self_bias_BxHxKxT, config, fast)
    x = x + _drop(dropout, dense(att, layer, fast, 'self_o'), site)
    h = rms_norm(x, layer['cross_norm'], eps)
    q = dense(h, layer, fast, 'cross_q')
    att = attend_fast(q, cache.cross_k[i], cache.cross_v[i], cross_bias, config, fast)
    x = x + _drop(dropout, dense(att, layer, fast, 'cross_o'), site + 1)
    h = rms_norm(x, layer['ffn_norm'], eps)
    x = x + _drop(dropout, feed_forward(layer, h, config, dropout, site + 2, fast), site + 3)
    tapped[i] = x
  x = _drop(dropout, rms_norm(x, dec['final_norm'], eps), 1999)
  if taps:
    x = jnp.concatenate([x] + [tapped[i].astype(x.dtype) for i in taps], axis=-1)
  return x, cache.replace(self_k=tuple(new_k), self_v=tuple(new_v))


def check_taps(config: T5Config, taps) -> None:
  """A one-line ValueError unless `taps` are distinct decoder layer indices."""
  taps = tuple(taps)
  if len(set(taps)) != len(taps) or not all(
      isinstance(i, int) and 0 <= i < config.num_decoder_layers for i in taps):
    raise ValueError(f'feature taps {taps}: expected distinct decoder layers in '
                     f'[0, {config.num_decoder_layers})')


# ----------------------------------------------------------------------------- tree blocks
#
# A token tree of M1 nodes (node 0 the root, then the nodes depth by depth) occupies the cache
# slots lengths[b] .. lengths[b] + M1 - 1 of row b, node j at slot lengths[b] + j. Its *position*
# (what the relative-position bias sees) is lengths[b] + depth[j]: every root-to-leaf path reads
# as an ordinary chain continuing the committed prefix. A node attends to the committed prefix
# (slots < lengths[b]) and to its ancestors and itself inside the tree (anc[j, i]), nothing else.
# After verification `gather_path` moves the accepted path into the slots of a chain.


def tree_self_bias(params: Params, config: T5Config, t: int, lengths_B, depth_M1, anc_M1xM1,
                   offset: int, k: int):
  """Self-attention bias [B, H, K, T] of the tree nodes offset .. offset+K-1 as queries against
  all T cache slots: relative positions from depth, the tree mask inside the tree's slots.
  depth [M1] / anc [M1, M1] describe one tree for every row; depth [B, M1] / anc [B, M1, M1] a
  tree per row (a dynamic tree's chosen nodes)."""
  b = lengths_B.shape[0]
  depth_BxM1 = jnp.asarray(depth_M1, jnp.int32)
  anc_BxM1xM1 = jnp.asarray(anc_M1xM1, bool)
  if depth_BxM1.ndim == 1:
    depth_BxM1, anc_BxM1xM1 = depth_BxM1[None], anc_BxM1xM1[None]
  m1 = depth_BxM1.shape[-1]
  depth_BxM1 = jnp.broadcast_to(depth_BxM1, (b, m1))
  anc_BxM1xM1 = jnp.broadcast_to(anc_BxM1xM1, (b, m1, m1))
  slot_T = jnp.arange(t, dtype=jnp.int32)
  node_BxT = slot_T[None, :] - lengths_B[:, None]  # tree node held by each slot (if in range)
  in_tree_BxT = (node_BxT >= 0) & (node_BxT < m1)
  node_BxT = jnp.clip(node_BxT, 0, m1 - 1)
  k_pos_BxT = jnp.where(in_tree_BxT, lengths_B[:, None]
                        + jnp.take_along_axis(depth_BxM1, node_BxT, axis=1), slot_T[None, :])
  q_pos_BxK = lengths_B[:, None] + depth_BxM1[:, offset:offset + k]
  bias = position_bias(params['decoder']['rel_bias'], q_pos_BxK, k_pos_BxT, bidirectional=False,
                       config=config)
  anc_BxKxM1 = anc_BxM1xM1[:, offset:offset + k]
  sees_BxKxT = jnp.take_along_axis(anc_BxKxM1, node_BxT[:, None, :], axis=2)
  sees_BxKxT = jnp.where(in_tree_BxT[:, None, :], sees_BxKxT,
                         (slot_T[None, :] < lengths_B[:, None])[:, None, :])
  return bias + jnp.where(sees_BxKxT[:, None], 0.0, NEG_INF)


def decode_tree(params: Params, config: T5Config, cache: DecoderCache, tokens_BxK, lengths_B,
                depth_M1, anc_M1xM1, offset: int = 0, packed: Params | None = None,
                taps: tuple[int, ...] = ()):
  """Feeds tree nodes offset .. offset+K-1 (tokens_BxK) of the tree rooted at slot lengths_B.

  depth_M1 [M1] int: each node's depth (root 0); anc_M1xM1 [M1, M1] bool: anc[j, i] iff node i is
  node j or one of its ancestors (static numpy arrays; or [B, M1] / [B, M1, M1] arrays, one tree
  per row: a dynamic tree's chosen nodes). The nodes' keys/values go to slots
  lengths_B + offset ..; ancestors of the fed nodes must already be in the cache (fed earlier, or
  in this block). Cross-attention is unchanged. Returns float32 logits [B, K, V] (node j's row
  predicts its children), the nodes' final hidden states [B, K, D] (what a feature head reads; the
  same pass; with `taps`, followed by those layers' outputs as in decode_hidden) and the cache.
  Requires lengths_B + M1 <= cache.max_len.
  """
  lengths_B = jnp.asarray(lengths_B, jnp.int32)
  k = tokens_BxK.shape[1]
  bias = tree_self_bias(params, config, cache.max_len, lengths_B, depth_M1, anc_M1xM1, offset, k)
  x, cache = _decoder_stack(params, config, cache, tokens_BxK, lengths_B + offset, bias,
                            packed=packed, taps=taps)
  return output_logits(params, config, x[..., :config.d_model], packed), x, cache


def gather_path(cache: DecoderCache, lengths_B, path_BxJ) -> DecoderCache:
  """Moves the accepted path into chain slots: slot lengths[b] + j <- slot lengths[b] +
  path[b, j] for j < J (path[b, 0] = 0 the root, path[b, j] >= j, so every read precedes its
  overwrite). Slots past the accepted length hold leftovers, masked by the next call's length."""
  lengths_B = jnp.asarray(lengths_B, jnp.int32)

  def move(c_HxTxDk, start, path_J):
    rows = jnp.take(c_HxTxDk, jnp.clip(start + path_J, 0, c_HxTxDk.shape[1] - 1), axis=1)
    return jax.lax.dynamic_update_slice_in_dim(c_HxTxDk, rows, start, axis=1)

  fix = jax.vmap(move)
  return cache.replace(self_k=tuple(fix(c, lengths_B, path_BxJ) for c in cache.self_k),
                       self_v=tuple(fix(c, lengths_B, path_BxJ) for c in cache.self_v))


def decode(params: Params, config: T5Config, cache: DecoderCache, tokens_BxK, lengths_B,
           packed: Params | None = None):
  """Feeds a block of K tokens per row at per-row offsets `lengths_B`.

  Returns float32 logits [B, K, V] (position j predicts the token after tokens_BxK[:, j]) and the
  cache with the block's keys/values written. Requires lengths_B + K <= cache.max_len.
  """
  x, cache = decode_hidden(params, config, cache, tokens_BxK, lengths_B, packed=packed)
  return output_logits(params, config, x, packed), cache


def decode_features(params: Params, config: T5Config, cache: DecoderCache, tokens_BxK, lengths_B,
                    packed: Params | None = None, taps: tuple[int, ...] = ()):
  """`decode` that also returns the final hidden states [B, K, D] the logits were made from (for
  drafts that read the target's features; the same one pass), with `taps` followed by those
  layers' outputs [B, K, D (1 + #taps)] (decode_hidden)."""
  x, cache = decode_hidden(params, config, cache, tokens_BxK, lengths_B, packed=packed, taps=taps)
  return output_logits(params, config, x[..., :config.d_model], packed), x, cache


def shift_right(labels_BxT, config: T5Config):
  """Decoder inputs for teacher forcing: decoder_start_token_id, then labels[:-1]."""
  start = jnp.full((labels_BxT.shape[0], 1), config.decoder_start_token_id, labels_BxT.dtype)
  return jnp.concatenate([start, labels_BxT[:, :-1]], axis=1)


def teacher_forced_hidden(params: Params, config: T5Config, input_ids_BxS, decoder_input_ids_BxT,
                          dropout: Dropout | None = None):
  """Final decoder hidden states [B, T, D] for a full decoder input (what the head reads)."""
  t = decoder_input_ids_BxT.shape[1]
  cache = init_cache(params, config, input_ids_BxS, t, dropout)
  lengths = jnp.zeros((input_ids_BxS.shape[0],), jnp.int32)
  x, _ = decode_hidden(params, config, cache, decoder_input_ids_BxT, lengths, dropout)
  return x


def teacher_forced_logits(params: Params, config: T5Config, input_ids_BxS, decoder_input_ids_BxT,
                          dropout: Dropout | None = None):
  """Float32 logits [B, T, V] for a full decoder input (the decoder input starts with the start id).
  `dropout` (training only) applies T5's dropout."""
  x = teacher_forced_hidden(params, config, input_ids_BxS, decoder_input_ids_BxT, dropout)
  return output_logits(params, config, x)


# ----------------------------------------------------------------------------- packed weights

DENSE = ('self_q', 'self_k', 'self_v', 'self_o', 'cross_q', 'cross_k', 'cross_v', 'cross_o',
         'q', 'k', 'v', 'o', 'wi', 'wi_0', 'wi_1', 'wo')  # the matrices of both stacks


def quantize_matrices(params: Params, config: T5Config, weights: str) -> Params:
  """Params whose matrices (both stacks) and output head hold the values `weights` stores
  (cpu_kernels.quantize: int8 per output column, or bf16), as float32 in the params' dtype: the
  quantized target, which the packed kernels compute exactly and XLA's path reproduces."""
  if weights == 'float32':
    return params

  def q(w_KxN):
    stored, scale = cpu_kernels.quantize(w_KxN, weights)
    return (stored.astype(jnp.float32) * scale).astype(w_KxN.dtype)

  out = dict(params)
  for stack in ('encoder', 'decoder'):
    layers = [{n: q(w) if n in DENSE else w for n, w in layer.items()}
              for layer in params[stack]['layers']]
    out[stack] = {**params[stack], 'layers': layers}
  if config.tie_word_embeddings:  # the head is the embedding: quantized per vocabulary row
    out['shared'] = q(params['shared'].T).T
  else:
    out['lm_head'] = q(params['lm_head'])
  return out


def bf16_exact(params: Params) -> bool:
  """Whether every matrix and the head hold bfloat16 values (storing them so is exact)."""
  mats = [w for stack in ('encoder', 'decoder') for layer in params[stack]['layers']
          for n, w in layer.items() if n in DENSE]
  mats.append(params.get('lm_head', params['shared']))
  return all(bool(jnp.all(w.astype(jnp.bfloat16).astype(w.dtype) == w)) for w in mats)


def pack_model(params: Params, config: T5Config, weights: str = 'float32') -> Params:
  """The matrices and head in the CPU kernels' layout (cpu_kernels.pack), q/k/v side by side in
  one matrix and the gated FFN's wi_0/wi_1 in another, so a decoder step makes 6 products per
  layer, and every decoder layer's cross-attention keys/values in one matrix (one product per
  source). {'encoder': [{'qkv', 'o', 'wi', 'wo'}], 'cross_kv',
  'layers': [{'self_qkv', 'self_o', 'cross_q', 'cross_o', 'wi', 'wo'}], 'lm_head'}."""
  def ffn(layer):
    return {'wi': jnp.concatenate([layer['wi_0'], layer['wi_1']], 1) if config.gated
                  else layer['wi'], 'wo': layer['wo']}

  def pack_all(mats):
    return {n: cpu_kernels.pack(w, weights) for n, w in mats.items()}

  enc = [pack_all({'qkv': jnp.concatenate([layer['q'], layer['k'], layer['v']], 1),
                   'o': layer['o'], **ffn(layer)}) for layer in params['encoder']['layers']]
  dec_layers = params['decoder']['layers']
  dec = [pack_all({'self_qkv': jnp.concatenate([layer[n] for n in ('self_q', 'self_k', 'self_v')],
                                               1),
                   'self_o': layer['self_o'], 'cross_q': layer['cross_q'],
                   'cross_o': layer['cross_o'], **ffn(layer)}) for layer in dec_layers]
  cross_kv = jnp.concatenate([layer[n] for layer in dec_layers for n in ('cross_k', 'cross_v')],
                             1)
  head = params['shared'].T if config.tie_word_embeddings else params['lm_head']
  return {'encoder': enc, 'cross_kv': cpu_kernels.pack(cross_kv, weights), 'layers': dec,
          'lm_head': cpu_kernels.pack(head, weights)}


# ----------------------------------------------------------------------------- model handle


@struct.dataclass
class T5Model:
  """A T5 model: static config plus a params pytree. A pytree itself, so it can enter jit.

  `packed` (None, or `pack_model`'s pytree): the decoder's weights a second time in the CPU
  kernel's layout, used by decode steps of few token rows (`T5Model.pack`). Everything else
  (encoder, teacher forcing, training, checkpoints) reads `params`."""
  params: Params
  config: T5Config = struct.field(pytree_node=False)
  packed: Params | None = None

  @property
  def dtype(self):
    return self.params['shared'].dtype

  @property
  def weights(self) -> str:
    """What the packed decode weights store ('float32', 'bfloat16', 'int8'), or 'xla'."""
    return 'xla' if self.packed is None else self.packed['lm_head'].weights

  def pack(self, weights: str | None = None) -> 'T5Model':
    """This model with packed decode weights for the CPU kernel (cpu_kernels), if it is built.

    `weights`: the params' own dtype by default ('float32', or 'bfloat16' for a bf16 model);
    'bfloat16' or 'int8' also replace the matrices and head in `params` by their quantized values,
    so every path computes the same (quantized) target; without the kernel only that replacement
    happens. 'bfloat16' changes nothing where the weights are bf16 values already (`bf16_exact`:
    checkpoints saved in bf16, as the shipped pair) and halves the bytes a step streams."""
    if weights is None:
      weights = 'bfloat16' if self.dtype == jnp.bfloat16 else 'float32'
    if weights not in cpu_kernels.WEIGHTS:
      raise ValueError(f'weights={weights!r}: expected one of {cpu_kernels.WEIGHTS}')
    params = quantize_matrices(self.params, self.config, weights)
    packed = pack_model(params, self.config, weights) if cpu_kernels.available() else None
    return T5Model(params=params, config=self.config, packed=packed)

  def unpack(self) -> 'T5Model':
    """This model on XLA's dots (the packed copy dropped; quantized values stay)."""
    return T5Model(params=self.params, config=self.config)


  def logits(self, input_ids, decoder_input_ids):
    return _jit_logits(self, jnp.asarray(input_ids, jnp.int32),
                       jnp.asarray(decoder_input_ids, jnp.int32))

  def encode(self, input_ids):
    return encode(self.params, self.config, input_ids, packed=self.packed)

  def init_cache(self, input_ids, max_len: int) -> DecoderCache:
    return init_cache(self.params, self.config, input_ids, max_len, packed=self.packed)

  def decode(self, cache, tokens, lengths):
    return decode(self.params, self.config, cache, tokens, lengths, self.packed)

  def decode_features(self, cache, tokens, lengths, taps: tuple[int, ...] = ()):
    return decode_features(self.params, self.config, cache, tokens, lengths, self.packed, taps)

  def decode_tree(self, cache, tokens, lengths, depth, anc, offset: int = 0):
    logits, _, cache = decode_tree(self.params, self.config, cache, tokens, lengths, depth, anc,
                                   offset, self.packed)
    return logits, cache

  def decode_tree_features(self, cache, tokens, lengths, depth, anc, offset: int = 0,
                           taps: tuple[int, ...] = ()):
    """decode_tree that also returns the nodes' final hidden states [B, K, D] (one pass)."""
    return decode_tree(self.params, self.config, cache, tokens, lengths, depth, anc, offset,
                       self.packed, taps)

  def astype(self, dtype) -> 'T5Model':
    new = T5Model(params=jax.tree.map(lambda p: p.astype(dtype), self.params), config=self.config)
    return new if self.packed is None else new.pack()


def _replace(self: T5Model, **updates) -> T5Model:
  """dataclasses.replace; new params re-pack a packed copy, which would be stale otherwise."""
  new = dataclasses.replace(self, **updates)
  if 'params' in updates and 'packed' not in updates and self.packed is not None:
    new = new.unpack().pack(self.weights)
  return new


T5Model.replace = _replace  # flax.struct installs its own `replace` after the class body


@typed_jit
def _jit_logits(model: T5Model, input_ids, decoder_input_ids):
  return teacher_forced_logits(model.params, model.config, input_ids, decoder_input_ids)


# ----------------------------------------------------------------------------- init and sizes


def init_params(config: T5Config, key, dtype=jnp.float32, scale: float = 1.0) -> Params:
  """Random params with T5's initialisation scheme; `scale` widens them (tests use spread-out logits)."""
  d, hd, f, v = config.d_model, config.inner_dim, config.d_ff, config.vocab_size
  keys = iter(jax.random.split(key, 4 + 16 * (config.num_layers + config.num_decoder_layers)))

  def normal(shape, std):
    return (scale * std * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)

  def ones(n):
    return jnp.ones((n,), dtype)

  def ffn():
    if config.gated:
      return {'wi_0': normal((d, f), d ** -0.5), 'wi_1': normal((d, f), d ** -0.5),
              'wo': normal((f, d), f ** -0.5)}
    return {'wi': normal((d, f), d ** -0.5), 'wo': normal((f, d), f ** -0.5)}

  def attn(prefix):
    return {prefix + 'q': normal((d, hd), (d * config.d_kv) ** -0.5),
            prefix + 'k': normal((d, hd), d ** -0.5), prefix + 'v': normal((d, hd), d ** -0.5),
            prefix + 'o': normal((hd, d), hd ** -0.5)}

  nb, h = config.relative_attention_num_buckets, config.num_heads
  params = {
      'shared': normal((v, d), 1.0),
      'encoder': {
          'rel_bias': normal((nb, h), d ** -0.5),
          'layers': [{'attn_norm': ones(d), **attn(''),
                      'ffn_norm': ones(d), **ffn()} for _ in range(config.num_layers)],
          'final_norm': ones(d),
      },
      'decoder': {
          'rel_bias': normal((nb, h), d ** -0.5),
          'layers': [{'self_norm': ones(d), **attn('self_'), 'cross_norm': ones(d),
                      **attn('cross_'), 'ffn_norm': ones(d), **ffn()}
                     for _ in range(config.num_decoder_layers)],
          'final_norm': ones(d),
      },
  }
  if not config.tie_word_embeddings:
    params['lm_head'] = normal((d, v), d ** -0.5)
  return params


def param_count(config: T5Config) -> int:
  """Parameter count computed from the config (shapes of init_params, without materialising)."""
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))


def kv_cache_bytes_per_token(config: T5Config, dtype_bytes: int = 2) -> int:
  """Decoder self-attention cache bytes per generated token per row (K and V, all layers)."""
  return 2 * config.num_decoder_layers * config.inner_dim * dtype_bytes
