"""Slot refill: Q requests through B rows of ONE compiled loop, and gamma='auto'.

Shape legend: Q requests (the queue), B slots (rows living in the loop), S source, N decoder
sequence buffer, G = G_MAX (the widest block), G1 = G + 1, V vocab, M max_new_tokens.

The lockstep loop runs until its LAST row finishes and pays every trip for all B rows, so about
half of a batch's row-iterations are wasted (docs/performance.md section 3). Here B slots live in
the `lax.while_loop`; a finished slot takes the next request in the same trip
(specjax.decoding.queue). Each trip is engine.block_step at one width g: the chain of every draft
(the feature head too), any stop rule, any verifier; g = 0 is a plain decoding step (no draft
call).

Once the queue is empty the loop only loses rows; each trip still pays for all its slots, so the
width halves (B, B/2, .. down to queue.SHRINK_MIN, at most SHRINK_STEPS times) whenever the active
rows fit the next width: they are gathered into a narrower state and a narrower copy of the loop
goes on (each width is its own compiled while loop, one after the other in the same program).

gamma='auto' (specjax.decoding.auto) picks one gamma in {0, .., G_MAX} for all rows before each
iteration from finished iterations only; each gamma is its own branch of a `lax.switch`, so a
small gamma really runs a narrower block, and each branch is a while loop that keeps going while
the choice stays the same (a switch per trip copied the loop state: 10-20% per trip on a CPU).
After gamma = 0 steps the draft's state lags the committed prefix; the next gamma >= 1 step first
brings it up to date (`protocol.resync`: one teacher-forced pass for a model draft or a head).

Entry points: speculative_decode(..., slots=B) / gamma='auto' and autoregressive_decode(...,
slots=B) of specjax.decoding.loop dispatch here (refill_decode); refill_program is the jitted
program; measure_costs measures the cost curve of gamma='auto' (once per call unless an
Auto(costs=...) gives it: `measured(...)` returns such an Auto).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from specjax import timing
from specjax.decoding import acceptance, engine, protocol, stopping
from specjax.decoding import queue as queue_lib
from specjax.decoding import sampling as sampling_lib
from specjax.decoding.auto import Auto, Costs, choose_gamma, parse_gamma, smooth_costs  # noqa: F401
from specjax.decoding.model_draft import as_draft
from specjax.decoding.options import SpecOptions, check_call
from specjax.decoding.queue import (GAMMA_TRACE, PER_ROW, SHRINK_MIN, SHRINK_STEPS,  # noqa: F401
                                    RefillState, request_keys, shrink_widths, take_rows)
from specjax.decoding.stats import DecodeOutput, RefillStats
from specjax.programs import typed_jit


@dataclasses.dataclass(frozen=True)
class Plan:
  """The static side of one refill program: which widths run, and how each trip verifies."""
  g_max: int
  auto: Auto | None
  max_new_tokens: int
  sampling: sampling_lib.Sampling
  eos_id: int
  stop: stopping.StopRule
  verifier: object

  @property
  def gammas(self) -> tuple[int, ...]:
    return tuple(range(self.g_max + 1)) if self.auto is not None else (self.g_max,)


def trip(target, draft, queue, plan: Plan, st: RefillState, g: int) -> RefillState:
  """One iteration at width g for every slot, its bookkeeping, then harvest and refill."""
  active_B = ~st.done
  if g and draft is not None:  # bring a lagging draft up to the prefix (after gamma = 0 steps)
    st = st.replace(draft_state=jax.lax.cond(
        st.stale, lambda s: protocol.resync(draft, s, st.seq, st.lengths), lambda s: s,
        st.draft_state))
  new, _ = engine.block_step(target, draft, engine.Chain(g), st, st.keys(),
                             sampling=plan.sampling, verifier=plan.verifier, stop=plan.stop,
                             eos_id=plan.eos_id, max_new_tokens=plan.max_new_tokens)
  new = new.replace(
      stale=jnp.bool_(g == 0 and draft is not None),
      alpha_sum=st.alpha_sum + jnp.sum(new.stats.alpha_sum - st.stats.alpha_sum),
      alpha_count=st.alpha_count + jnp.sum(new.stats.alpha_count - st.stats.alpha_count
                                           ).astype(jnp.float32),
      plain_run=st.plain_run + 1 if g == 0 else jnp.int32(0),
      row_iters=st.row_iters + st.seq.shape[0],
      gamma_hist=st.gamma_hist.at[g].add(1),
      gamma_trace=st.gamma_trace.at[st.stats.iterations].set(g, mode='drop'))
  new = queue_lib.harvest(new, active_B, plan.max_new_tokens, target.config.pad_token_id)
  return queue_lib.load(new, queue, target.config.decoder_start_token_id)


def decide(plan: Plan, costs: Costs, st: RefillState):
  """gamma of the next iteration, from finished iterations only (Auto)."""
  auto = plan.auto
  g_now = choose_gamma(auto, costs, st.alpha_sum, st.alpha_count)
  if auto.probe_every > 0:
    g_now = jnp.where((g_now == 0) & (st.plain_run >= auto.probe_every), 1, g_now)
  return g_now


def run_width(step, plan: Plan, costs: Costs, st: RefillState, w_next: int) -> RefillState:
  """Trips at the current width until the rows are done, or the queue is empty and the rows
  left fit the next width w_next. `step(st, g)` is one trip at gamma g.

  Under Auto each gamma runs its own inner while loop for as long as `decide` keeps choosing it:
  the lax.switch sits OUTSIDE the inner loop (a conditional inside the loop body cost 10-20% per
  trip on a CPU, the branch copies the loop state); the decisions are the same as choosing
  before every trip."""
  q = st.out_lengths.shape[0]

  def running(st):
    fits = (st.next_req >= q) & (jnp.sum(~st.done, dtype=jnp.int32) <= w_next)
    return ~jnp.all(st.done) & ~fits

  if len(plan.gammas) == 1:
    return jax.lax.while_loop(running, functools.partial(step, g=plan.gammas[0]), st)

  def run_at(g: int):
    same_g = lambda st: running(st) & (decide(plan, costs, st) == g)  # noqa: E731
    return lambda st: jax.lax.while_loop(same_g, functools.partial(step, g=g), st)

  branches = [run_at(g) for g in plan.gammas]
  return jax.lax.while_loop(running,
                            lambda st: jax.lax.switch(decide(plan, costs, st), branches, st), st)


@typed_jit(static_argnames=('slots', 'plan', 'shrink'))
def refill_program(target, draft, input_ids_QxS, rng, costs, *, slots: int, plan: Plan,
                   shrink: bool = True) -> DecodeOutput:
  """The refill loop as one jitted program. `draft` None: autoregressive (gamma 0 only); `costs`
  the Auto's cost curve (Costs.flat() without one). `shrink`: the width halves in the tail
  (shrink_widths, queue.compact). Unchecked: refill_decode validates."""
  st, queue = queue_lib.init_state(target, draft, input_ids_QxS, rng, slots=slots,
                                   g_max=plan.g_max, max_new_tokens=plan.max_new_tokens)
  step = functools.partial(trip, target, draft, queue, plan)
  b = st.seq.shape[0]
  widths = shrink_widths(b, (st.target_cache, st.draft_state)) if shrink else [b]
  for i, w in enumerate(widths):
    if i:
      st = queue_lib.compact(st, w)
    st = run_width(step, plan, costs, st, widths[i + 1] if i + 1 < len(widths) else 0)
  per_request = {f: getattr(st.out_stats, f) for f in PER_ROW}
  s = st.stats
  stats = RefillStats(iterations=s.iterations, draft_passes=s.draft_passes, nan=s.nan,
                      bad_draft=s.bad_draft, slots=jnp.int32(b), row_iterations=st.row_iters,
                      gamma_hist=st.gamma_hist, gamma_trace=st.gamma_trace, **per_request)
  return DecodeOutput(tokens=st.out_tokens, lengths=st.out_lengths, stats=stats)


# ----------------------------------------------------------------------------- costs


@typed_jit(static_argnames=('plan', 'g', 'steps'))
def pinned_trips(target, draft, st, queue, *, plan: Plan, g: int, steps: int):
  """`steps` trips of the refill loop's body at width g, rows pinned at their lengths and never
  done: what one mid-sequence iteration costs, every per-trip overhead included."""
  pinned_B = st.lengths

  def body_fn(_, st):
    new = trip(target, draft, queue, plan, st, g)
    return new.replace(lengths=pinned_B, done=jnp.zeros_like(new.done))

  return jax.lax.fori_loop(0, steps, body_fn, st).seq


def measure_costs(target, draft, input_ids_BxS, *, g_max: int, max_new_tokens: int,
                  sampling: sampling_lib.Sampling | None = None, repeats: int = 5,
                  steps: int = 16) -> Costs:
  """The cost curve of `Auto` at this batch: one whole refill-loop iteration at each width
  gamma = 0 .. g_max (draft passes, the target's block, verification, sampling, commit and the
  per-trip refill bookkeeping), rows pinned mid-sequence, each timed inside one compiled loop,
  the fastest of `repeats` (interference only adds time), variants interleaved, then smoothed
  (smooth_costs). Returned as Costs(target_K=[iteration cost at gamma = 0 .. g_max], draft=0):
  the whole iteration, so choose_gamma's tokens / cost compares what the loop really pays (the
  sum of forward-pass costs misses 10-35% of an iteration on a CPU)."""
  draft = as_draft(draft)
  ids_BxS = jnp.asarray(input_ids_BxS, jnp.int32)
  b = ids_BxS.shape[0]
  rng = jax.random.PRNGKey(0)
  st, queue = jax.jit(functools.partial(queue_lib.init_state, slots=b, g_max=g_max,
                                        max_new_tokens=max_new_tokens))(target, draft, ids_BxS,
                                                                        rng)
  st = st.replace(lengths=jnp.full((b,), max(max_new_tokens // 2 - g_max - 1, 0), jnp.int32))
  plan = Plan(g_max=g_max, auto=None, max_new_tokens=max_new_tokens,
              sampling=sampling or sampling_lib.Sampling(), eos_id=target.config.eos_token_id,
              stop=stopping.Fixed(), verifier=acceptance.TokenVerifier())
  runner = lambda g: lambda: pinned_trips(target, draft, st, queue, plan=plan, g=g,  # noqa: E731
                                          steps=steps)
  t = timing.time_interleaved({g: runner(g) for g in range(g_max + 1)}, repeats=repeats)
  return Costs(target_K=jnp.asarray(smooth_costs([min(t[g].times_s) for g in range(g_max + 1)]),
                                    jnp.float32), draft=jnp.float32(0.0))


def measured(target, draft, input_ids_BxS, auto: Auto, *, max_new_tokens: int,
             sampling: sampling_lib.Sampling | None = None) -> Auto:
  """`auto` with the cost curve measured at this batch (measure_costs), to reuse across calls."""
  costs = measure_costs(target, draft, input_ids_BxS, g_max=auto.g_max,
                        max_new_tokens=max_new_tokens, sampling=sampling)
  return dataclasses.replace(auto, costs=(tuple(float(c) for c in costs.target_K),
                                          float(costs.draft)))


# ----------------------------------------------------------------------------- entry point


def run(target, draft, input_ids, opts: SpecOptions, rng, *, shrink: bool = True,
        what: str = 'speculative_decode') -> DecodeOutput:
  """Refill decoding of validated options; `draft` None: autoregressive."""
  ids = jnp.asarray(input_ids, jnp.int32) if not isinstance(input_ids, jax.Array) else input_ids
  if draft is None:
    engine.check_inputs(input_ids, opts.max_new_tokens, None, opts.sampling,
                        target.config.vocab_size, None)
  else:
    draft = check_call(target, draft, input_ids, opts)
  q = ids.shape[0]
  b = q if opts.slots is None else min(opts.slots, q)
  g_max = 0 if draft is None else opts.width
  costs = Costs.flat()
  if opts.auto is not None:
    costs = opts.auto.curve() or measure_costs(target, draft, ids[:b], g_max=g_max,
                                               max_new_tokens=opts.max_new_tokens,
                                               sampling=opts.sampling)
  plan = Plan(g_max=g_max, auto=None if opts.auto is None else opts.auto.static(),
              max_new_tokens=opts.max_new_tokens, sampling=opts.sampling,
              eos_id=opts.eos_for(target), stop=opts.stop, verifier=opts.verifier)
  out = refill_program(target, draft, ids, engine.as_key(rng), costs, slots=b, plan=plan,
                       shrink=bool(shrink))
  return engine.checked(out, what, draft, target.config.vocab_size)


def refill_decode(target, draft, input_ids, *, slots, gamma, max_new_tokens, temperature=0.0,
                  top_k=0, top_p=1.0, rng=None, eos_id=None, stop=None, verifier='token',
                  shrink: bool = True, what='speculative_decode') -> DecodeOutput:
  """Validated refill decoding (loop.speculative_decode / autoregressive_decode dispatch here).

  `draft` None: autoregressive. `slots` None: all requests at once (one slot per request).
  `gamma`: an int, 'auto', 'auto:G_MAX' or an Auto (its cost curve measured at this batch when
  it gives none). `shrink` False keeps the full width to the end (for comparisons; tokens are the
  same)."""
  if draft is None:
    gamma, stop, verifier = 1, None, 'token'
  fixed, auto = parse_gamma(gamma)
  opts = SpecOptions.from_kwargs(gamma=fixed, auto=auto, max_new_tokens=max_new_tokens,
                                 temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos_id,
                                 stop=stop, verifier=verifier, slots=slots)
  return run(target, draft, input_ids, opts, rng, shrink=shrink, what=what)
