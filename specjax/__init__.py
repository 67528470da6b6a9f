"""specjax: exact speculative decoding for T5 encoder-decoder models in JAX."""

from specjax.checkpoints import load_t5, load_tokenizer, save_t5
from specjax.decoding import DecodeOutput, SpecStats, autoregressive_decode, speculative_decode
from specjax.drafts import ModelDraft
from specjax.sampling import Sampling
from specjax.t5 import DecoderCache, T5Config, T5Model, init_params

__all__ = [
    'DecodeOutput', 'DecoderCache', 'ModelDraft', 'Sampling', 'SpecStats', 'T5Config', 'T5Model',
    'autoregressive_decode', 'init_params', 'load_t5', 'load_tokenizer', 'save_t5',
    'speculative_decode',
]
