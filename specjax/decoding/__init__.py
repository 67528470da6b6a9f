"""Core decoding: the speculative and autoregressive loops, acceptance rules, sampling, drafts.

Nothing here knows about configs, tasks or files: algorithms take models (or stubs) as arguments.
"""

from specjax.decoding.loop import (DecodeOutput, SpecState, SpecStats, TRACE_COUNTS,
                                   autoregressive_decode, speculative_decode, speculative_init,
                                   speculative_step)
