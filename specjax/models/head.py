"""A draft head that reads the target's own features (EAGLE-style) for a T5 encoder-decoder.

Shape legend: B batch, S source length, K positions fed per call, T cache length, D the head's
width, Df the target's d_model (its feature size), H / Dk the head's self-attention heads,
Hc / Dkc the target's heads (cross-attention), F the head's d_ff, V vocab, NB buckets.

The head is one T5 decoder block (pre-norm, relative-position self-attention, gated-GELU FFN)
that runs beside the target's decoder. At decoder position j it reads

  f_{j-1}  the target's final decoder hidden state at position j-1 (what the target's head turns
           into p_{j-1}), or its own prediction of it beyond the verified prefix; a learned
           `start_feature` stands in for f_{-1} at position 0
  y_j      the decoder input token at position j, through the target's (frozen) embedding

and returns its prediction of f_j (fed to the next step) and logits for y_{j+1} through its own
narrow output head (the target's 512-wide head would cost more than the whole head).
Cross-attention reads the source through the *target's* last-layer cross-attention keys/values,
already in the target's cache: the head runs no encoder and projects nothing per source.

Params (weights [in, out]):
  start_feature [Df]
  in_proj       [2 Df, D]        [f_{j-1}; embed(y_j)] -> the block's input
  rel_bias      [NB, H]
  self_norm, self_q/k/v [D, H Dk], self_o [H Dk, D]
  cross_norm, cross_q [D, Hc Dkc], cross_o [Hc Dkc, D]
  ffn_norm, wi_0 / wi_1 [D, F], wo [F, D]
  final_norm    [D]
  feat_out      [D, Df]          predicted f_j
  lm_head       [D, V]           logits for y_{j+1}
  par_in [P, D (+ Df), Fp], par_out [P, Fp, D]   parallel mode only (P = parallel_depth > 0):
                 residual blocks that turn the state at position j into the states whose logits
                 are q for y_{j+2} .. y_{j+P+1}: Medusa-style per-position heads on one pass, or
                 with parallel_tokens a chain that also reads each drafted token (Hydra-style)

Files: `save_head` writes head_config.json + head.safetensors (a few MB); the target is loaded
separately (its embedding and cross K/V are read, never copied). An optional vocab.json
(`save_vocab`) ranks the target's token ids by their frequency in the head's training targets;
`truncate` keeps the lm_head columns of the V_d most frequent ones (a truncated draft vocabulary,
FR-Spec / EAGLE-3 style, derived without retraining: specjax.decoding.feature_head).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.models import cpu_kernels, t5

Params = dict[str, Any]
CONFIG_NAME = 'head_config.json'
WEIGHTS_NAME = 'head.safetensors'
VOCAB_NAME = 'vocab.json'


@dataclasses.dataclass(frozen=True)
class HeadConfig:
  """Architecture of a feature head for one target (hashable: a static jit argument)."""
  vocab_size: int
  feature_dim: int          # the target's d_model
  cross_heads: int          # the target's num_heads
  cross_d_kv: int           # the target's d_kv
  d_model: int = 128
  num_heads: int = 2
  d_kv: int = 64
  d_ff: int = 512
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  feature_taps: tuple[int, ...] = ()  # target decoder layers fused beside the final state
  parallel_depth: int = 0   # P: output blocks for drafts 2 .. P + 1 from one pass (parallel mode)
  parallel_ff: int = 256    # their hidden width
  parallel_tokens: bool = False  # block k also reads draft k (a chain, Hydra-style), not z only

  def __post_init__(self):
    object.__setattr__(self, 'feature_taps', tuple(int(i) for i in self.feature_taps))

  @property
  def input_dim(self) -> int:
    """Width of the features the head reads and predicts: the final state, then each tap."""
    return self.feature_dim * (1 + len(self.feature_taps))

  @classmethod
  def for_target(cls, target_config: t5.T5Config, **kw) -> 'HeadConfig':
    return cls(vocab_size=target_config.vocab_size, feature_dim=target_config.d_model,
               cross_heads=target_config.num_heads, cross_d_kv=target_config.d_kv,
               relative_attention_num_buckets=target_config.relative_attention_num_buckets,
               relative_attention_max_distance=target_config.relative_attention_max_distance,
               **kw)

  def check_target(self, target_config: t5.T5Config) -> None:
    """A ValueError naming the first field where this head does not fit the target."""
    want = {'vocab_size': target_config.vocab_size, 'feature_dim': target_config.d_model,
            'cross_heads': target_config.num_heads, 'cross_d_kv': target_config.d_kv}
    for name, value in want.items():
      if getattr(self, name) != value:
        raise ValueError(f'feature head {name}={getattr(self, name)} does not fit the target '
                         f'({value}): the head was trained for another target')
    t5.check_taps(target_config, self.feature_taps)


def init_head_params(config: HeadConfig, key, dtype=jnp.float32) -> Params:
  """Random params (T5's init scheme); the start feature starts at zero."""
  d, hd, hc, f = config.d_model, config.num_heads * config.d_kv, (
      config.cross_heads * config.cross_d_kv), config.d_ff
  df, di, v = config.feature_dim, config.input_dim, config.vocab_size
  keys = iter(jax.random.split(key, 16))

  def normal(shape, std):
    return (std * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)

  return {
      'start_feature': jnp.zeros((di,), dtype),
      'in_proj': normal((di + df, d), (di + df) ** -0.5),
      'rel_bias': normal((config.relative_attention_num_buckets, config.num_heads), d ** -0.5),
      'self_norm': jnp.ones((d,), dtype),
      'self_q': normal((d, hd), (d * config.d_kv) ** -0.5), 'self_k': normal((d, hd), d ** -0.5),
      'self_v': normal((d, hd), d ** -0.5), 'self_o': normal((hd, d), hd ** -0.5),
      'cross_norm': jnp.ones((d,), dtype),
      'cross_q': normal((d, hc), (d * config.cross_d_kv) ** -0.5),
      'cross_o': normal((hc, d), hc ** -0.5),
      'ffn_norm': jnp.ones((d,), dtype),
      'wi_0': normal((d, f), d ** -0.5), 'wi_1': normal((d, f), d ** -0.5),
      'wo': normal((f, d), f ** -0.5),
      'final_norm': jnp.ones((d,), dtype),
      'feat_out': normal((d, di), d ** -0.5),
      'lm_head': normal((d, v), d ** -0.5),
      **parallel_params(config, normal, dtype),
  }


def parallel_params(config: HeadConfig, normal, dtype) -> Params:
  """The parallel mode's P residual blocks; par_out starts at zero, so every depth starts out
  predicting what depth 1 predicts. Empty for a head without them (P = 0)."""
  p, d, f = config.parallel_depth, config.d_model, config.parallel_ff
  if not p:
    return {}
  din = d + (config.feature_dim if config.parallel_tokens else 0)
  return {'par_in': normal((p, din, f), din ** -0.5), 'par_out': jnp.zeros((p, f, d), dtype)}


def parallel_step(params: Params, config: HeadConfig, s_xD, z_xD, k: int, token_emb_xDf=None):
  """The state whose logits (`outputs`) are q for draft k + 2 of a block, from block k (0-based):
  z + silu(z W_in_k) W_out_k (Medusa: every depth reads the window pass's state z), or with
  parallel_tokens s + silu([s; embed(d_{k+1})] W_in_k) W_out_k (a chain through the previous
  state s and the draft just drawn, Hydra-style: q then follows the drafts, which matters at
  T > 0). Either way no head pass: one small MLP per draft."""
  w_in, w_out = params['par_in'][k], params['par_out'][k]
  base = s_xD if config.parallel_tokens else z_xD
  x = jnp.concatenate([s_xD, token_emb_xDf.astype(s_xD.dtype)], -1) if (
      config.parallel_tokens) else z_xD
  return base + jax.nn.silu(x @ w_in.astype(x.dtype)) @ w_out.astype(x.dtype)


def parallel_states(params: Params, config: HeadConfig, z_BxD, depth: int):
  """[B, depth, D]: z, then `parallel_step`'s states for drafts 2 .. depth (a head without
  parallel_tokens: they read z alone, so the whole block's states come at once)."""
  states = [z_BxD]
  for k in range(depth - 1):
    states.append(parallel_step(params, config, states[-1], z_BxD, k))
  return jnp.stack(states, axis=1)


def param_count(config: HeadConfig) -> int:
  shapes = jax.eval_shape(lambda: init_head_params(config, jax.random.PRNGKey(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


@struct.dataclass
class HeadCache:
  """The head's self-attention keys/values [B, H, T, Dk] (head-major, as the target's caches),
  valid below each row's length."""
  self_k: jax.Array
  self_v: jax.Array

  @property
  def max_len(self) -> int:
    return self.self_k.shape[2]


def init_cache(config: HeadConfig, batch: int, max_len: int, dtype=jnp.float32) -> HeadCache:
  z = jnp.zeros((batch, config.num_heads, max_len, config.d_kv), dtype)
  return HeadCache(self_k=z, self_v=z)


def block(params: Params, config: HeadConfig, cache: HeadCache, target_embed_VxDf,
          cross_k_BxHcxSxDkc, cross_v_BxHcxSxDkc, enc_mask_BxS, tokens_BxK, features_BxKxDf,
          lengths_B, fast: Params | None = None):
  """Feeds K positions per row at offsets lengths_B (written into the cache there).

  features_BxKxDf[:, i] is f_{j-1} for position j = lengths + i. Returns (predicted f_j
  [B, K, Df] in the params dtype, float32 logits for y_{j+1} [B, K, V], cache). Position i sees
  the cache below lengths + i + 1 (the committed prefix and the block up to itself). `fast`:
  `pack_head`'s weights, when the head runs on the CPU kernels (as the target's decode steps do).
  """
  z, cache = block_state(params, config, cache, target_embed_VxDf, cross_k_BxHcxSxDkc,
                         cross_v_BxHcxSxDkc, enc_mask_BxS, tokens_BxK, features_BxKxDf,
                         lengths_B, fast)
  feat_BxKxDf, logits = outputs(params, config, z, fast)
  return feat_BxKxDf, logits, cache


def block_state(params: Params, config: HeadConfig, cache: HeadCache, target_embed_VxDf,
                cross_k_BxHcxSxDkc, cross_v_BxHcxSxDkc, enc_mask_BxS, tokens_BxK,
                features_BxKxDf, lengths_B, fast: Params | None = None):
  """`block` up to its final norm: (the state z [B, K, D] the output layers read, cache)."""
  eps = config.layer_norm_epsilon
  b, k = tokens_BxK.shape
  t = cache.max_len
  dtype = params['in_proj'].dtype
  emb_BxKxDf = t5.embed(target_embed_VxDf, tokens_BxK, fast).astype(dtype)
  feats = fused_input(features_BxKxDf.astype(dtype), config)
  x = t5.dense(jnp.concatenate([feats, emb_BxKxDf], -1), params, fast, 'in_proj')
  lengths_B = lengths_B.astype(jnp.int32)
  q_pos_BxK = lengths_B[:, None] + jnp.arange(k, dtype=jnp.int32)[None, :]
  k_pos_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  bias = t5.position_bias(params['rel_bias'], q_pos_BxK, k_pos_BxT, bidirectional=False,
                          config=config)
  visible_BxKxT = k_pos_BxT[:, None, :] <= q_pos_BxK[:, :, None]
  bias = bias + jnp.where(visible_BxKxT[:, None], 0.0, t5.NEG_INF)
  h = t5.rms_norm(x, params['self_norm'], eps)
  heads = lambda y: t5.split_heads(y, config.num_heads, config.d_kv)  # noqa: E731
  q, k_new, v_new = t5.fast_split(h, params, fast, 'self_qkv',
                                   ('self_q', 'self_k', 'self_v'))
  ck = t5.write_rows(cache.self_k, heads(k_new), lengths_B)
  cv = t5.write_rows(cache.self_v, heads(v_new), lengths_B)
  x = x + t5.dense(t5.attend_fast(q, ck, cv, bias, config, fast), params, fast, 'self_o')
  h = t5.rms_norm(x, params['cross_norm'], eps)
  q = t5.dense(h, params, fast, 'cross_q')
  cross_bias = jnp.where(enc_mask_BxS[:, None, None, :], 0.0, t5.NEG_INF).astype(jnp.float32)
  cross = _CrossHeads(config.cross_heads, config.cross_d_kv)
  x = x + t5.dense(t5.attend_fast(q, cross_k_BxHcxSxDkc.astype(dtype),
                                  cross_v_BxHcxSxDkc.astype(dtype), cross_bias, cross, fast),
                   params, fast, 'cross_o')
  h = t5.rms_norm(x, params['ffn_norm'], eps)
  a, g = t5.fast_split(h, params, fast, 'wi', ('wi_0', 'wi_1'))
  x = x + t5.dense(jax.nn.gelu(a, approximate=True) * g, params, fast, 'wo')
  return t5.rms_norm(x, params['final_norm'], eps), HeadCache(self_k=ck, self_v=cv)


def outputs(params: Params, config: HeadConfig, z_BxKxD, fast: Params | None = None):
  """(predicted features [B, K, Di] in the params dtype, float32 logits [B, K, V]) from z."""
  if fast is not None and t5.kernel_rows(z_BxKxD) <= cpu_kernels.MAX_ROWS:
    # Predicted feature and logits in one product (the kernel's output is float32).
    out = cpu_kernels.matmul(z_BxKxD, fast['out'])
    return (out[..., :config.input_dim].astype(params['feat_out'].dtype),
            out[..., config.input_dim:])
  logits = jnp.einsum('bkd,dv->bkv', z_BxKxD, params['lm_head'],
                      preferred_element_type=jnp.float32)
  return z_BxKxD @ params['feat_out'], logits


def fused_input(features_BxKxDi, config: HeadConfig):
  """The features as in_proj reads them. The target's final state arrives RMS-normalised (its
  final norm); a tapped layer's residual stream does not, and its scale grows with depth, so
  each tap is RMS-normalised here without a gain (in_proj learns the scales)."""
  if not config.feature_taps:
    return features_BxKxDi
  df, n = config.feature_dim, len(config.feature_taps)
  final, taps = features_BxKxDi[..., :df], features_BxKxDi[..., df:]
  t = taps.reshape(taps.shape[:-1] + (n, df)).astype(jnp.float32)
  t = t * jax.lax.rsqrt(jnp.mean(jnp.square(t), -1, keepdims=True) + config.layer_norm_epsilon)
  return jnp.concatenate([final, t.reshape(taps.shape).astype(final.dtype)], -1)


@dataclasses.dataclass(frozen=True)
class _CrossHeads:
  """The target's head layout, as `t5.attend_fast` reads it for the cross-attention."""
  num_heads: int
  d_kv: int


# The head's products as the CPU kernels make them: q/k/v side by side, the gated FFN's two inputs
# side by side, and the feature and token outputs in one matrix, so a pass makes 8 products.
PACKED_GROUPS = {'in_proj': ('in_proj',), 'self_qkv': ('self_q', 'self_k', 'self_v'),
                 'self_o': ('self_o',), 'cross_q': ('cross_q',), 'cross_o': ('cross_o',),
                 'wi': ('wi_0', 'wi_1'), 'wo': ('wo',), 'out': ('feat_out', 'lm_head')}


def pack_head(params: Params, weights: str = 'float32') -> Params:
  """The head's matrices in the CPU kernels' layout (cpu_kernels.pack), grouped as PACKED_GROUPS.
  Its passes then run like the target's packed decode steps instead of as ~10 separate XLA dots,
  which cost more per call than the head's arithmetic."""
  return {g: cpu_kernels.pack(jnp.concatenate([params[n] for n in names], 1), weights)
          for g, names in PACKED_GROUPS.items()}


def quantize_head(params: Params, weights: str) -> Params:
  """params with every packed matrix replaced by the values `pack_head(params, weights)` stores
  (cpu_kernels.quantize; per output column of the grouped matrix for int8), so the XLA path and
  the kernels compute the same head. 'float32' changes nothing."""
  if weights == 'float32':
    return params
  out = dict(params)
  for names in PACKED_GROUPS.values():
    w = jnp.concatenate([params[n] for n in names], 1)
    stored, scale = cpu_kernels.quantize(w, weights)
    wq = (stored.astype(jnp.float32) * scale).astype(w.dtype)
    edges = np.cumsum([params[n].shape[1] for n in names])[:-1]
    out.update(zip(names, jnp.split(wq, edges, axis=1)))
  return out


def teacher_forced(params: Params, config: HeadConfig, target_embed_VxDf, cross_k, cross_v,
                   enc_mask_BxS, tokens_BxT, prev_features_BxTxDf):
  """The head over whole decoder inputs at once (training): predicted f_j and logits for y_{j+1}
  at every position j, given f_{j-1} per position (prev_features)."""
  z = teacher_forced_state(params, config, target_embed_VxDf, cross_k, cross_v, enc_mask_BxS,
                           tokens_BxT, prev_features_BxTxDf)
  return outputs(params, config, z)


def teacher_forced_state(params: Params, config: HeadConfig, target_embed_VxDf, cross_k, cross_v,
                         enc_mask_BxS, tokens_BxT, prev_features_BxTxDf):
  """`teacher_forced` up to the final norm: the state z [B, T, D] at every position."""
  b, t = tokens_BxT.shape
  cache = init_cache(config, b, t, params['in_proj'].dtype)
  z, _ = block_state(params, config, cache, target_embed_VxDf, cross_k, cross_v, enc_mask_BxS,
                     tokens_BxT, prev_features_BxTxDf, jnp.zeros((b,), jnp.int32))
  return z


def shift_features(params: Params, features_BxTxDf):
  """[start_feature, f_0 .. f_{T-2}]: the f_{j-1} each position j reads."""
  b = features_BxTxDf.shape[0]
  start = jnp.broadcast_to(params['start_feature'].astype(features_BxTxDf.dtype),
                           (b, 1, features_BxTxDf.shape[-1]))
  return jnp.concatenate([start, features_BxTxDf[:, :-1]], axis=1)


# ----------------------------------------------------------------------------- files


def save_head(params: Params, config: HeadConfig, directory, dtype=None) -> Path:
  """head_config.json + head.safetensors, written atomically into `directory`."""
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  directory = Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  flat = {k: np.asarray(jax.device_get(v)) for k, v in params.items()}
  if dtype is not None:
    flat = {k: v.astype(dtype) for k, v in flat.items()}
  tmp = directory / f'.{WEIGHTS_NAME}.tmp{os.getpid()}'
  save_file(flat, str(tmp))
  os.chmod(tmp, 0o644)  # safetensors creates it 0600
  os.replace(tmp, directory / WEIGHTS_NAME)
  tmp = directory / f'.{CONFIG_NAME}.tmp{os.getpid()}'
  tmp.write_text(json.dumps(dataclasses.asdict(config), indent=2, sort_keys=True) + '\n')
  os.replace(tmp, directory / CONFIG_NAME)
  return directory


def load_head(directory, dtype=jnp.float32) -> tuple[Params, HeadConfig]:
  """(params, config) from save_head's files; a one-line ValueError naming the file otherwise."""
  directory = Path(directory)
  cfg_file, weights = directory / CONFIG_NAME, directory / WEIGHTS_NAME
  for f in (cfg_file, weights):
    if not f.is_file():
      raise ValueError(f'feature head: {f} not found (a head directory holds {CONFIG_NAME} and '
                       f'{WEIGHTS_NAME}, written by specjax.models.head.save_head)')
  try:  # a head saved before feature_taps existed reads only the final state, as before
    config = HeadConfig(**json.loads(cfg_file.read_text()))
  except (TypeError, ValueError) as e:
    raise ValueError(f'feature head: {cfg_file} is not a head config ({e})') from None
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
  try:
    flat = load_file(str(weights))
  except Exception as e:  # pylint: disable=broad-except  # safetensors raises its own types
    raise ValueError(f'feature head: corrupt {weights} ({str(e).splitlines()[0]})') from None
  want = jax.eval_shape(lambda: init_head_params(config, jax.random.PRNGKey(0)))
  for name, sd in want.items():
    if name not in flat:
      raise ValueError(f'feature head: tensor {name!r} missing in {weights}')
    if tuple(flat[name].shape) != tuple(sd.shape):
      raise ValueError(f'feature head: tensor {name!r} in {weights} has shape '
                       f'{tuple(flat[name].shape)}, expected {tuple(sd.shape)}')
  extra = sorted(set(flat) - set(want))
  if extra:
    raise ValueError(f'feature head: unknown tensor {extra[0]!r} in {weights}')
  return {k: jnp.asarray(flat[k].astype(np.float32)).astype(dtype) for k in want}, config


# ----------------------------------------------------------------------------- draft vocabulary


def token_order(token_lists, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
  """(order [V], counts [V]): every id in [0, V) by descending count in `token_lists` (ties broken
  by lower id first) and its count. Ids outside [0, V) are ignored."""
  ids = np.concatenate([np.asarray(t, np.int64).ravel() for t in token_lists] or [np.zeros(0)])
  ids = ids[(ids >= 0) & (ids < vocab_size)].astype(np.int64)
  counts = np.bincount(ids, minlength=vocab_size)
  order = np.lexsort((np.arange(vocab_size), -counts))  # last key first: count, then id
  return order.astype(np.int32), counts[order].astype(np.int64)


def save_vocab(directory, order, counts, counted_on: str) -> Path:
  """vocab.json beside a head: {"order": ids most frequent first, "counts": theirs, "counted_on":
  what was counted}; `keep_ids` reads it."""
  directory = Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  text = json.dumps({'counted_on': counted_on, 'order': [int(i) for i in order],
                     'counts': [int(c) for c in counts]}, separators=(',', ':'))
  tmp = directory / f'.{VOCAB_NAME}.tmp{os.getpid()}'
  tmp.write_text(text + '\n')
  os.replace(tmp, directory / VOCAB_NAME)
  return directory / VOCAB_NAME


def keep_ids(directory, draft_vocab: int, vocab_size: int) -> np.ndarray:
  """The `draft_vocab` most frequent ids (int32, sorted ascending) from a head directory's
  vocab.json; a one-line ValueError naming the file or the option otherwise."""
  path = Path(directory) / VOCAB_NAME
  if not isinstance(draft_vocab, (int, np.integer)) or not 1 <= draft_vocab <= vocab_size:
    raise ValueError(f'feature head: vocab={draft_vocab!r} must be an integer in [1, '
                     f'{vocab_size}] (the target vocabulary)')
  if not path.is_file():
    raise ValueError(f'feature head: vocab={draft_vocab} needs {path} (the token ranking '
                     f'written by specjax.models.head.save_vocab), not found')
  try:
    order = np.asarray(json.loads(path.read_text())['order'])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f'feature head: {path} is not a token ranking ({type(e).__name__}: '
                     f'{str(e).splitlines()[0] if str(e) else "no order"})') from None
  if (order.ndim != 1 or order.dtype.kind not in 'iu' or len(order) < draft_vocab
      or len(np.unique(order)) != len(order) or order.min(initial=0) < 0
      or order.max(initial=0) >= vocab_size):
    raise ValueError(f'feature head: {path} field "order" must list distinct ids in '
                     f'[0, {vocab_size}), at least {draft_vocab} of them')
  return np.sort(order[:draft_vocab]).astype(np.int32)


def truncate(params: Params, keep_ids_Vd) -> Params:
  """The head's params with lm_head [D, V] cut to the columns of the kept ids, [D, V_d] (the
  softmax then renormalises over the kept set)."""
  return dict(params, lm_head=jnp.asarray(params['lm_head'])[:, jnp.asarray(keep_ids_Vd)])
