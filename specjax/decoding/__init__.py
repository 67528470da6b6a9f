"""Core decoding: the speculative and autoregressive loops, acceptance rules, sampling, drafts.

Nothing here knows about configs, tasks or files: algorithms take models (or stubs) as arguments.
  loop        speculative_decode / autoregressive_decode, their step API and jitted programs
  protocol    the Draft protocol, Proposal, and the rollout helper drafts share
  drafts      ModelDraft and the model-free drafts (unigram, bigram, prompt lookup)
  stopping    stop rules: how many of the gamma slots each row proposes
  acceptance  the exact verification rules (VERIFIERS) and the batched greedy verifier
  sampling    temperature / top-k / top-p: the distributions p and q
"""

from specjax.decoding.loop import (ARState, DecodeOutput, SpecState, SpecStats, TRACE_COUNTS,
                                   as_draft, autoregressive_decode, autoregressive_init,
                                   autoregressive_program, autoregressive_step, make_sampling,
                                   speculative_decode, speculative_init, speculative_program,
                                   speculative_step)
from specjax.decoding.protocol import Draft, Proposal
