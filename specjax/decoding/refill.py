"""Slot refill: Q requests through B rows of ONE compiled loop, and gamma='auto'.

Shape legend: Q requests (the queue), B slots (rows living in the loop), S source, N decoder
sequence buffer, G = G_MAX (the widest block), G1 = G + 1, V vocab, M max_new_tokens, I recorded
iterations.

The lockstep loop (specjax.decoding.loop) runs until its LAST row finishes and pays every trip for
all B rows, so about half of a batch's row-iterations are wasted (docs/performance.md section 3).
Here B slots live in the `lax.while_loop`; when a slot's request finishes, the same trip writes its
tokens, length and statistics to the request's output row and loads the next request of the queue
into the slot: its cross-attention keys/values (both encoders run once for the whole queue before
the loop), its sequence, cache length 0, done flag, statistics and the draft's per-request state.
Self-attention caches are not cleared: a row reads only positions below its length, and every one
of those is written by the new request (the rollback convention of specjax.models.t5).

Once the queue is empty the loop only loses rows; each trip still pays for all its slots, so the
width halves (B, B/2, .. down to SHRINK_MIN, at most SHRINK_STEPS times) whenever the active rows
fit the next width: they are gathered into a narrower state and a narrower copy of the loop goes
on (each width is its own compiled while loop, one after the other in the same program).
gamma='auto' keeps the cost curve measured at width B there.

Randomness is per request: iteration i of request r uses fold_in(fold_in(rng, r), i), so a
request's sampled tokens do not depend on `slots`, its place in the queue or its neighbours.

gamma='auto' (an `Auto`): each iteration picks one gamma in {0, 1, .., G_MAX} for all rows,
maximising E[tokens](alpha, gamma) / cost(gamma) with the running alpha of FINISHED iterations (the
non-anticipation rule of specjax.decoding.stopping: the choice never sees a draft of this
iteration) and a measured cost curve `Costs` (a whole loop iteration at each gamma, at B rows:
every trip computes all B rows, so the cost is that of B). gamma = 0 is
a plain decoding step (one target token per row, no draft call: "verifying 0 drafts" draws from
p[0]); each gamma is its own branch of a `lax.switch`, so a small gamma really runs a narrower
block, and each branch is a while loop that keeps going while the choice stays the same (a switch
per trip copied the loop state: 10-20% per trip on a CPU). After gamma = 0 steps a model draft's
cache lags the committed prefix; the next gamma >= 1 step first re-feeds the prefix in one
teacher-forced pass (`resync`).

Entry points: speculative_decode(..., slots=B) / gamma='auto' and autoregressive_decode(...,
slots=B) of specjax.decoding.loop dispatch here (refill_decode); refill_program is the jitted
program; measure_costs measures the cost curve.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.decoding import acceptance
from specjax.decoding import loop as loop_lib
from specjax.decoding import sampling as sampling_lib
from specjax.decoding import stopping
from specjax.decoding.drafts import ModelDraft
from specjax.decoding.loop import DecodeOutput, SpecStats
from specjax.models import t5

GAMMA_TRACE = 512  # iterations whose gamma is recorded in RefillStats.gamma_trace
SHRINK_MIN = 8     # in the tail the loop's width halves down to this many slots (_compact) ...
SHRINK_STEPS = 3   # ... at most this many times (each width is one more compiled loop body)
# SpecStats fields with one entry per row (the others are of the whole call).
PER_ROW = ('target_calls', 'proposed_hist', 'accepted_hist', 'proposed', 'accepted', 'emitted',
           'alpha_sum', 'alpha_count')


@dataclasses.dataclass(frozen=True)
class Auto:
  """gamma='auto': choose gamma in 0 .. g_max per iteration (static, hashable).

  alpha = (sum of beta terms of finished iterations + prior_weight * prior) / (count +
  prior_weight), over all requests so far (the paper's alpha, Cor. 3.6). gamma = 0 steps measure
  no alpha, so once chosen gamma 0 stays; `probe_every` > 0 runs one gamma = 1 iteration after
  that many gamma = 0 iterations in a row (a fresh alpha; it costs the draft's resync pass).
  `costs` ((target cost for K = 1 .. g_max + 1, draft cost)) fixes the cost curve instead of
  measuring it (measure_costs); it is passed to the program as data (no recompilation).
  """
  g_max: int = 5
  prior: float = 0.6
  prior_weight: float = 2.0
  probe_every: int = 0
  costs: tuple | None = None


@struct.dataclass
class Costs:
  """Cost of one iteration at B slots (any unit; only ratios matter): cost(gamma) =
  target_K[gamma] + gamma * draft.

  target_K: [G1] float32   measure_costs: a whole iteration at gamma = 0 .. G (then draft = 0);
                           or, given by hand (Auto.costs), the target's step with K = gamma + 1
  draft:    []   float32   one draft pass, when target_K holds target steps only
  """
  target_K: jax.Array
  draft: jax.Array


@struct.dataclass
class RefillStats(SpecStats):
  """SpecStats with per-REQUEST rows ([Q] / [Q, G1]; iterations, draft_passes, nan, bad_draft are
  of the whole call), plus:

  slots:        []     int32  B, the rows that lived in the loop
  row_iterations: []   int32  row-iterations paid: trips x the loop's width at each trip (the width
                              halves in the tail, after the queue is empty: _compact)
  gamma_hist:   [G1]   int32  iterations run at each gamma (gamma='auto'; a fixed gamma: one bin)
  gamma_trace:  [I]    int32  gamma of iteration i for the first I = GAMMA_TRACE iterations, -1
                              after the last
  """
  slots: jax.Array
  row_iterations: jax.Array
  gamma_hist: jax.Array
  gamma_trace: jax.Array

  @property
  def row_utilisation(self) -> float:
    """Row-iterations that advanced a request / all row-iterations paid."""
    return float(np.sum(self.target_calls) / max(int(self.row_iterations), 1))

  def summary(self) -> dict[str, Any]:
    out = super().summary()
    out.update(slots=int(self.slots), row_utilisation=self.row_utilisation,
               row_iterations=int(self.row_iterations),
               gamma_hist=np.asarray(self.gamma_hist).tolist())
    return out


@struct.dataclass
class RefillState:
  """Loop state.

  seq [B, N], lengths [B], done [B]:  the slots' current requests (as loop.SpecState)
  req:          [B] int32  request in each slot (Q: idle, the queue is empty)
  next_req:     []  int32  the next request to load
  target_cache, draft_state:  per slot
  stats:        SpecStats  per slot, of the slot's current request (iterations, draft_passes, nan,
                           bad_draft: of the whole call)
  out_tokens [Q, M], out_lengths [Q], out_stats (SpecStats [Q]): per request
  alpha_sum, alpha_count: [] float32  beta terms of all finished iterations (gamma='auto')
  stale:        [] bool    the draft's state lags the prefix (after gamma = 0 steps)
  plain_run:    [] int32   gamma = 0 iterations in a row (Auto.probe_every)
  row_iters:    [] int32   row-iterations paid (the loop's width summed over its trips)
  gamma_hist [G1], gamma_trace [I]
  """
  seq: jax.Array
  lengths: jax.Array
  done: jax.Array
  req: jax.Array
  next_req: jax.Array
  target_cache: Any
  draft_state: Any
  stats: SpecStats
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


# ----------------------------------------------------------------------------- per-request state


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
    rows = q[jnp.clip(req_B, 0, q.shape[0] - 1)]
    return jnp.where(take_B.reshape((-1,) + (1,) * (s.ndim - 1)), rows.astype(s.dtype), s)
  return jax.tree.map(take, slot_state, queue_state)


def request_keys(rng, req_B, it_B):
  """(draft keys [B], verify keys [B]) of iteration it_B[b] of request req_B[b]."""
  def one(r, i):
    return jax.random.split(jax.random.fold_in(jax.random.fold_in(rng, r), i), 2)
  both_Bx2 = jax.vmap(one)(req_B, it_B)
  return both_Bx2[:, 0], both_Bx2[:, 1]


def resync(draft, state, seq_BxN):
  """A model draft's cache re-fed with the whole committed prefix (one teacher-forced pass over the
  buffer; positions past a row's length are masked later). Drafts without prefix state: as is."""
  if not isinstance(draft, ModelDraft):
    return state
  cache = state
  t = cache.max_len
  _, cache = t5.decode_hidden(draft.model.params, draft.model.config, cache, seq_BxN[:, :t],
                              jnp.zeros((seq_BxN.shape[0],), jnp.int32))
  return cache


def choose_gamma(auto: Auto, costs: Costs, alpha_sum, alpha_count):
  """argmax over g in 0 .. G of E[tokens per row](alpha, g) / cost(g), ties to the smaller g.

  E[tokens] = (1 - alpha^(g+1)) / (1 - alpha) (Theorem 3.8; 1 for g = 0); cost(g) =
  target_K[g] + g * draft (Costs). Uses only finished iterations' alpha."""
  alpha = ((alpha_sum + auto.prior_weight * auto.prior)
           / (alpha_count + auto.prior_weight))
  alpha = jnp.clip(alpha, 0.0, 1.0 - 1e-6)
  g_G1 = jnp.arange(auto.g_max + 1, dtype=jnp.float32)
  tokens_G1 = (1.0 - alpha ** (g_G1 + 1.0)) / (1.0 - alpha)
  cost_G1 = costs.target_K.astype(jnp.float32) + g_G1 * costs.draft.astype(jnp.float32)
  return jnp.argmax(tokens_G1 / cost_G1).astype(jnp.int32)


# ----------------------------------------------------------------------------- one iteration


def _pad_to(x_BxG, width):
  return jnp.pad(x_BxG, ((0, 0), (0, width - x_BxG.shape[1])))


def spec_iteration(target, draft, st: RefillState, keys, g: int, *, g_max: int, max_new_tokens,
                   sampling, eos_id, stop, verifier, verify_fn) -> RefillState:
  """One iteration at block width g for every unfinished slot (g = 0: a plain decoding step).

  The same steps as loop.speculative_step (draft, one target call on [last, d_1 .. d_g], verify,
  commit); statistics recorded at width G_MAX."""
  draft_keys_B, verify_keys_B = keys
  active_B = ~st.done
  last_Bx1 = jnp.take_along_axis(st.seq, st.lengths[:, None], axis=1)
  b = st.seq.shape[0]
  if g == 0:
    logits_Bx1xV, target_cache = target.decode(st.target_cache, last_Bx1, st.lengths)
    if sampling.greedy:
      next_B = jnp.argmax(logits_Bx1xV[:, 0], axis=-1).astype(jnp.int32)
    else:
      p_BxV = sampling_lib.probs(logits_Bx1xV[:, 0], sampling)
      next_B = jax.vmap(sampling_lib.sample)(verify_keys_B, p_BxV)
    zeros_B = jnp.zeros((b,), jnp.int32)
    seq, lengths, done = loop_lib.commit_tokens(st.seq, st.lengths, st.done, next_B[:, None],
                                                zeros_B + 1, eos_id, max_new_tokens)
    stats = st.stats.record(active_B, zeros_B, zeros_B, jnp.zeros((b, g_max), jnp.float32),
                            jnp.int32(0), jnp.isnan(logits_Bx1xV).any(), jnp.bool_(False))
    return st.replace(seq=seq, lengths=lengths, done=done | stats.nan, target_cache=target_cache,
                      stats=stats, stale=jnp.bool_(draft is not None))
  draft_state = jax.lax.cond(st.stale, lambda s: resync(draft, s, st.seq), lambda s: s,
                             st.draft_state)
  limit_B = jnp.where(st.done, 0, jnp.minimum(stop.limit(st.stats, g), g))
  prop = draft.propose(draft_state, st.seq, st.lengths, draft_keys_B, g, sampling, stop=stop,
                       limit_B=limit_B)
  n_B = stop.truncate(prop.tokens_BxG, prop.q_BxGxV, prop.n_B)
  block_BxG1 = jnp.concatenate([last_Bx1, prop.tokens_BxG], axis=1)
  logits_BxG1xV, target_cache = target.decode(st.target_cache, block_BxG1, st.lengths)
  m_B, next_B, beta_BxG = acceptance.verify_batch(
      verify_keys_B, prop.tokens_BxG, prop.q_BxGxV, logits_BxG1xV, n_B, sampling,
      verifier=verifier, verify_fn=verify_fn)
  padded_BxG1 = jnp.pad(prop.tokens_BxG, ((0, 0), (0, 1)))
  cand_BxG1 = jnp.where(jnp.arange(g + 1)[None, :] == m_B[:, None], next_B[:, None], padded_BxG1)
  seq, lengths, done = loop_lib.commit_tokens(st.seq, st.lengths, st.done, cand_BxG1, m_B + 1,
                                              eos_id, max_new_tokens)
  nan = jnp.isnan(logits_BxG1xV).any() | jnp.isnan(prop.q_BxGxV).any()
  bad = acceptance.out_of_range(prop.tokens_BxG, n_B, target.config.vocab_size)
  stats = st.stats.record(active_B, n_B, m_B, _pad_to(beta_BxG.astype(jnp.float32), g_max),
                          prop.passes, nan, bad)
  return st.replace(seq=seq, lengths=lengths, done=done | stats.nan | stats.bad_draft,
                    target_cache=target_cache, stats=stats, stale=jnp.bool_(False),
                    draft_state=draft.commit(prop.state, seq, lengths))


# ----------------------------------------------------------------------------- harvest / refill


def _harvest(st: RefillState, active_B, max_new_tokens, pad_id) -> RefillState:
  """Writes the slots' requests that ran this trip to their output rows (finished or not: the
  last write is the final one)."""
  q = st.out_lengths.shape[0]
  req_B = jnp.where(active_B, st.req, q)  # q: dropped
  put = lambda out, val: out.at[req_B].set(val, mode='drop')  # noqa: E731
  out_stats = st.out_stats.replace(**{f: put(getattr(st.out_stats, f), getattr(st.stats, f))
                                      for f in PER_ROW})
  tokens_BxM = loop_lib.finish_tokens(st.seq, st.lengths, max_new_tokens, pad_id)
  return st.replace(out_tokens=put(st.out_tokens, tokens_BxM),
                    out_lengths=put(st.out_lengths, st.lengths), out_stats=out_stats)


def _refill(st: RefillState, queue, start_id, refill_fn) -> RefillState:
  """Finished slots take the next requests of the queue (in slot order)."""
  q = st.out_lengths.shape[0]
  target_queue, draft_queue = queue
  halt = st.stats.nan | st.stats.bad_draft
  rank_B = jnp.cumsum(st.done.astype(jnp.int32)) - 1
  take_B = st.done & (st.next_req + rank_B < q) & ~halt
  new_req_B = jnp.where(take_B, st.next_req + rank_B, q)

  def load(st):
    zero_B = lambda x: jnp.where(take_B.reshape((-1,) + (1,) * (x.ndim - 1)), 0, x)  # noqa: E731
    stats = st.stats.replace(**{f: zero_B(getattr(st.stats, f)) for f in PER_ROW})
    seq = jnp.where(take_B[:, None], jnp.zeros_like(st.seq).at[:, 0].set(start_id), st.seq)
    return st.replace(
        seq=seq, lengths=jnp.where(take_B, 0, st.lengths), done=st.done & ~take_B,
        req=jnp.where(take_B, new_req_B, jnp.where(st.done, q, st.req)),
        next_req=st.next_req + jnp.sum(take_B, dtype=jnp.int32),
        target_cache=refill_fn(st.target_cache, target_queue, take_B, new_req_B),
        draft_state=refill_fn(st.draft_state, draft_queue, take_B, new_req_B), stats=stats)

  return jax.lax.cond(jnp.any(take_B), load, lambda s: s, st)


# ----------------------------------------------------------------------------- the tail


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


def _compact(st: RefillState, width: int) -> RefillState:
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


# ----------------------------------------------------------------------------- the program


def init_state(target, draft, input_ids_QxS, *, slots: int, g_max: int, max_new_tokens: int
               ) -> tuple[RefillState, Any]:
  """(the loop's first state, the queue's per-request states): both encoders run once for the
  whole queue; the first `slots` requests are in the slots."""
  q, _ = input_ids_QxS.shape
  b = min(int(slots), q)
  cache_len = max_new_tokens + g_max + 1
  start_id = target.config.decoder_start_token_id
  ids_BxS = input_ids_QxS[:b]
  queue = (target.init_cache(input_ids_QxS, 1),
           () if draft is None else draft.init(input_ids_QxS, 1))
  seq = jnp.zeros((b, max_new_tokens + g_max + 2), jnp.int32).at[:, 0].set(start_id)
  st = RefillState(
      seq=seq, lengths=jnp.zeros((b,), jnp.int32), done=jnp.zeros((b,), bool),
      req=jnp.arange(b, dtype=jnp.int32), next_req=jnp.int32(b),
      target_cache=target.init_cache(ids_BxS, cache_len),
      draft_state=() if draft is None else draft.init(ids_BxS, cache_len),
      stats=SpecStats.zeros(b, g_max),
      out_tokens=jnp.full((q, max_new_tokens), target.config.pad_token_id, jnp.int32),
      out_lengths=jnp.zeros((q,), jnp.int32), out_stats=SpecStats.zeros(q, g_max),
      alpha_sum=jnp.float32(0), alpha_count=jnp.float32(0), stale=jnp.bool_(False),
      plain_run=jnp.int32(0), row_iters=jnp.int32(0),
      gamma_hist=jnp.zeros((g_max + 1,), jnp.int32),
      gamma_trace=jnp.full((GAMMA_TRACE,), -1, jnp.int32))
  return st, queue


@functools.partial(jax.jit, static_argnames=(
    'slots', 'gamma', 'auto', 'max_new_tokens', 'sampling', 'eos_id', 'stop', 'verifier',
    'verify_fn', 'refill_fn', 'shrink'))
def refill_program(target, draft, input_ids_QxS, rng, costs, *, slots, gamma, auto, max_new_tokens,
                   sampling, eos_id, stop=None, verifier='token', verify_fn=None,
                   refill_fn=take_rows, shrink=True):
  """The refill loop as one jitted program. `draft` None: autoregressive (gamma 0 only); `auto` an
  Auto: gamma chosen per iteration in 0 .. auto.g_max from `costs` (a Costs); otherwise the fixed
  `gamma`. `refill_fn` loads queue rows into slots (take_rows; tests inject faults). `shrink`:
  the width halves in the tail (shrink_widths, _compact). Unchecked: refill_decode validates."""
  loop_lib.TRACE_COUNTS['refill'] += 1
  stop = stop or stopping.Fixed()
  g_max = 0 if draft is None else (auto.g_max if auto is not None else int(gamma))
  gammas = [0] if draft is None else (list(range(g_max + 1)) if auto is not None else [g_max])
  start_id = target.config.decoder_start_token_id
  st, queue = init_state(target, draft, input_ids_QxS, slots=slots, g_max=g_max,
                         max_new_tokens=max_new_tokens)
  step = functools.partial(spec_iteration, target, draft, g_max=g_max,
                           max_new_tokens=max_new_tokens, sampling=sampling, eos_id=eos_id,
                           stop=stop, verifier=verifier, verify_fn=verify_fn)

  q = input_ids_QxS.shape[0]
  b = st.seq.shape[0]
  widths = shrink_widths(b, (st.target_cache, st.draft_state)) if shrink else [b]

  def running(st, w_next: int):
    """The current width's loop goes on: rows left, and not (queue empty and they fit w_next)."""
    fits = (st.next_req >= q) & (jnp.sum(~st.done, dtype=jnp.int32) <= w_next)
    return ~jnp.all(st.done) & ~fits

  def decide(st):
    """gamma of the next iteration, from finished iterations only (Auto)."""
    g_now = choose_gamma(auto, costs, st.alpha_sum, st.alpha_count)
    if auto.probe_every > 0:
      g_now = jnp.where((g_now == 0) & (st.plain_run >= auto.probe_every), 1, g_now)
    return g_now

  def iteration(st, g: int):
    """One trip at width g: draft, verify, commit, bookkeeping, harvest, refill."""
    keys = request_keys(rng, st.req, st.stats.target_calls)
    active_B = ~st.done
    new = step(st, keys, g)
    it = st.stats.iterations
    new = new.replace(
        alpha_sum=st.alpha_sum + jnp.sum(new.stats.alpha_sum - st.stats.alpha_sum),
        alpha_count=st.alpha_count + jnp.sum(new.stats.alpha_count - st.stats.alpha_count
                                             ).astype(jnp.float32),
        plain_run=st.plain_run + 1 if g == 0 else jnp.int32(0),
        row_iters=st.row_iters + st.seq.shape[0],
        gamma_hist=st.gamma_hist.at[g].add(1),
        gamma_trace=st.gamma_trace.at[it].set(g, mode='drop'))
    new = _harvest(new, active_B, max_new_tokens, target.config.pad_token_id)
    return _refill(new, queue, start_id, refill_fn)

  def run_at(g: int, w_next: int):
    """Iterations at width g for as long as `decide` keeps choosing g. The lax.switch sits OUTSIDE
    this inner loop: a conditional inside the loop body cost 10-20% per trip on a CPU (the branch
    copies the loop state), whereas a switch taken only when the choice changes costs nothing in
    the steady state. The decisions are the same as choosing before every trip."""
    def same_g(st):
      return running(st, w_next) & (decide(st) == g)
    return lambda st: jax.lax.while_loop(same_g, functools.partial(iteration, g=g), st)

  def body_for(w_next: int):
    if len(gammas) == 1:
      return functools.partial(iteration, g=gammas[0])
    return lambda st: jax.lax.switch(decide(st), [run_at(g, w_next) for g in gammas], st)

  for i, w in enumerate(widths):
    if i:
      st = _compact(st, w)
    w_next = widths[i + 1] if i + 1 < len(widths) else 0
    st = jax.lax.while_loop(functools.partial(running, w_next=w_next), body_for(w_next), st)
  s = st.stats
  stats = RefillStats(
      iterations=s.iterations, draft_passes=s.draft_passes, nan=s.nan, bad_draft=s.bad_draft,
      target_calls=st.out_stats.target_calls, proposed_hist=st.out_stats.proposed_hist,
      accepted_hist=st.out_stats.accepted_hist, proposed=st.out_stats.proposed,
      accepted=st.out_stats.accepted, emitted=st.out_stats.emitted,
      alpha_sum=st.out_stats.alpha_sum, alpha_count=st.out_stats.alpha_count,
      slots=jnp.int32(b), row_iterations=st.row_iters, gamma_hist=st.gamma_hist,
      gamma_trace=st.gamma_trace)
  return DecodeOutput(tokens=st.out_tokens, lengths=st.out_lengths, stats=stats)


# ----------------------------------------------------------------------------- costs


_COSTS: dict = {}


@functools.partial(jax.jit, static_argnames=('g', 'g_max', 'steps', 'max_new_tokens', 'sampling',
                                             'eos_id'))
def _iteration_loop(target, draft, st, queue, rng, *, g, g_max, steps, max_new_tokens, sampling,
                    eos_id):
  """`steps` trips of the refill loop's body at width g, rows pinned at their lengths and never
  done: what one mid-sequence iteration costs, every per-trip overhead included."""
  pinned_B = st.lengths
  step = functools.partial(spec_iteration, target, draft, g_max=g_max,
                           max_new_tokens=max_new_tokens, sampling=sampling, eos_id=eos_id,
                           stop=stopping.Fixed(), verifier='token', verify_fn=None)
  start_id, pad_id = target.config.decoder_start_token_id, target.config.pad_token_id

  def body_fn(_, st):
    keys = request_keys(rng, st.req, st.stats.target_calls)
    active_B = ~st.done
    new = _harvest(step(st, keys, g), active_B, max_new_tokens, pad_id)
    new = _refill(new, queue, start_id, take_rows)
    return new.replace(lengths=pinned_B, done=jnp.zeros_like(new.done))

  return jax.lax.fori_loop(0, steps, body_fn, st).seq


def smooth_costs(cost_G1) -> np.ndarray:
  """Iteration costs at gamma = 0 .. G with gamma >= 1 replaced by their least-squares line
  (slope >= 0). From gamma = 1 on an iteration adds one draft pass and one block column per
  gamma, so the cost is linear in gamma; single timings on a shared CPU scatter by 5-10%, enough
  to order neighbouring gammas wrongly (measured: gamma 3 'cheaper' than gamma 2 at B = 64).
  gamma = 0 (no draft call at all) keeps its own timing."""
  c = np.asarray(cost_G1, np.float64)
  if len(c) <= 2:
    return c
  g = np.arange(1, len(c), dtype=np.float64)
  slope, icpt = np.polyfit(g, c[1:], 1)
  if slope < 0:
    slope, icpt = 0.0, float(np.mean(c[1:]))
  return np.concatenate([c[:1], icpt + slope * g])


def measure_costs(target, draft, input_ids_BxS, *, g_max: int, max_new_tokens: int,
                  sampling: sampling_lib.Sampling | None = None, repeats: int = 5,
                  steps: int = 16) -> Costs:
  """The cost curve of `Auto` at this batch: one whole refill-loop iteration at each width
  gamma = 0 .. g_max (draft passes, the target's block, verification, sampling, commit and the
  per-trip refill bookkeeping), rows pinned mid-sequence, each timed inside one compiled loop,
  the fastest of `repeats` (interference only adds time), variants interleaved, then smoothed
  (smooth_costs). Returned as Costs(target_K=[iteration cost at
  gamma = 0 .. g_max], draft=0): the whole iteration, so choose_gamma's tokens / cost compares
  what the loop really pays (the sum of forward-pass costs misses 10-35% of an iteration on a
  CPU). Cached per (models, batch shape, g_max, max_new_tokens, sampling, platform)."""
  from specjax.runner import metrics  # pylint: disable=import-outside-toplevel
  sampling = sampling or sampling_lib.Sampling()
  ids_BxS = jnp.asarray(input_ids_BxS, jnp.int32)
  b = ids_BxS.shape[0]
  model_draft = draft.model if isinstance(draft, ModelDraft) else None
  key = (target.config, getattr(model_draft, 'config', type(draft).__name__), str(target.dtype),
         ids_BxS.shape, g_max, max_new_tokens, sampling, jax.default_backend())
  if key in _COSTS:
    return _COSTS[key]
  st, queue = jax.jit(functools.partial(init_state, slots=b, g_max=g_max,
                                        max_new_tokens=max_new_tokens))(target, draft, ids_BxS)
  st = st.replace(lengths=jnp.full((b,), max(max_new_tokens // 2 - g_max - 1, 0), jnp.int32))
  rng = jax.random.PRNGKey(0)
  eos = target.config.eos_token_id

  def runner(g):
    return lambda: _iteration_loop(target, draft, st, queue, rng, g=g, g_max=g_max, steps=steps,
                                   max_new_tokens=max_new_tokens, sampling=sampling, eos_id=eos)

  t = metrics.time_interleaved({f'g{g}': runner(g) for g in range(g_max + 1)}, repeats=repeats)
  costs = Costs(target_K=jnp.asarray(smooth_costs([min(t[f'g{g}'].times_s) for g in
                                                   range(g_max + 1)]), jnp.float32),
                draft=jnp.float32(0.0))
  _COSTS[key] = costs
  return costs


# ----------------------------------------------------------------------------- entry point


def parse_gamma(gamma) -> tuple[int | None, Auto | None]:
  """(fixed gamma, None) or (None, Auto) from an int, 'auto', 'auto:G' or an Auto."""
  if isinstance(gamma, Auto):
    auto = gamma
  elif isinstance(gamma, str):
    name, _, arg = gamma.strip().partition(':')
    if name != 'auto':
      raise ValueError(f"gamma {gamma!r}: expected an int >= 1, 'auto' or 'auto:G_MAX'")
    try:
      auto = Auto(g_max=int(arg)) if arg else Auto()
    except ValueError:
      raise ValueError(f"gamma {gamma!r}: G_MAX {arg!r} is not an integer") from None
  else:
    if gamma is None or int(gamma) < 1:
      raise ValueError(f'gamma must be >= 1, got {gamma}')
    return int(gamma), None
  if auto.g_max < 1:
    raise ValueError(f'gamma auto: g_max must be >= 1, got {auto.g_max}')
  if not 0 <= auto.prior <= 1 or auto.prior_weight < 0:
    raise ValueError(f'gamma auto: prior must be in [0, 1] and prior_weight >= 0, got {auto}')
  return None, auto


def refill_decode(target, draft, input_ids, *, slots, gamma, max_new_tokens, temperature=0.0,
                  top_k=0, top_p=1.0, rng=None, eos_id=None, stop=None, verifier='token',
                  verify_fn=None, costs: Costs | None = None, refill_fn=take_rows,
                  shrink: bool = True, what='speculative_decode') -> DecodeOutput:
  """Validated refill decoding (loop.speculative_decode / autoregressive_decode dispatch here).

  `draft` None: autoregressive. `slots` None: all requests at once (one slot per request).
  `gamma`: an int, 'auto', 'auto:G_MAX' or an Auto; `costs` the Auto's cost curve (measured with
  measure_costs at this batch when None). `shrink` False keeps the full width to the end (for
  comparisons; tokens are the same)."""
  sampling = loop_lib.make_sampling(temperature, top_k, top_p)
  ids = jnp.asarray(input_ids, jnp.int32) if not isinstance(input_ids, jax.Array) else input_ids
  q = ids.shape[0] if ids.ndim == 2 else 0
  if slots is not None and (isinstance(slots, bool) or int(slots) < 1):
    raise ValueError(f'slots must be an integer >= 1, got {slots!r}')
  b = q if slots is None else min(int(slots), max(q, 1))
  fixed, auto = (0, None) if draft is None else parse_gamma(gamma)
  if draft is not None:
    draft = loop_lib.as_draft(draft)
    vocab_draft = getattr(draft, 'vocab_size', None)
    if vocab_draft is None:
      raise ValueError(f'draft {type(draft).__name__} has no vocab_size: a draft implements '
                       'specjax.decoding.protocol.Draft (see docs/extending.md)')
    if verify_fn is None and verifier not in acceptance.VERIFIERS:
      raise ValueError(f'verifier {verifier!r} unknown; choose from '
                       f'{sorted(acceptance.VERIFIERS)}')
  loop_lib.check_inputs(input_ids, max_new_tokens, None, sampling, target.config.vocab_size,
                        None if draft is None else int(vocab_draft))
  eos = target.config.eos_token_id if eos_id is None else int(eos_id)
  if auto is not None and auto.costs is not None:
    target_k, draft_cost = auto.costs
    if len(target_k) != auto.g_max + 1:
      raise ValueError(f'gamma auto: costs need {auto.g_max + 1} target costs (K = 1 .. g_max + 1), '
                       f'got {len(target_k)}')
    costs = Costs(target_K=jnp.asarray(target_k, jnp.float32), draft=jnp.float32(draft_cost))
  if auto is not None:
    auto = dataclasses.replace(auto, costs=None)  # the curve is data, not a static argument
  if auto is not None and costs is None:
    costs = measure_costs(target, draft, ids[:b], g_max=auto.g_max,
                          max_new_tokens=int(max_new_tokens), sampling=sampling)
  if costs is None:
    costs = Costs(target_K=jnp.ones((1,), jnp.float32), draft=jnp.float32(0))
  out = refill_program(target, draft, ids, loop_lib.as_key(rng), costs, slots=b,
                       gamma=fixed, auto=auto, max_new_tokens=int(max_new_tokens),
                       sampling=sampling, eos_id=eos, stop=None if draft is None else
                       (stop or stopping.Fixed()), verifier=verifier, verify_fn=verify_fn,
                       refill_fn=refill_fn, shrink=bool(shrink))
  loop_lib.raise_on_nan(out.stats.nan, what)
  if bool(out.stats.bad_draft):
    raise ValueError(f'{what}: the draft {type(draft).__name__} proposed a token id outside '
                     f'[0, {target.config.vocab_size}) (vocab_size); no tokens returned')
  return out.to_host()
