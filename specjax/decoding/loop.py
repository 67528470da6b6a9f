"""The public entry points: speculative_decode and autoregressive_decode, validated, dispatched.

Shape legend: B batch (Q requests under slots), S source, V vocab.

speculative_decode turns its keyword arguments into one `SpecOptions` (specjax.decoding.options:
each field one type, a one-line error naming a bad one before anything compiles) and runs
  the chain loop     specjax.decoding.chain    (gamma=G, any stop rule, any verifier, trace)
  the tree loop      specjax.decoding.tree     (tree=(3, 2, 1): a token tree per target call)
  slot refill        specjax.decoding.refill   (slots=B, and gamma='auto')
all three built on one block step (specjax.decoding.engine), for every draft that has the form
the mode needs (a chain for all; a tree for model drafts and the feature head).

Also here, for the README's step API: speculative_init / speculative_step / speculative_program
(chain.py), autoregressive_init / autoregressive_step / autoregressive_program (autoregressive.py),
make_sampling and as_draft. `TRACE_COUNTS` reads how many programs each jitted loop holds (a test
that calls twice with the same shapes expects no new one).
"""

from __future__ import annotations

import collections.abc

from specjax.decoding import autoregressive as ar_lib
from specjax.decoding import chain, refill, tree
from specjax.decoding import sampling as sampling_lib
from specjax.decoding.autoregressive import (ARState, autoregressive_init,  # noqa: F401
                                             autoregressive_program, autoregressive_step)
from specjax.decoding.chain import (SpecState, speculative_init, speculative_program,  # noqa: F401
                                    speculative_step)
from specjax.decoding.engine import (DEFAULT_SEED, LoopState, as_key, check_inputs,  # noqa: F401
                                     commit_tokens, finish_tokens, raise_on_nan, row_keys)
from specjax.decoding.model_draft import as_draft  # noqa: F401
from specjax.decoding.options import SpecOptions, check_call
from specjax.decoding.stats import DecodeOutput, SpecStats, per_target_call  # noqa: F401
from specjax.models.t5 import T5Model


class _TraceCounts(collections.abc.Mapping):
  """Read-only {'speculative', 'tree', 'refill', 'autoregressive'} -> programs compiled so far
  (the jitted functions' own caches; nothing is counted by hand)."""

  def _programs(self):
    return {'speculative': chain.speculative_program, 'tree': tree.tree_program,
            'refill': refill.refill_program, 'autoregressive': ar_lib.autoregressive_program}

  def __getitem__(self, name: str) -> int:
    return int(self._programs()[name]._cache_size())  # pylint: disable=protected-access

  def __iter__(self):
    return iter(self._programs())

  def __len__(self) -> int:
    return len(self._programs())


TRACE_COUNTS = _TraceCounts()


def make_sampling(temperature: float = 0.0, top_k: int = 0,
                  top_p: float = 1.0) -> sampling_lib.Sampling:
  """The (hashable, static) Sampling for these settings, numbers normalised to Python types."""
  return sampling_lib.Sampling(temperature=float(temperature), top_k=int(top_k),
                               top_p=float(top_p))


def speculative_decode(target: T5Model, draft, input_ids, options: SpecOptions | None = None, *,
                       rng=None, **settings) -> DecodeOutput:
  """Exact speculative decoding (Leviathan et al. 2023) of a batch of right-padded prompts.

  `draft` is a smaller T5Model or any draft of specjax.decoding.drafts (anything implementing
  specjax.decoding.protocol.Draft). The output distribution is exactly the target's (after
  temperature / top-k / top-p); temperature 0 is exact greedy. `rng`: None (a fixed seed), an
  int or a key. The settings, as keyword arguments or one `options` object (SpecOptions, whose
  docstring defines each): gamma (the block width; 'auto' or 'auto:G_MAX' picks it per
  iteration), max_new_tokens, temperature, top_k, top_p, eos_id, stop (a specjax.stopping rule or
  its spelling), verifier (a name of acceptance.VERIFIERS or a Verifier), tree (a branching tuple
  like (3, 2, 1); gamma = its depth), slots (decode the rows as a queue through B rows), auto,
  trace.
  """
  opts = options if options is not None else SpecOptions.from_kwargs(**settings)
  if options is not None and settings:
    raise ValueError('speculative_decode: pass the settings as options= or as keywords, not both')
  if opts.queued:
    return refill.run(target, draft, input_ids, opts, rng)
  draft = check_call(target, draft, input_ids, opts)
  if opts.tree is not None:
    return tree.run(target, draft, input_ids, opts, rng)
  return chain.run(target, draft, input_ids, opts, rng)


def autoregressive_decode(model: T5Model, input_ids, *, max_new_tokens: int,
                          temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, rng=None,
                          eos_id: int | None = None, slots: int | None = None) -> DecodeOutput:
  """The baseline: one token per target call, same model code, one jit'd while_loop.
  `slots=B`: B rows live in the loop and a finished row takes the next prompt
  (specjax.decoding.refill)."""
  if slots is not None:
    return refill.refill_decode(model, None, input_ids, slots=slots, gamma=None,
                                max_new_tokens=max_new_tokens, temperature=temperature,
                                top_k=top_k, top_p=top_p, rng=rng, eos_id=eos_id,
                                what='autoregressive_decode')
  sampling = make_sampling(temperature, top_k, top_p)
  return ar_lib.plain_decode(model, input_ids, max_new_tokens=max_new_tokens,
                             sampling=sampling.validate(), eos_id=eos_id, rng=rng)
