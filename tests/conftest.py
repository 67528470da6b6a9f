"""Shared pytest fixtures.

Environment first (before jax/transformers are imported anywhere): CPU JAX, no hub network.
Heavy imports (torch, transformers) happen inside the fixtures, so tests that do not use them
do not pay for them.
"""

import os

os.environ['HF_HUB_OFFLINE'] = '1'
os.environ['TRANSFORMERS_OFFLINE'] = '1'
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


# ------------------------------------------------------------------------ tiny HF T5 checkpoints

# Deliberately awkward sizes: heads * d_kv != d_model, more decoder than encoder layers, and
# max_distance below the long-sequence test lengths (~40) so the log buckets saturate.
T5_ORIGINAL_KW = dict(vocab_size=96, d_model=32, d_kv=8, num_heads=6, d_ff=64, num_layers=2,
                      num_decoder_layers=3, relative_attention_num_buckets=32,
                      relative_attention_max_distance=20, feed_forward_proj='relu')
T5_V11_KW = dict(vocab_size=80, d_model=32, d_kv=8, num_heads=5, d_ff=64, num_layers=2,
                 num_decoder_layers=3, relative_attention_num_buckets=8,
                 relative_attention_max_distance=24, feed_forward_proj='gated-gelu',
                 tie_word_embeddings=False)


def _quiet_transformers():
  import transformers
  transformers.logging.set_verbosity_error()
  transformers.logging.disable_progress_bar()


def _spread_out_(model, seed):
  """Re-initialises every parameter so that bugs show in the logits.

  HF's default init has all norm weights == 1 (a missing norm multiply goes unnoticed), tiny
  relative biases and near-uniform attention. Here: norm weights U(0.5, 1.5), relative-attention
  tables N(0, 1), embeddings N(0, 1), every Linear N(0, 1/fan_in) (activations stay O(1), so
  attention is neither uniform nor one-hot), and the logits spread over many tokens.
  """
  import torch
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():  # tied parameters are listed once
      if name.endswith('layer_norm.weight'):
        p.copy_(0.5 + torch.rand(p.shape, generator=gen))
      elif 'relative_attention_bias' in name or name == 'shared.weight':
        p.copy_(torch.randn(p.shape, generator=gen))
      else:
        p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)


def _build_and_save(directory, kw, seed, untie):
  import torch
  from safetensors import safe_open
  from transformers import T5Config, T5ForConditionalGeneration
  _quiet_transformers()
  config = T5Config(dropout_rate=0.0, **kw)
  model = T5ForConditionalGeneration(config).eval()
  _spread_out_(model, seed)
  if untie:
    gen = torch.Generator().manual_seed(seed + 1)
    head = torch.randn(model.lm_head.weight.shape, generator=gen) / config.d_model ** 0.5
    model.lm_head.weight = torch.nn.Parameter(head)
  model.save_pretrained(directory)
  with safe_open(os.path.join(directory, 'model.safetensors'), 'pt') as f:
    keys = set(f.keys())
  assert ('lm_head.weight' in keys) == untie, sorted(keys)
  return model


@pytest.fixture(scope='session')
def hf_t5_original(tmp_path_factory):
  """Path of a tiny original-T5 checkpoint (ReLU, tied head, logits scaled by d_model**-0.5).

  transformers 5 saves only `shared.weight` (no lm_head.weight, no embed_tokens aliases) and
  writes config.json with tie_word_embeddings=true, scale_decoder_outputs=true.
  """
  directory = tmp_path_factory.mktemp('hf_t5_original')
  _build_and_save(directory, T5_ORIGINAL_KW, seed=1, untie=False)
  return directory


@pytest.fixture(scope='session')
def hf_t5_v11(tmp_path_factory):
  """Path of a tiny T5 v1.1 checkpoint (gated-GELU, untied lm_head, unscaled logits).

  What transformers 5.x does (checked here on every run): T5Config turns tie_word_embeddings=False
  into scale_decoder_outputs=False and then forces tie_word_embeddings=True, so the freshly built
  model has lm_head.weight *is* shared.weight. Assigning a new nn.Parameter to lm_head unties it;
  save_pretrained then writes a distinct `lm_head.weight` (it only dedups shared storage) while
  config.json still says tie_word_embeddings=true (with scale_decoder_outputs=false).
  from_pretrained sees both tensors differ, warns and does NOT tie them — asserted below, so the
  reloaded model really uses the new head. Loaders must therefore decide tying from the tensors.
  """
  import json

  import torch
  from transformers import T5ForConditionalGeneration
  directory = tmp_path_factory.mktemp('hf_t5_v11')
  model = _build_and_save(directory, T5_V11_KW, seed=2, untie=True)
  hf = json.loads((directory / 'config.json').read_text())
  assert hf['scale_decoder_outputs'] is False, hf
  reloaded = T5ForConditionalGeneration.from_pretrained(directory).eval()
  assert reloaded.lm_head.weight.data_ptr() != reloaded.shared.weight.data_ptr()
  assert torch.equal(reloaded.lm_head.weight, model.lm_head.weight)
  assert not torch.equal(reloaded.lm_head.weight, reloaded.shared.weight)
  assert reloaded.config.scale_decoder_outputs is False
  return directory
