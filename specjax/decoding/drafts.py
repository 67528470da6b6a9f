"""The shipped drafts, each implementing the protocol of specjax.decoding.protocol, and the draft
registry.

  ModelDraft          a smaller T5; token by token through protocol.rollout (model_draft.py)
  TreeModelDraft      the same T5 expanding token trees level by level (model_draft.py)
  UnigramDraft        context-independent q (fit_unigram), no forward passes (ngram.py)
  BigramDraft         q(x | previous token), top-K rows + unigram backoff (fit_bigram) (ngram.py)
  PromptLookupDraft   copies the continuation of the latest n-gram match in the source or the
                      generated prefix; q one-hot on the proposal, no forward passes (lookup.py)
  FeatureHeadDraft    drafts from the target's own features (feature_head.py)

Every draft honours the stop rule's `before` / `after` hooks and the per-row cap limit_B. A draft
registered by name (`@register('name')` on the class, with a `from_target(target)` classmethod)
can be chosen by that name in the runner's --config.drafts.
"""

from specjax.decoding.lookup import PromptLookupDraft, PromptLookupState
from specjax.decoding.model_draft import ModelDraft, TreeModelDraft, as_draft
from specjax.decoding.ngram import (NGRAM_FORMAT_VERSION, BigramDraft, UnigramDraft, fit_bigram,
                                    fit_unigram, load_ngram, save_ngram)
from specjax.decoding.registry import DRAFTS

register = DRAFTS.register

__all__ = ['DRAFTS', 'BigramDraft', 'ModelDraft', 'NGRAM_FORMAT_VERSION', 'PromptLookupDraft',
           'PromptLookupState', 'TreeModelDraft', 'UnigramDraft', 'as_draft', 'fit_bigram',
           'fit_unigram', 'load_ngram', 'register', 'save_ngram']
