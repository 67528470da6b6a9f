"""specjax: exact speculative decoding for T5 encoder-decoder models in JAX."""

from specjax.decoding import acceptance, protocol, stopping
from specjax.decoding.drafts import (BigramDraft, ModelDraft, PromptLookupDraft, UnigramDraft,
                                     fit_bigram, fit_unigram, load_ngram, save_ngram)
from specjax.decoding.loop import (DecodeOutput, SpecStats, autoregressive_decode,
                                   speculative_decode)
from specjax.decoding.protocol import Draft, Proposal
from specjax.decoding.sampling import Sampling
from specjax.models.checkpoints import load_t5, load_tokenizer, save_t5
from specjax.models.t5 import DecoderCache, T5Config, T5Model, init_params

__all__ = [
    'BigramDraft', 'PromptLookupDraft', 'UnigramDraft', 'fit_bigram', 'fit_unigram', 'load_ngram',
    'save_ngram',
    'DecodeOutput', 'DecoderCache', 'Draft', 'ModelDraft', 'Proposal', 'Sampling', 'SpecStats',
    'T5Config', 'T5Model', 'acceptance', 'autoregressive_decode', 'init_params', 'load_t5',
    'load_tokenizer', 'protocol', 'save_t5', 'speculative_decode', 'stopping',
]
