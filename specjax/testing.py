"""Tiny models for tests and smoke runs: T5 presets, spread-out initialisation, stub target and draft.

Shape legend: B batch, S source length, K tokens fed per step, G gamma, V vocab.

One place for what tests and `experiments/` smoke modes used to rebuild by hand:
  tiny_config / tiny_t5     a tiny JAX T5 of either family (any T5Config field overridable)
  spread_params / add_noise spread-out logits for greedy tests; a draft as its target plus noise
  write_random_pair         a random target + noisy-copy draft saved as checkpoint directories
  HF_ORIGINAL_KW / HF_V11_KW, spread_out_torch_, save_hf_t5
                            tiny transformers checkpoints (torch imported only when called)
  StubConfig / StubTarget / StubDraft
                            context-free models with known distributions (closed-form alpha)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.decoding import protocol
from specjax.decoding import sampling as sampling_lib
from specjax.models.t5 import T5Config, T5Model, init_params

# ----------------------------------------------------------------------------- JAX T5s

FAMILIES = {
    'original': dict(gated=False, tie_word_embeddings=True, scale_logits=True),  # ReLU, tied head
    'v11': dict(gated=True, tie_word_embeddings=False, scale_logits=False),      # gated-GELU, untied
}
TINY = dict(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=2,
            num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=16)


def tiny_config(family: str = 'original', **overrides) -> T5Config:
  """A tiny T5Config of `family` ('original' or 'v11'); `overrides` set any other field."""
  return T5Config(**{**TINY, **FAMILIES[family], **overrides})


def tiny_t5(config: T5Config, seed: int = 0, scale: float = 1.0, dtype=jnp.float32) -> T5Model:
  """Random params (init_params, widened by `scale`) for `config`."""
  return T5Model(params=init_params(config, jax.random.PRNGKey(seed), dtype, scale=scale),
                 config=config)


def spread_params(params, seed: int, *, emb=None, final_norm: float = 1.0, rel_bias: float = 3.0):
  """Spread-out logits and position-dependent outputs (random greedy T5s otherwise loop at once)."""
  params = dict(params)
  if emb is not None:
    # Small embeddings so the tied head does not just copy the input token forever.
    params['shared'] = params['shared'] / jnp.std(params['shared']) * emb
  for i, part in enumerate(('encoder', 'decoder')):
    stack = dict(params[part])
    key = jax.random.fold_in(jax.random.PRNGKey(seed), 100 + i)
    stack['rel_bias'] = rel_bias * jax.random.normal(key, stack['rel_bias'].shape)
    if part == 'decoder':
      stack['final_norm'] = stack['final_norm'] * final_norm
    params[part] = stack
  return params


def spread_pair(noise: float = 0.3, seed: int = 1) -> tuple[T5Model, T5Model]:
  """(target, draft): the tiny original-family T5 with spread-out logits whose greedy output
  varies (no instant loops), and its copy with weight noise as the draft."""
  target = tiny_t5(tiny_config('original'), seed=seed, scale=4.0)
  target = target.replace(params=spread_params(target.params, seed, emb=0.5, final_norm=8.0))
  return target, add_noise(target, noise, seed)


def add_noise(model: T5Model, eps: float, seed: int) -> T5Model:
  """The model with eps * std(w) Gaussian noise on every matrix (norm vectors kept)."""
  leaves, treedef = jax.tree.flatten(model.params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  noisy = [w + eps * jnp.std(w) * jax.random.normal(k, w.shape, w.dtype) if w.ndim >= 2 else w
           for w, k in zip(leaves, keys)]
  return model.replace(params=jax.tree.unflatten(treedef, noisy))


def write_random_pair(directory, tokenizer, *, noise: float = 0.02, **overrides):
  """A random v1.1-layout target and its noisy copy as draft, saved (with `tokenizer`) under
  directory/target and directory/draft; returns the two paths."""
  from specjax.models.checkpoints import save_t5  # pylint: disable=import-outside-toplevel
  kw = dict(vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=1,
            num_decoder_layers=2, num_heads=4, gated=True, tie_word_embeddings=False,
            scale_logits=False)
  cfg = T5Config(**{**kw, **overrides})
  params = init_params(cfg, jax.random.PRNGKey(0))
  noisy = jax.tree.map(lambda x: x + noise * jax.random.normal(jax.random.PRNGKey(1), x.shape),
                       params)
  target, draft = os.path.join(directory, 'target'), os.path.join(directory, 'draft')
  save_t5(T5Model(params, cfg), target, tokenizer)
  save_t5(T5Model(noisy, cfg), draft, tokenizer)
  return target, draft


# ----------------------------------------------------------------------------- transformers T5s

# Deliberately awkward sizes: heads * d_kv != d_model, more decoder than encoder layers, and
# max_distance below the long-sequence test lengths (~40) so the log buckets saturate.
HF_ORIGINAL_KW = dict(vocab_size=96, d_model=32, d_kv=8, num_heads=6, d_ff=64, num_layers=2,
                      num_decoder_layers=3, relative_attention_num_buckets=32,
                      relative_attention_max_distance=20, feed_forward_proj='relu')
HF_V11_KW = dict(vocab_size=80, d_model=32, d_kv=8, num_heads=5, d_ff=64, num_layers=2,
                 num_decoder_layers=3, relative_attention_num_buckets=8,
                 relative_attention_max_distance=24, feed_forward_proj='gated-gelu',
                 tie_word_embeddings=False)


def quiet_transformers():
  import transformers  # pylint: disable=import-outside-toplevel
  transformers.logging.set_verbosity_error()
  transformers.logging.disable_progress_bar()


def spread_out_torch_(model, seed: int):
  """Re-initialises every parameter of a transformers T5 so that bugs show in the logits.

  HF's default init has all norm weights == 1 (a missing norm multiply goes unnoticed), tiny
  relative biases and near-uniform attention. Here: norm weights U(0.5, 1.5), relative-attention
  tables N(0, 1), embeddings N(0, 1), every Linear N(0, 1/fan_in) (activations stay O(1), so
  attention is neither uniform nor one-hot), and the logits spread over many tokens.
  """
  import torch  # pylint: disable=import-outside-toplevel
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():  # tied parameters are listed once
      if name.endswith('layer_norm.weight'):
        p.copy_(0.5 + torch.rand(p.shape, generator=gen))
      elif 'relative_attention_bias' in name or name == 'shared.weight':
        p.copy_(torch.randn(p.shape, generator=gen))
      else:
        p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)


def untie_head_(model, seed: int):
  """A distinct random lm_head Parameter (transformers 5 ties on construction; this unties)."""
  import torch  # pylint: disable=import-outside-toplevel
  gen = torch.Generator().manual_seed(seed)
  head = torch.randn(model.lm_head.weight.shape, generator=gen) / model.config.d_model ** 0.5
  model.lm_head.weight = torch.nn.Parameter(head)


def save_hf_t5(directory, kw: dict, seed: int, untie: bool, **config_kw):
  """A spread-out transformers T5 of `kw` (HF config fields) saved to `directory`; returns it."""
  from transformers import T5Config as HFT5Config  # pylint: disable=import-outside-toplevel
  from transformers import T5ForConditionalGeneration  # pylint: disable=import-outside-toplevel
  quiet_transformers()
  model = T5ForConditionalGeneration(HFT5Config(dropout_rate=0.0, **config_kw, **kw)).eval()
  spread_out_torch_(model, seed)
  if untie:
    untie_head_(model, seed + 1)
  model.save_pretrained(directory)
  return model


# ----------------------------------------------------------------------------- stub models


@dataclasses.dataclass(frozen=True)
class StubConfig:
  vocab_size: int
  pad_token_id: int = 0
  eos_token_id: int = 1
  decoder_start_token_id: int = 0


def stub_logits(p_V):
  """log p with -1e9 for zeros (float32)."""
  p_V = np.asarray(p_V, np.float64)
  return jnp.asarray(np.where(p_V > 0, np.log(np.where(p_V > 0, p_V, 1.0)), -1e9), jnp.float32)


@struct.dataclass
class StubTarget:
  """A target whose next-token logits are `logits_V` whatever the context."""
  logits_V: jax.Array
  config: StubConfig = struct.field(pytree_node=False)

  def init_cache(self, input_ids_BxS, max_len):
    del max_len
    return jnp.zeros((input_ids_BxS.shape[0],), jnp.int32)

  def decode(self, cache, tokens_BxK, lengths_B):
    del lengths_B
    b, k = tokens_BxK.shape
    return jnp.broadcast_to(self.logits_V, (b, k, self.logits_V.shape[0])), cache


@struct.dataclass
class StubDraft:
  """A draft proposing i.i.d. tokens from probs(logits_V, sampling), whatever the context."""
  logits_V: jax.Array

  @property
  def vocab_size(self) -> int:
    return self.logits_V.shape[0]

  def init(self, input_ids_BxS, max_len):
    del max_len
    return jnp.zeros((input_ids_BxS.shape[0],), jnp.int32)

  def commit(self, state, seq_BxN, lengths_B):
    del seq_BxN, lengths_B
    return state

  def propose(self, state, seq_BxN, lengths_B, keys_B, gamma, sampling, *, stop, limit_B):
    del lengths_B
    b, v = seq_BxN.shape[0], self.logits_V.shape[0]
    q_BxGxV = jnp.broadcast_to(sampling_lib.probs(self.logits_V, sampling), (b, gamma, v))
    keys_BxG = jax.vmap(lambda k: jax.random.split(k, gamma))(keys_B)
    draft_BxG = jax.vmap(jax.vmap(sampling_lib.sample))(keys_BxG, q_BxGxV)
    n_B = protocol.cut(stop, draft_BxG, q_BxGxV, limit_B)
    # passes: as many as a token-by-token draft would make (one per slot of the longest row).
    return protocol.Proposal(protocol.pad_after(draft_BxG, n_B), q_BxGxV, n_B, jnp.max(n_B), state)


def stub_pair(p_V, q_V):
  """(StubTarget with law p_V, StubDraft with law q_V) over len(p_V) tokens."""
  return StubTarget(stub_logits(p_V), StubConfig(len(p_V))), StubDraft(stub_logits(q_V))


@struct.dataclass
class DraftWrapper:
  """Delegates the draft protocol to `inner`; a fault-injecting draft overrides `propose` only."""
  inner: Any

  @property
  def vocab_size(self) -> int:
    return self.inner.vocab_size

  def init(self, input_ids_BxS, max_len):
    return self.inner.init(input_ids_BxS, max_len)

  def commit(self, state, seq_BxN, lengths_B):
    return self.inner.commit(state, seq_BxN, lengths_B)

  def propose(self, state, seq_BxN, lengths_B, keys_B, gamma, sampling, *, stop, limit_B):
    return self.inner.propose(state, seq_BxN, lengths_B, keys_B, gamma, sampling, stop=stop,
                              limit_B=limit_B)
