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
  fns = {'a': proposal_loop(target, draft, batch_BxS, cache_len, gamma, steps),
         'b': target_step_loop(target, batch_BxS, cache_len, 1, cache_len // 2, steps)}
  return _ratio(fns, repeats, rounds)


def proposal_loop(target, draft, batch_BxS, cache_len: int, gamma: int, steps: int = 32):
  """A callable: `steps` proposals of a `gamma`-token block (fixed length, greedy) in one
  compiled loop, at offset cache_len // 2, the drafts fed back."""
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

  return jax.jit(lambda: jax.lax.fori_loop(0, steps, body_fn, (state, seq_BxN))[1])


def target_step_loop(target, batch_BxS, cache_len: int, k: int, offset: int, steps: int = 32):
  """A callable: `steps` K-token target steps at cache offset `offset` in one compiled loop
  (`step_loop`)."""
  ids_BxS = jnp.asarray(batch_BxS)
  b = ids_BxS.shape[0]
  cache = jax.jit(target.init_cache, static_argnums=1)(ids_BxS, cache_len)
  lengths_B = jnp.full((b,), offset, jnp.int32)
  tok_BxK = jnp.zeros((b, k), jnp.int32)
  return lambda: step_loop(target, cache, tok_BxK, lengths_B, steps=steps)


def measure_block_cost(target, batch_BxS, cache_len: int, gamma: int, repeats: int = 15,
                       steps: int = 32, rounds: int = 3) -> float:
  """The target's (gamma+1)-token decode step over its 1-token step, same batch and offsets, each
  timed inside one compiled loop (as `measure_c`, the median of `rounds`): the denominator's
  block cost in `predicted_speedup`."""
  offset = max(cache_len // 2 - gamma - 1, 0)
  return _ratio({'a': target_step_loop(target, batch_BxS, cache_len, gamma + 1, offset, steps),
                 'b': target_step_loop(target, batch_BxS, cache_len, 1, offset, steps)},
                repeats, rounds)


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
  cache_len = max_new_tokens + gamma + 1
  out = {}

  def spec():
    out['o'] = loop.speculative_decode(target, draft, ids_BxS, gamma=gamma, rng=0,
                                       max_new_tokens=max_new_tokens, temperature=temperature)
    return out['o'].tokens

  step = target_step_loop(target, ids_BxS, cache_len, 1, cache_len // 2, steps)
  timings = time_interleaved({'step': step, 'spec': spec}, repeats=repeats)
  stats = jax.device_get(out['o'].stats)
  iters = max(int(stats.iterations), 1)
  t_step = timings['step'].median_s / steps
  t_iter = timings['spec'].median_s / iters
  return t_iter / t_step - block_cost - c * int(stats.draft_passes) / iters


def call_cost_programs(target, draft, batches, *, gamma: int, max_new_tokens: int, rng,
                       sampling: dict, spec_kw: dict, steps: int = 32):
  """The pieces of the per-call prediction (`theory.predicted_sequence_speedup`) as callables,
  for one `time_interleaved` session with a cell's own decodes; and `costs(timings)`, which
  turns that session's timings into the prediction's terms, in the target's 1-token steps.

  Each piece measured in the session it predicts: on small shared hosts the memory's speed
  drifts by 10-30% between minutes, and moves the terms unequally (the target's steps stream
  DRAM, a small draft's passes and the loop's bookkeeping mostly do not), so terms timed in
  other sessions predicted the same cell 16-48% off in either direction; from one session the
  prediction came within 1-16%. The pieces: decodes of 1 and `max_new_tokens` tokens that
  ignore EOS (autoregressive with `sampling`, speculative at `gamma` with `spec_kw` as well),
  whose difference prices a generated token (an iteration) and whose intercept is what a call
  costs besides (the encoders, the first step, dispatch, the copy back); the target's 1- and
  (gamma + 1)-token steps and the draft's gamma-token proposal inside compiled loops."""
  from specjax.decoding import loop  # pylint: disable=import-outside-toplevel
  batches = [jnp.asarray(b) for b in batches]
  cache_len = max_new_tokens + gamma + 1
  offset = max(cache_len // 2 - gamma - 1, 0)  # as measure_block_cost
  outs = {}
  kw = dict(sampling, eos_id=-1)

  def decode(name, n, spec):
    def run():
      if not spec:
        outs[name] = [loop.autoregressive_decode(target, b, rng=jax.random.fold_in(rng, i),
                                                 max_new_tokens=n, **kw)
                      for i, b in enumerate(batches)]
      else:
        outs[name] = [loop.speculative_decode(target, draft, b, gamma=gamma, max_new_tokens=n,
                                              rng=jax.random.fold_in(rng, i), **spec_kw, **kw)
                      for i, b in enumerate(batches)]
      return [o.tokens for o in outs[name]]
    return run

  fns = {'base_1': decode('base_1', 1, False),
         'base_n': decode('base_n', max_new_tokens, False),
         'spec_1': decode('spec_1', 1, True), 'spec_n': decode('spec_n', max_new_tokens, True),
         'step': target_step_loop(target, batches[0], cache_len, 1, offset, steps),
         'block': target_step_loop(target, batches[0], cache_len, gamma + 1, offset, steps),
         'propose': proposal_loop(target, draft, batches[0], cache_len, gamma, steps)}

  def costs(timings) -> dict[str, float]:
    t_step = timings['step'].median_s / steps
    per_call = {k: timings[k].median_s / len(batches) / t_step
                for k in ('base_1', 'base_n', 'spec_1', 'spec_n')}
    iters = {k: sum(int(jnp.max(o.stats.iterations)) for o in outs[k]) / len(batches)
             for k in ('spec_1', 'spec_n')}
    per_token = (per_call['base_n'] - per_call['base_1']) / max(max_new_tokens - 1, 1)
    per_iteration = ((per_call['spec_n'] - per_call['spec_1'])
                     / max(iters['spec_n'] - iters['spec_1'], 1e-9))
    block_cost = timings['block'].median_s / timings['step'].median_s
    proposal = timings['propose'].median_s / timings['step'].median_s
    return {'fixed_base': per_call['base_1'] - per_token, 'base_per_token': per_token,
            'fixed_spec': per_call['spec_1'] - iters['spec_1'] * per_iteration,
            'per_iteration': per_iteration, 'block_cost': block_cost, 'proposal': proposal,
            'overhead': per_iteration - proposal - block_cost, 'step_s': t_step}

  return fns, costs
