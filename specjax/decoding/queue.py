"""The request queue of slot refill: per-request state, harvesting, loading and narrowing slots.

Shape legend: Q requests (the queue), B slots (rows living in the loop), W a narrower width, N
decoder sequence buffer, G = G_MAX (the widest block), G1 = G + 1, M max_new_tokens, I recorded
iterations.

When a slot's request finishes, the same trip writes its tokens, length and statistics to the
request's output row (`harvest`) and loads the next request of the queue into the slot (`load`):
its cross-attention keys/values (both encoders run once for the whole queue before the loop), its
sequence, cache length 0, done flag, statistics and the draft's per-request state. Self-attention
caches are not cleared: a row reads only positions below its length, and every one of those is
written by the new request (the rollback convention of specjax.models.t5). Randomness is per
request: iteration i of request r uses fold_in(fold_in(rng, r), i), so a request's sampled tokens
do not depend on `slots`, its place in the queue or its neighbours.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding import engine, protocol
from specjax.decoding.stats import SpecStats

GAMMA_TRACE = 512  # iterations whose gamma is recorded in RefillStats.gamma_trace
SHRINK_MIN = 8     # in the tail the loop's width halves down to this many slots (compact) ...
SHRINK_STEPS = 3   # ... at most this many times (each width is one more compiled loop body)
# SpecStats fields with one entry per row (the others are of the whole call).
PER_ROW = ('target_calls', 'proposed_hist', 'accepted_hist', 'proposed', 'accepted', 'emitted',
           'alpha_sum', 'alpha_count')


@struct.dataclass
class RefillState(engine.LoopState):
  """engine.LoopState of the slots' current requests (stats per slot, of the slot's request;
  iterations, draft_passes, nan, bad_draft of the whole call; rng the call's base key), plus

  req:          [B] int32  request in each slot (Q: idle, the queue is empty)
  next_req:     []  int32  the next request to load
  out_tokens [Q, M], out_lengths [Q], out_stats (SpecStats [Q]): per request
  alpha_sum, alpha_count: [] float32  beta terms of all finished iterations (gamma='auto')
  stale:        [] bool    the draft's state lags the prefix (after gamma = 0 steps)
  plain_run:    [] int32   gamma = 0 iterations in a row (Auto.probe_every)
  row_iters:    [] int32   row-iterations paid (the loop's width summed over its trips)
  gamma_hist [G1], gamma_trace [I]
  """
  req: jax.Array
  next_req: jax.Array
  out_tokens: jax.Array
  out_lengths: jax.Array
  out_stats: SpecStats
  alpha_sum: jax.Array
  alpha_count: jax.Array
  stale: jax.Array
  plain_run: jax.Array
  row_iters: jax.Array
  gamma_hist: jax.Array
  gamma_trace: jax.Array

  def keys(self) -> tuple[jax.Array, jax.Array]:
    """(draft keys [B], verify keys [B]) of each slot's request at its own iteration."""
    return request_keys(self.rng, self.req, self.stats.target_calls)


def request_keys(rng, req_B, it_B):
  """(draft keys [B], verify keys [B]) of iteration it_B[b] of request req_B[b]."""
  one = lambda r, i: jax.random.fold_in(jax.random.fold_in(rng, r), i)  # noqa: E731
  return engine.split_keys(jax.vmap(one)(req_B, it_B))


def init_state(target, draft, input_ids_QxS, rng, *, slots: int, g_max: int, max_new_tokens: int
               ) -> tuple[RefillState, Any]:
  """(the loop's first state, the queue's per-request states): both encoders run once for the
  whole queue; the first `slots` requests are in the slots."""
  q = input_ids_QxS.shape[0]
  b = min(int(slots), q)
  target_queue = target.init_cache(input_ids_QxS, 1)
  queue = (target_queue,
           () if draft is None else protocol.init_draft(draft, input_ids_QxS, 1, target_queue))
  st = engine.init_state(
      target, draft, input_ids_QxS[:b], rng, form=engine.Chain(g_max),
      max_new_tokens=max_new_tokens, cls=RefillState,
      req=jnp.arange(b, dtype=jnp.int32), next_req=jnp.int32(b),
      out_tokens=jnp.full((q, max_new_tokens), target.config.pad_token_id, jnp.int32),
      out_lengths=jnp.zeros((q,), jnp.int32), out_stats=SpecStats.zeros(q, g_max),
      alpha_sum=jnp.float32(0), alpha_count=jnp.float32(0), stale=jnp.bool_(False),
      plain_run=jnp.int32(0), row_iters=jnp.int32(0),
      gamma_hist=jnp.zeros((g_max + 1,), jnp.int32),
      gamma_trace=jnp.full((GAMMA_TRACE,), -1, jnp.int32))
  return st, queue


def rows_where(take_B, new_x, old_x):
  """new_x on the rows take_B, old_x elsewhere (any trailing shape; axis 0 = rows)."""
  return jnp.where(take_B.reshape((-1,) + (1,) * (old_x.ndim - 1)), new_x, old_x)


def take_rows(slot_state, queue_state, take_B, req_B):
  """Rows take_B of a slot pytree replaced by rows req_B of the queue pytree (leading axis = rows).

  The queue pytree was built by the same init with max_len 1: leaves whose per-row shape differs
  (self-attention caches, sized by max_len) are position buffers read only below a row's length,
  so they are kept; every other leaf (cross-attention keys/values, masks, sources) is per request
  and copied.
  """
  def take(s, q):
    if s.shape[1:] != q.shape[1:]:
      return s
    return rows_where(take_B, q[jnp.clip(req_B, 0, q.shape[0] - 1)].astype(s.dtype), s)
  return jax.tree.map(take, slot_state, queue_state)


def harvest(st: RefillState, active_B, max_new_tokens, pad_id) -> RefillState:
  """Writes the slots' requests that ran this trip to their output rows (finished or not: the
  last write is the final one)."""
  q = st.out_lengths.shape[0]
  req_B = jnp.where(active_B, st.req, q)  # q: dropped
  put = lambda out, val: out.at[req_B].set(val, mode='drop')  # noqa: E731
  out_stats = st.out_stats.replace(**{f: put(getattr(st.out_stats, f), getattr(st.stats, f))
                                      for f in PER_ROW})
  tokens_BxM = engine.finish_tokens(st.seq, st.lengths, max_new_tokens, pad_id)
  return st.replace(out_tokens=put(st.out_tokens, tokens_BxM),
                    out_lengths=put(st.out_lengths, st.lengths), out_stats=out_stats)


def load(st: RefillState, queue, start_id) -> RefillState:
  """Finished slots take the next requests of the queue (in slot order)."""
  q = st.out_lengths.shape[0]
  target_queue, draft_queue = queue
  halt = st.stats.nan | st.stats.bad_draft
  rank_B = jnp.cumsum(st.done.astype(jnp.int32)) - 1
  take_B = st.done & (st.next_req + rank_B < q) & ~halt
  new_req_B = jnp.where(take_B, st.next_req + rank_B, q)

  def fill(st):
    stats = st.stats.replace(**{f: rows_where(take_B, 0, getattr(st.stats, f)) for f in PER_ROW})
    return st.replace(
        seq=rows_where(take_B, jnp.zeros_like(st.seq).at[:, 0].set(start_id), st.seq),
        lengths=jnp.where(take_B, 0, st.lengths), done=st.done & ~take_B,
        req=jnp.where(take_B, new_req_B, jnp.where(st.done, q, st.req)),
        next_req=st.next_req + jnp.sum(take_B, dtype=jnp.int32),
        target_cache=take_rows(st.target_cache, target_queue, take_B, new_req_B),
        draft_state=take_rows(st.draft_state, draft_queue, take_B, new_req_B), stats=stats)

  return jax.lax.cond(jnp.any(take_B), fill, lambda s: s, st)


def shrink_widths(b: int, slot_trees) -> list[int]:
  """The loop's widths: b, then up to SHRINK_STEPS halves down to SHRINK_MIN, each used once the
  queue is empty and the active rows fit it. [b] when b < 2 * SHRINK_MIN or a per-slot leaf has
  no leading row axis (a draft state with shared leaves cannot be compacted)."""
  leaves = jax.tree.leaves(slot_trees)
  if any(x.ndim == 0 or x.shape[0] != b for x in leaves):
    return [b]
  widths = [b]
  while widths[-1] // 2 >= SHRINK_MIN and len(widths) <= SHRINK_STEPS:
    widths.append(widths[-1] // 2)
  return widths


def compact(st: RefillState, width: int) -> RefillState:
  """The slots narrowed to `width`: active rows first (stable), every per-slot leaf gathered.

  After the queue is empty the loop only loses rows, and each trip pays for all its slots; at
  B = 64 about 30% of the row-iterations went to finished rows in the tail (docs/performance.md
  section 3), and a narrower trip costs less. Requests, their statistics and their random streams
  (keyed by request, not slot) move with their rows, so tokens do not change."""
  idx_W = jnp.argsort(st.done, stable=True)[:width]
  take = lambda x: x[idx_W]  # noqa: E731
  stats = st.stats.replace(**{f: take(getattr(st.stats, f)) for f in PER_ROW})
  return st.replace(seq=take(st.seq), lengths=take(st.lengths), done=take(st.done),
                    req=take(st.req), target_cache=jax.tree.map(take, st.target_cache),
                    draft_state=jax.tree.map(take, st.draft_state), stats=stats)
