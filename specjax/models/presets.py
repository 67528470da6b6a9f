"""Architectures of the public T5 checkpoints, for sizing (model table, memory plan, benchmarks).

Loading a checkpoint reads its own config.json; these presets only describe the public models so
that sizes can be computed without downloading anything. Values are those of the checkpoints'
config.json files on the Hugging Face hub.
"""

from __future__ import annotations

from specjax.models.t5 import T5Config

_VOCAB = 32128


def _original(d_model, d_ff, d_kv, heads, layers):
  return T5Config(vocab_size=_VOCAB, d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=layers,
                  num_decoder_layers=layers, num_heads=heads, gated=False,
                  tie_word_embeddings=True, scale_logits=True)


def _v11(d_model, d_ff, d_kv, heads, layers):
  return T5Config(vocab_size=_VOCAB, d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=layers,
                  num_decoder_layers=layers, num_heads=heads, gated=True,
                  tie_word_embeddings=False, scale_logits=False)


PRESETS: dict[str, T5Config] = {
    't5-small': _original(512, 2048, 64, 8, 6),
    't5-base': _original(768, 3072, 64, 12, 12),
    't5-large': _original(1024, 4096, 64, 16, 24),
    't5-3b': _original(1024, 16384, 128, 32, 24),
    't5-11b': _original(1024, 65536, 128, 128, 24),
    'google/t5-v1_1-small': _v11(512, 1024, 64, 6, 8),
    'google/t5-v1_1-base': _v11(768, 2048, 64, 12, 12),
    'google/t5-v1_1-large': _v11(1024, 2816, 64, 16, 24),
    'google/t5-v1_1-xl': _v11(2048, 5120, 64, 32, 24),
    'google/t5-v1_1-xxl': _v11(4096, 10240, 64, 64, 24),
}


def preset(name: str) -> T5Config:
  """The config of a public checkpoint by hub id (with or without the 'google/' prefix)."""
  for key in (name, 'google/' + name):
    if key in PRESETS:
      return PRESETS[key]
  raise ValueError(f'unknown T5 preset {name!r}; known: {", ".join(PRESETS)}')
