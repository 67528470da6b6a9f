"""The paper's cost model and honest timing helpers.

alpha: expected acceptance E[sum_x min(p(x), q(x))]; gamma: drafts per iteration; c: draft/target
cost ratio per decode step; c_hat: draft/target arithmetic ratio per token.

Timing: compile time apart, block_until_ready, median of repeats, candidates interleaved; `measure_c`
times one decoder step of draft and target inside compiled loops. Shapes: B batch, S source, K fed.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

import jax
import jax.numpy as jnp

from specjax import ops
from specjax.decoding.theory import (expected_tokens_per_call, operations_factor,  # noqa: F401
                                     optimal_gamma, predicted_sequence_speedup,
                                     predicted_speedup, walltime_improvement)
from specjax.programs import typed_jit
from specjax.timing import Timing, block, time_call, time_interleaved  # noqa: F401


def keep_outputs(outputs: dict, name: str, fn: Callable[[], list]) -> Callable[[], list]:
  """fn (a list of decode outputs) made timeable: the last call's outputs kept in outputs[name],
  so statistics are read from the timed runs without another one; their tokens returned (what the
  timer blocks on)."""
  def run():
    outputs[name] = fn()
    return [o.tokens for o in outputs[name]]
  return run


# ----------------------------------------------------------------------------- c, measured


@typed_jit(static_argnames=('steps',))
def step_loop(model, cache, tokens_BxK, lengths_B, *, steps):
  """`steps` decoder steps of K tokens per row at fixed offsets in one program, the cache carried
  and the argmax fed back (nothing is dead code). Used to time steps as the decode loops run them."""
  def body_fn(_, carry):
    cache, tokens_BxK = carry
    logits_BxKxV, cache = model.decode(cache, tokens_BxK, lengths_B)
    return cache, ops.argmax(logits_BxKxV)
  return jax.lax.fori_loop(0, steps, body_fn, (cache, tokens_BxK))[1]


def paired_ratio(a: Timing, b: Timing) -> float:
  """a / b as the median of the repeats' paired ratios, for timings from one `time_interleaved`:
  each repeat of a is timed right before its partner of b, so a drift of the host between
  repeats (10-50% on small shared VMs) cancels within a pair, where the ratio of the two medians
  can pair a slow phase of one with a fast phase of the other."""
  return statistics.median(x / y for x, y in zip(a.times_s, b.times_s))


def _ratio(fns: dict[str, Callable[[], Any]], repeats: int, rounds: int) -> float:
  """fns['a'] / fns['b'] in time: the median over `rounds` of each round's ratio of interleaved
  medians. On a small shared host a round's ratio can move by 20% (a neighbour's burst, or a
  speed phase of the VM that lasts a few rounds); the middle of three rounds discards one such
  round, though not a phase that outlasts all three."""
  ratios = []
  for _ in range(rounds):
    timings = time_interleaved(fns, repeats=repeats)
    ratios.append(timings['a'].median_s / timings['b'].median_s)
  return statistics.median(ratios)


def measure_c(target, draft, batch_BxS, cache_len: int, repeats: int = 15,
              steps: int = 32, rounds: int = 3) -> float:
  """c = draft / target time of one decode step, same batch and lengths, each timed inside one
  compiled loop of `steps` steps: the speculative loop runs its steps inside one program, so a
  per-call timing would add the ~0.1 ms dispatch to both and inflate c for small drafts.
  A feature head's step is its one-token pass (`FeatureHeadDraft.decode`). Drafts without a
  decoder (n-gram, prompt lookup) cost ~0: c = 0."""
  from specjax.decoding import protocol  # pylint: disable=import-outside-toplevel
  feature_draft = protocol.reads_target(draft)
  if not hasattr(draft, 'init_cache') and not feature_draft:
    return 0.0
  ids_BxS = jnp.asarray(batch_BxS)
  b = ids_BxS.shape[0]
  tok_Bx1 = jnp.zeros((b, 1), jnp.int32)
  lengths_B = jnp.full((b,), cache_len // 2, jnp.int32)
  target_cache = jax.jit(target.init_cache, static_argnums=1)(ids_BxS, cache_len)

  def stepper(model):
    if model is target:
      cache = target_cache
    elif feature_draft:  # a head's state reads the target's cache (its cross K/V)
      cache = jax.jit(lambda c: model.init(ids_BxS, cache_len, target_cache=c))(target_cache)
    else:
      cache = jax.jit(model.init_cache, static_argnums=1)(ids_BxS, cache_len)
    return lambda: step_loop(model, cache, tok_Bx1, lengths_B, steps=steps)

  return _ratio({'a': stepper(draft), 'b': stepper(target)}, repeats, rounds)


def measure_proposal_cost(target, draft, batch_BxS, cache_len: int, gamma: int,
                          repeats: int = 15, steps: int = 32, rounds: int = 3) -> float:
  """What drafting one block of `gamma` tokens costs, in the target's 1-token steps: the draft's
  `propose` (every pass it makes for the block: a sequential head's window pass and gamma - 1
  one-token passes, a parallel head's one pass, a T5 draft's gamma steps) over the target's
  1-token step, each timed inside one compiled loop of `steps` calls at the same offsets (as
  `measure_c`). gamma * c prices a sequential draft's block; this measures any draft's."""
  from specjax.decoding import model_draft, protocol, stopping  # pylint: disable=import-outside-toplevel
  from specjax.decoding.sampling import Sampling  # pylint: disable=import-outside-toplevel
  draft = model_draft.as_draft(draft)
  ids_BxS = jnp.asarray(batch_BxS)
  b = ids_BxS.shape[0]
  lengths_B = jnp.full((b,), cache_len // 2, jnp.int32)
  target_cache = jax.jit(target.init_cache, static_argnums=1)(ids_BxS, cache_len)
  state = jax.jit(lambda c: protocol.init_draft(draft, ids_BxS, cache_len, c))(target_cache)
  seq_BxN = jnp.ones((b, cache_len + gamma + 2), jnp.int32)
  keys_B = jax.random.split(jax.random.PRNGKey(0), b)
  limit_B = jnp.full((b,), gamma, jnp.int32)

  def body_fn(_, carry):
    st, seq = carry
    prop = draft.propose(st, seq, lengths_B, keys_B, gamma, Sampling(temperature=0.0),
                         stop=stopping.Fixed(), limit_B=limit_B)
    return prop.state, seq.at[:, 1].set(prop.tokens_BxG[:, -1])  # the drafts feed the next

  fns = {'a': lambda: jax.lax.fori_loop(0, steps, body_fn, (state, seq_BxN))[1],
         'b': lambda: step_loop(target, target_cache, jnp.zeros((b, 1), jnp.int32), lengths_B,
                                steps=steps)}
  return _ratio({k: jax.jit(f) for k, f in fns.items()}, repeats, rounds)


def measure_block_cost(target, batch_BxS, cache_len: int, gamma: int, repeats: int = 15,
                       steps: int = 32, rounds: int = 3) -> float:
  """The target's (gamma+1)-token decode step over its 1-token step, same batch and offsets, each
  timed inside one compiled loop (as `measure_c`, the median of `rounds`): the denominator's
  block cost in `predicted_speedup`."""
  ids_BxS = jnp.asarray(batch_BxS)
  b = ids_BxS.shape[0]
  lengths_B = jnp.full((b,), max(cache_len // 2 - gamma - 1, 0), jnp.int32)
  cache = jax.jit(target.init_cache, static_argnums=1)(ids_BxS, cache_len)

  def stepper(k):
    tok_BxK = jnp.zeros((b, k), jnp.int32)
    return lambda: step_loop(target, cache, tok_BxK, lengths_B, steps=steps)

  return _ratio({'a': stepper(gamma + 1), 'b': stepper(1)}, repeats, rounds)


def measure_overhead(target, draft, prompts_BxS, *, gamma: int, c: float, block_cost: float,
                     max_new_tokens: int, temperature: float = 0.0, repeats: int = 5,
                     steps: int = 32) -> float:
  """o: what one speculative iteration costs beyond its model passes, in 1-token target steps.

  The paper's cost model charges an iteration block_cost(gamma) + passes c target steps; the
  loop also samples, verifies, commits and carries its state, which on a CPU with small models is
  a sizeable fraction of a step. Measured as T_iter / t_step - block_cost - passes c, with
  T_iter the median time of a fixed-gamma speculative_decode of `prompts_BxS` over its iterations
  and t_step the target's 1-token step inside a compiled loop (as `measure_c`). Cost-aware rules
  add it to the price of every iteration (stopping.Budget's `overhead`)."""
  from specjax.decoding import loop  # pylint: disable=import-outside-toplevel
  ids_BxS = jnp.asarray(prompts_BxS)
  b = ids_BxS.shape[0]
  cache_len = max_new_tokens + gamma + 1
  cache = jax.jit(target.init_cache, static_argnums=1)(ids_BxS, cache_len)
  tok_Bx1 = jnp.zeros((b, 1), jnp.int32)
  lengths_B = jnp.full((b,), cache_len // 2, jnp.int32)
  out = {}

  def spec():
    out['o'] = loop.speculative_decode(target, draft, ids_BxS, gamma=gamma, rng=0,
                                       max_new_tokens=max_new_tokens, temperature=temperature)
    return out['o'].tokens

  timings = time_interleaved(
      {'step': lambda: step_loop(target, cache, tok_Bx1, lengths_B, steps=steps), 'spec': spec},
      repeats=repeats)
  stats = jax.device_get(out['o'].stats)
  iters = max(int(stats.iterations), 1)
  t_step = timings['step'].median_s / steps
  t_iter = timings['spec'].median_s / iters
  return t_iter / t_step - block_cost - c * int(stats.draft_passes) / iters


def measure_call_cost(target, draft, batches, *, gamma: int = 0, lengths=(1, 32),
                      temperature: float = 0.0, repeats: int = 5, steps: int = 32):
  """(fixed, per_unit): what decoding `batches` (one call per batch, EOS ignored) costs, in the
  target's 1-token steps per call, as a straight line through two output lengths. per_unit is
  per generated token for autoregressive decoding (`draft` None), per iteration for speculative
  decoding at `gamma`; fixed is what a call costs besides -- the encoders over the source, the
  first step, dispatch, the result's copy back. Theorem 3.8 prices only the steps; on a small
  model the fixed part is a sizeable share of a short decode, and speculation does not shorten
  it (`theory.predicted_sequence_speedup`). The cost per token grows with the cache length, so
  the long length should be the decodes' own max_new_tokens; the short one, 1, makes `fixed`
  the 1-length call minus one unit (the least leaning on the slope)."""
  from specjax.decoding import loop  # pylint: disable=import-outside-toplevel
  batches = [jnp.asarray(b) for b in batches]
  b0 = batches[0]
  cache_len = max(lengths) + gamma + 1
  cache = jax.jit(target.init_cache, static_argnums=1)(b0, cache_len)
  tok_Bx1 = jnp.zeros((b0.shape[0], 1), jnp.int32)
  lengths_B = jnp.full((b0.shape[0],), cache_len // 2, jnp.int32)
  outs = {}

  def decode(n):
    def run():
      if draft is None:
        outs[n] = [loop.autoregressive_decode(target, b, rng=i, max_new_tokens=n, eos_id=-1,
                                              temperature=temperature)
                   for i, b in enumerate(batches)]
      else:
        outs[n] = [loop.speculative_decode(target, draft, b, gamma=gamma, rng=i, eos_id=-1,
                                           max_new_tokens=n, temperature=temperature)
                   for i, b in enumerate(batches)]
      return [o.tokens for o in outs[n]]
    return run

  fns = {n: decode(n) for n in lengths}
  fns['step'] = lambda: step_loop(target, cache, tok_Bx1, lengths_B, steps=steps)
  timings = time_interleaved(fns, repeats=repeats)
  t_step = timings['step'].median_s / steps
  short, long = sorted(lengths)

  def units(n):  # per call
    if draft is None:
      return float(n)
    return sum(int(jnp.max(o.stats.iterations)) for o in outs[n]) / len(batches)

  per_call = {n: timings[n].median_s / len(batches) / t_step for n in lengths}
  per_unit = (per_call[long] - per_call[short]) / max(units(long) - units(short), 1e-9)
  return per_call[short] - units(short) * per_unit, per_unit
