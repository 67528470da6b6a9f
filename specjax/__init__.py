"""specjax: exact speculative decoding for T5 encoder-decoder models in JAX.

The public names below load on first use (PEP 562), so `import specjax` and the command line's
config checks (`python -m specjax.run` with a bad flag, `--help`) do not pay JAX's ~3 s import:
a bad input fails in well under a second. `from specjax import X` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> module that defines it
_EXPORTS = {
    'acceptance': 'specjax.acceptance',
    'protocol': 'specjax.protocol',
    'stopping': 'specjax.stopping',
    **{name: 'specjax.decoding.drafts' for name in (
        'BigramDraft', 'ModelDraft', 'PromptLookupDraft', 'UnigramDraft', 'fit_bigram',
        'fit_unigram', 'load_ngram', 'save_ngram')},
    **{name: 'specjax.decoding.loop' for name in (
        'DecodeOutput', 'SpecStats', 'autoregressive_decode', 'speculative_decode')},
    'SpecOptions': 'specjax.decoding.options',
    'FeatureHeadDraft': 'specjax.decoding.feature_head',
    'Draft': 'specjax.decoding.protocol',
    'Proposal': 'specjax.decoding.protocol',
    'Sampling': 'specjax.decoding.sampling',
    **{name: 'specjax.models.checkpoints' for name in ('load_t5', 'load_tokenizer', 'save_t5')},
    **{name: 'specjax.models.t5' for name in ('DecoderCache', 'T5Config', 'T5Model',
                                                'init_params')},
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  module = _EXPORTS.get(name)
  if module is None:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  mod = importlib.import_module(module)
  value = mod if module == f'{__name__}.{name}' else getattr(mod, name)
  globals()[name] = value  # later lookups skip __getattr__
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static analysers and IDEs see the eager imports
  from specjax import acceptance, protocol, stopping  # noqa: F401
  from specjax.decoding.feature_head import FeatureHeadDraft  # noqa: F401
  from specjax.decoding.options import SpecOptions  # noqa: F401
  from specjax.decoding.drafts import (BigramDraft, ModelDraft, PromptLookupDraft,  # noqa: F401
                                       UnigramDraft, fit_bigram, fit_unigram, load_ngram,
                                       save_ngram)
  from specjax.decoding.loop import (DecodeOutput, SpecStats,  # noqa: F401
                                     autoregressive_decode, speculative_decode)
  from specjax.decoding.protocol import Draft, Proposal  # noqa: F401
  from specjax.decoding.sampling import Sampling  # noqa: F401
  from specjax.models.checkpoints import load_t5, load_tokenizer, save_t5  # noqa: F401
  from specjax.models.t5 import DecoderCache, T5Config, T5Model, init_params  # noqa: F401
