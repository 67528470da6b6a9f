"""Measured speedup vs the paper's prediction (Theorem 3.8), and where the difference goes.

  python experiments/bench_bound.py [--gammas=3,5,7] [--temperatures=0,1] [--n=24] [--out=F.json]
  python experiments/bench_bound.py --smoke

Pair: the shipped tiny EN->ES pair (a random stand-in of its shapes while it is absent). Batch 1,
`n` test verses decoded one at a time, max_new_tokens 48.

Per (temperature, gamma) cell:
  measured    = (specjax speculative tokens/s) / (specjax autoregressive tokens/s), the two timed
                interleaved (A B A B) after a warm-up, median of repeats, whole decode calls
                (encoders, loop, host round trip included). Tokens/s because at temperature 1 the
                two produce different samples of different lengths.
  predicted   = Theorem 3.8: (1 - alpha^(g+1)) / ((1 - alpha)(g c + 1)), alpha measured by the
                speculative runs themselves (SpecStats), c = draft step / target step, both one
                token, measured compiled in a loop (below).
  ratio       = measured / predicted (goal >= 0.9).

Per gamma, a cost breakdown measured compiled, each a `lax.fori_loop` of K steps divided by K
(caches carried in the loop, as in the real program; cache length = max_new_tokens + gamma + 1,
rows at half of it):
  target 1    one target decoder step with 1 token (+ argmax fed back)
  draft 1     one draft decoder step with 1 token (+ argmax fed back)
  target g+1  one target decoder step with the (gamma+1)-token verification block
  AR iter     one iteration of the autoregressive loop body (step + sampling + commit)
  spec iter   one `decoding.speculative_step` (propose gamma drafts, verify, accept, stats)
  overhead    spec iter - (gamma * draft 1 + target g+1): work outside the two models' forward
              passes per iteration; and AR iter - target 1 for the baseline.
  init        per call, before the loop: target encoder + cross K/V + empty cache (AR) and the
              same for both models (speculative).
  block cost  target g+1 / target 1: the theorem assumes 1 (verification is free), a CPU does not.
Two refinements of the prediction locate the gap:
  Thm 3.8 w/ block cost   E[tokens per iteration] / (gamma c + block cost): the theorem with the
                          measured cost of verifying gamma+1 tokens instead of assuming it is free
  iteration model         measured tokens per iteration * AR iter / spec iter: all per-iteration
                          costs (including the overhead), but not the per-call ones (two
                          encoders, init, dispatch)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position

CELL_COLUMNS = [
    ('temperature', 'T', 'g'), ('gamma', 'gamma', 'd'), ('alpha', 'alpha', '.3f'),
    ('tokens_per_iter', 'tokens/iter', '.2f'), ('c', 'c', '.3f'),
    ('c_measure_c', 'c (measure_c)', '.3f'),
    ('predicted', 'predicted (Thm 3.8)', '.2f'),
    ('predicted_block', 'Thm 3.8 w/ block cost', '.2f'),
    ('iteration_model', 'iteration model', '.2f'),
    ('measured', 'measured', '.2f'), ('ratio', 'measured / predicted', '.2f'),
    ('ar_tok_s', 'AR tok/s', '.0f'), ('spec_tok_s', 'spec tok/s', '.0f'),
    ('spec_compile_s', 'spec compile s', '.1f'),
]
COST_COLUMNS = [
    ('temperature', 'T', 'g'), ('gamma', 'gamma', 'd'),
    ('target_1_ms', 'target 1 ms', '.3f'), ('draft_1_ms', 'draft 1 ms', '.3f'),
    ('target_block_ms', 'target g+1 ms', '.3f'), ('block_cost', 'block cost', '.2f'),
    ('ar_iter_ms', 'AR iter ms', '.3f'), ('ar_overhead_ms', 'AR overhead ms', '.3f'),
    ('spec_iter_ms', 'spec iter ms', '.3f'), ('models_ms', 'g*draft+block ms', '.3f'),
    ('spec_overhead_ms', 'spec overhead ms', '.3f'),
    ('spec_overhead_frac', 'overhead / iter', '.1%'),
    ('ar_init_ms', 'AR init ms', '.2f'), ('spec_init_ms', 'spec init ms', '.2f'),
]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  bc.add_defaults(p, pair='tiny', gammas='3,5,7', temperatures='0,1', n=24, max_new_tokens=48,
                  repeats=5, cost_repeats=15)
  p.add_argument('--loop_steps', type=int, default=64, help='K of the compiled cost loops')
  a = bc.parse_bench_args(p, argv)
  if a.smoke:
    a.pair, a.gammas, a.temperatures, a.n = 'smoke', '3', '0', 2
    a.max_new_tokens, a.repeats, a.loop_steps, a.cost_repeats = 12, 1, 4, 2
  return a


# ----------------------------------------------------------------------------- compiled costs


def step_loop(model, cache, k_tokens: int, length: int, steps: int):
  """fn(): `steps` decoder steps of k_tokens per row at offset `length`, the argmax fed back,
  in one compiled fori_loop (the cache carried as in the real loop)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  b = cache.enc_mask.shape[0]
  lengths = jnp.full((b,), length, jnp.int32)
  toks = jnp.full((b, k_tokens), 5, jnp.int32)
  run = _jitted()['step']
  return lambda: run(model, cache, toks, lengths, steps=steps)


