"""Core decoding: one speculative engine, its loops, verification rules, sampling, drafts.

Nothing here knows about configs, tasks or files: algorithms take models (or stubs) as arguments.
Imports point one way, from the bottom up:
  registry      one registry per extension kind (drafts, stop rules, verifiers, tree shapes)
  sampling      temperature / top-k / top-p: the distributions p and q
  theory        alpha, Eq. (1), Theorem 3.8 and the best gamma
  shapes        token-tree shapes
  acceptance    the exact verification rules and the Verifier registry (VERIFIERS)
  stopping      stop rules: how many of the gamma slots each row proposes
  protocol      the Draft protocol, Proposal, TreeProposal, and the rollout drafts share
  candidates    tree candidates and the laws they were drawn from
  model_draft, ngram, lookup, feature_head, examples   the drafts (drafts: their index)
  stats         SpecStats, TreeStats, RefillStats, DecodeOutput
  engine        the loop state and the ONE block step (propose, score, verify, commit)
  auto          gamma='auto': the choice of gamma per iteration
  options       SpecOptions: the settings of one call, validated at one boundary
  chain, tree, autoregressive, queue, refill   the loops
  loop          speculative_decode / autoregressive_decode and the step API (the top)
"""

from specjax.decoding.loop import (TRACE_COUNTS, ARState, DecodeOutput, SpecState, SpecStats,
                                   as_draft, autoregressive_decode, autoregressive_init,
                                   autoregressive_program, autoregressive_step, make_sampling,
                                   speculative_decode, speculative_init, speculative_program,
                                   speculative_step)
from specjax.decoding.options import SpecOptions
from specjax.decoding.protocol import Draft, Proposal
