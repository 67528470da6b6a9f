"""The draft protocol: what the speculative loop asks of a draft, and what a draft hands back.

Shape legend: B batch, S source, N decoder-sequence buffer, G the block width (gamma, or G_MAX under
a stop rule), V vocab.

A draft is a pytree (a `flax.struct.dataclass`, so it enters `jax.jit` beside the target) with:

  vocab_size                                  int, must equal the target's
  init(input_ids_BxS, max_len) -> state       per-batch state (a model draft's cache); runs once
  propose(state, seq_BxN, lengths_B, keys_B, gamma, sampling, *, stop, limit_B) -> Proposal
      Up to `gamma` drafts per row after the committed prefix seq[b, :lengths[b] + 1]
      ([start, generated...]; the last committed token is seq[b, lengths[b]]). Row b proposes
      n_B[b] <= limit_B[b] tokens; slots >= n_B[b] are padding and are never accepted.
  commit(state, seq_BxN, lengths_B) -> state  called after acceptance with the new committed prefix;
                                              the hook for drafts whose state must follow it

The loop verifies only each row's first n_B drafts: the corrected or bonus token is drawn from the
target at index n (from p[n] itself when all n were accepted). That keeps the output law exact for
any n decided without looking at the drafted token it would include (see specjax.decoding.stopping).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
from flax import struct


@struct.dataclass
class Proposal:
  """What `Draft.propose` returns.

  tokens_BxG: [B, G] int32    drafted tokens (slots >= n_B are padding)
  q_BxGxV:    [B, G, V] f32   the processed distribution each token was drawn from
  n_B:        [B] int32       proposed tokens per row, 0 <= n <= G
  passes:     [] int32        draft forward passes actually made (data-dependent under stop rules)
  state:      pytree          the draft's new state
  """
  tokens_BxG: jax.Array
  q_BxGxV: jax.Array
  n_B: jax.Array
  passes: jax.Array
  state: Any


@runtime_checkable
class Draft(Protocol):
  """The interface every draft implements (see the module docstring for the contract)."""

  @property
  def vocab_size(self) -> int: ...

  def init(self, input_ids_BxS: jax.Array, max_len: int) -> Any: ...

  def propose(self, state: Any, seq_BxN: jax.Array, lengths_B: jax.Array, keys_B: jax.Array,
              gamma: int, sampling: Any, *, stop: Any, limit_B: jax.Array) -> Proposal: ...

  def commit(self, state: Any, seq_BxN: jax.Array, lengths_B: jax.Array) -> Any: ...