def ar_loop(model, cache, length: int, steps: int, sampling, max_new_tokens: int):
  """fn(): `steps` calls of decoding.autoregressive_step (the loop body autoregressive_decode runs:
  decoder step, token choice, commit), rows pinned at `length`."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  b = cache.enc_mask.shape[0]
  lengths = jnp.full((b,), length, jnp.int32)
  run = _jitted()['ar']
  key = jax.random.PRNGKey(0)
  return lambda: run(model, cache, lengths, key, steps=steps, sampling=sampling,
                     max_new_tokens=max_new_tokens)


def spec_loop(target, draft, input_ids, gamma: int, max_new_tokens: int, length: int,
              steps: int, sampling):
  """fn(): `steps` calls of decoding.speculative_step on a state whose rows are pinned at
  `length` and never done, so each iteration does the work of a mid-sequence one."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop as decoding  # pylint: disable=import-outside-toplevel
  draft = decoding.as_draft(draft)
  fns = _jitted()
  state0 = fns['spec_init'](target, draft, input_ids, jax.random.PRNGKey(0), gamma=gamma,
                            max_new_tokens=max_new_tokens)
  lengths = jnp.full((input_ids.shape[0],), length, jnp.int32)
  return lambda: fns['spec'](target, draft, state0, lengths, gamma=gamma,
                             max_new_tokens=max_new_tokens, sampling=sampling, steps=steps)


_JITTED = {}


def _jitted():
  """Module-level jitted loops (static: steps, gamma, ...), so equal shapes reuse compilations."""
  if _JITTED:
    return _JITTED
  import functools  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop as decoding  # pylint: disable=import-outside-toplevel

  from specjax.runner.metrics import step_loop as step  # pylint: disable=import-outside-toplevel

  @functools.partial(jax.jit, static_argnames=('steps', 'sampling', 'max_new_tokens'))
  def ar(model, cache, lengths, rng, *, steps, sampling, max_new_tokens):
    b = lengths.shape[0]
    state = decoding.ARState(seq=jnp.zeros((b, max_new_tokens + 1), jnp.int32), lengths=lengths,
                             done=jnp.zeros((b,), bool), cache=cache, rng=rng,
                             step=jnp.int32(0), nan=jnp.bool_(False))

    def body(_, s):
      s = s.replace(lengths=lengths, done=jnp.zeros((b,), bool))
      return decoding.autoregressive_step(model, s, max_new_tokens=max_new_tokens,
                                          sampling=sampling, eos_id=-1)

    return jax.lax.fori_loop(0, steps, body, state).seq

  @functools.partial(jax.jit, static_argnames=('gamma', 'max_new_tokens'))
  def spec_init(target, draft, ids, rng, *, gamma, max_new_tokens):
    return decoding.speculative_init(target, draft, ids, rng, gamma=gamma,
                                     max_new_tokens=max_new_tokens)

  @functools.partial(jax.jit, static_argnames=('gamma', 'max_new_tokens', 'sampling', 'steps'))
  def spec(target, draft, state, lengths, *, gamma, max_new_tokens, sampling, steps):
    b = lengths.shape[0]

    def body(_, s):
      s = s.replace(lengths=lengths, done=jnp.zeros((b,), bool))
      return decoding.speculative_step(target, draft, s, gamma=gamma,
                                       max_new_tokens=max_new_tokens, sampling=sampling,
                                       eos_id=-1)
    return jax.lax.fori_loop(0, steps, body, state).seq

  @functools.partial(jax.jit, static_argnames=('max_len',))
  def init_cache(model, ids, *, max_len):
    return model.init_cache(ids, max_len)

  _JITTED.update(step=step, ar=ar, spec_init=spec_init, spec=spec, init_cache=init_cache)
  return _JITTED


def cost_breakdown(target, draft, input_ids, gamma, temperature, args):
  import jax  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop as decoding  # pylint: disable=import-outside-toplevel
  m = args.max_new_tokens
  cache_len = m + gamma + 1
  length = cache_len // 2
  k = args.loop_steps
  sampling = decoding.make_sampling(temperature)
  init = _jitted()['init_cache']
  tc, dc = init(target, input_ids, max_len=cache_len), init(draft, input_ids, max_len=cache_len)
  fns = {
      'target_1': step_loop(target, tc, 1, length, k),
      'draft_1': step_loop(draft, dc, 1, length, k),
      'target_block': step_loop(target, tc, gamma + 1, length, k),
      'ar_iter': ar_loop(target, init(target, input_ids, max_len=m + 1), m // 2, k, sampling, m),
      'spec_iter': spec_loop(target, draft, input_ids, gamma, m, length, k, sampling),
      # Per-call costs: both encoders + empty caches (speculative) vs the target's (autoregressive).
      'spec_init': lambda: _jitted()['spec_init'](target, decoding.as_draft(draft), input_ids,
                                                  jax.random.PRNGKey(0), gamma=gamma,
                                                  max_new_tokens=m),
      'ar_init': lambda: init(target, input_ids, max_len=m + 1),
  }
  t = bc.interleave(fns, repeats=args.cost_repeats)
  ms = {name: 1e3 * r['median_s'] / (1 if name.endswith('init') else k) for name, r in t.items()}
  # The sweep runner's c (specjax.runner.metrics.measure_c, its own compiled loop): a cross-check.
  from specjax.runner import metrics as runner_metrics  # pylint: disable=import-outside-toplevel
  c_runner = runner_metrics.measure_c(target, draft, input_ids, cache_len,
                                      repeats=max(3, args.cost_repeats))
  models = gamma * ms['draft_1'] + ms['target_block']
  return {
      'temperature': temperature, 'gamma': gamma,
      'target_1_ms': ms['target_1'], 'draft_1_ms': ms['draft_1'],
      'target_block_ms': ms['target_block'], 'block_cost': ms['target_block'] / ms['target_1'],
      'ar_iter_ms': ms['ar_iter'], 'ar_overhead_ms': ms['ar_iter'] - ms['target_1'],
      'spec_iter_ms': ms['spec_iter'], 'models_ms': models,
      'spec_overhead_ms': ms['spec_iter'] - models,
      'spec_overhead_frac': (ms['spec_iter'] - models) / ms['spec_iter'],
      'spec_init_ms': ms['spec_init'], 'ar_init_ms': ms['ar_init'],
      'c': ms['draft_1'] / ms['target_1'], 'c_measure_c': c_runner,
      'compile_s': {n: r['first_s'] for n, r in t.items()},
  }


# ----------------------------------------------------------------------------- end to end


def end_to_end(target, draft, prompts, gamma, temperature, args):
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop as decoding  # pylint: disable=import-outside-toplevel
  m = args.max_new_tokens
  out = {'ar': [], 'spec': []}

  def ar():
    out['ar'] = [decoding.autoregressive_decode(target, x, max_new_tokens=m,
                                                temperature=temperature,
                                                rng=jax.random.PRNGKey(i))
                 for i, x in enumerate(prompts)]
    return [o.tokens for o in out['ar']]

  def spec():
    out['spec'] = [decoding.speculative_decode(target, draft, x, gamma=gamma, max_new_tokens=m,
                                               temperature=temperature,
                                               rng=jax.random.PRNGKey(i))
                   for i, x in enumerate(prompts)]
    return [o.tokens for o in out['spec']]

  t = bc.interleave({'ar': ar, 'spec': spec}, repeats=args.repeats)
  n_ar = sum(int(o.lengths[0]) for o in out['ar'])
  n_spec = sum(int(o.lengths[0]) for o in out['spec'])
  st = [o.stats for o in out['spec']]
  a_sum = sum(float(np.sum(s.alpha_sum)) for s in st)
  a_cnt = sum(int(np.sum(s.alpha_count)) for s in st)
  emitted = sum(int(np.sum(s.emitted)) for s in st)
  iters = sum(int(np.sum(s.target_calls)) for s in st)
  identical = None
  if temperature == 0:
    identical = all(np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
                    for a, b in zip(out['ar'], out['spec']))
  return {
      'ar_s': t['ar']['median_s'], 'spec_s': t['spec']['median_s'],
      'ar_compile_s': t['ar']['first_s'], 'spec_compile_s': t['spec']['first_s'],
      'ar_tokens': n_ar, 'spec_tokens': n_spec,
      'ar_tok_s': n_ar / t['ar']['median_s'], 'spec_tok_s': n_spec / t['spec']['median_s'],
      'alpha': a_sum / max(a_cnt, 1), 'tokens_per_iter': emitted / max(iters, 1),
      'iterations': iters, 'identical_greedy': identical,
  }


def main(argv=None) -> dict:
  args = parse_args(argv)
  gate = bc.load_gate(args)
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.runner import metrics  # pylint: disable=import-outside-toplevel
  info = bc.print_machine()
  target, draft, desc, padded, ids = bc.load_bench_pair(args.pair, args.n, smoke=args.smoke)
  prompts = [jnp.asarray(padded[i:i + 1]) for i in range(len(ids))]
  print(f'pair: {desc}; {len(ids)} prompts, batch 1, source padded to {padded.shape[1]}, '
        f'max_new_tokens {args.max_new_tokens}')
  gammas = [int(g) for g in args.gammas.split(',')]
  temps = [float(t) for t in args.temperatures.split(',')]
  t0 = time.perf_counter()
  costs, cells = [], []
  for temp in temps:
    for g in gammas:
      costs.append(cost_breakdown(target, draft, prompts[0], g, temp, args))
  cost_of = {(c['temperature'], c['gamma']): c for c in costs}
  for temp in temps:
    for g in gammas:
      e = end_to_end(target, draft, prompts, g, temp, args)
      c = cost_of[(temp, g)]['c']
      cost = cost_of[(temp, g)]
      pred = metrics.walltime_improvement(e['alpha'], g, c)
      measured = e['spec_tok_s'] / e['ar_tok_s']
      pred_block = (metrics.expected_tokens_per_call(e['alpha'], g)
                    / (g * c + cost['block_cost']))
      cells.append(dict(e, temperature=temp, gamma=g, c=c, c_measure_c=cost['c_measure_c'],
                        predicted=pred, predicted_block=pred_block, measured=measured,
                        ratio=measured / pred,
                        iteration_model=e['tokens_per_iter'] * cost['ar_iter_ms']
                        / cost['spec_iter_ms']))
      print(f'  T={temp:g} gamma={g}: measured {measured:.2f}x, predicted {pred:.2f}x '
            f'(alpha {e["alpha"]:.3f}, c {c:.3f})', flush=True)
  print('\nSpeedup vs prediction (batch 1, tokens/s ratios, median of interleaved repeats)')
  print(bc.markdown_table(cells, CELL_COLUMNS))
  print('\nPer-iteration costs, compiled (ms, median; overhead = work outside the forward passes)')
  print(bc.markdown_table(costs, COST_COLUMNS))
  ratios = [c['ratio'] for c in cells]
  print(f'\nmeasured / predicted: min {min(ratios):.2f}, max {max(ratios):.2f} (goal >= 0.9)')
  result = {'machine': info, 'args': vars(args), 'pair': desc, 'cells': cells, 'costs': costs,
            'wall_s': time.perf_counter() - t0, 'load_average_end': bc.load_average()}
  bc.finish_load(gate, result, args.out)
  return result


if __name__ == '__main__':
  main()
