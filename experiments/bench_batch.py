"""Speculative vs autoregressive tokens/s as the batch grows (ragged per-row acceptance).

  python experiments/bench_batch.py [--batches=1,8,32] [--lengths=32,96] [--gamma=5] [--out=F.json]
  python experiments/bench_batch.py --smoke

Pair: the shipped tiny EN->ES pair (random stand-in of its shapes while it is absent). For each
batch size B and output length M, the same N = max(batches) test verses (one padded source length
for all) are decoded as N / B batches of B rows by `autoregressive_decode` and by
`speculative_decode(gamma)`, greedy, timed interleaved (A B A B) after a warm-up (compile time
reported apart), median of repeats.

tokens/s counts each row's own generated tokens (EOS included, nothing after it). Also reported,
to show where a batch loses the speedup:
  loop iters     trips of the while loop per call (target calls for the batch)
  mean row iters mean over rows of the iterations in which the row was still generating
  row util       mean row iters / loop iters: the loop runs until the LAST row finishes and every
                 row pays for every trip (finished rows compute and discard), so a slow row (low
                 acceptance, long output) costs the whole batch
  AR steps / mean AR row length: the same effect for the baseline (longest output sets the steps)
  block cost     time of one target step with gamma+1 tokens per row / one with 1 token, at this
                 batch: the theorem assumes verification is free (1.0); it stops being free once
                 the step is compute-bound (B * (gamma+1) tokens per matmul).

  python experiments/bench_batch.py --refill [--batches=1,8,32,64] [--temperatures=0,1]
      [--gammas=1,2,3,5] [--n=64] [--lengths=32]

Slot refill (specjax.decoding.refill): the same N verses as ONE queue decoded with slots=B, against
the lockstep loop above (N / B calls of B rows), for autoregressive and speculative (--gamma)
decoding, every fixed gamma of --gammas with refill, and gamma='auto:max(gammas)'. Per cell:
tokens/s, row util (row-iterations that advanced a request / all paid), tokens per target call,
refill / lockstep, and auto / the best of (autoregressive, every fixed gamma), all with refill.
Utilisation and tokens per call do not depend on the machine's load; tokens/s ratios do.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position

COLUMNS = [
    ('batch', 'batch', 'd'), ('max_new_tokens', 'new tokens', 'd'),
    ('ar_tok_s', 'AR tok/s', '.0f'), ('spec_tok_s', 'spec tok/s', '.0f'),
    ('speedup', 'speedup', '.2f'), ('alpha', 'alpha', '.3f'),
    ('loop_iters', 'loop iters / call', '.1f'), ('mean_row_iters', 'mean row iters', '.1f'),
    ('row_util', 'row util', '.0%'), ('ar_steps', 'AR steps / call', '.1f'),
    ('mean_len', 'mean row len', '.1f'), ('block_cost', 'block cost', '.2f'),
    ('ar_compile_s', 'AR compile s', '.1f'), ('spec_compile_s', 'spec compile s', '.1f'),
]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  bc.add_defaults(p, pair='tiny', batches='1,8,32', lengths='32,96', gamma=5, temperature=0.0,
                  repeats=5)
  p.add_argument('--refill', action='store_true', help='slot refill and gamma=auto tables')
  p.add_argument('--temperatures', default='0,1', help='--refill: temperatures')
  p.add_argument('--gammas', default='1,2,3,5', help='--refill: fixed gammas compared with auto')
  p.add_argument('--n', type=int, default=0, help='--refill: verses in the queue (max batch)')
  p.add_argument('--shrink_compare', action='store_true',
                 help='--refill: also time the refill loop without its tail shrinking')
  a = bc.parse_bench_args(p, argv)
  if a.smoke:
    a.pair, a.batches, a.lengths, a.repeats, a.gamma = 'smoke', '1,2', '12', 1, 3
    a.temperatures, a.gammas, a.n = '0', '1,3', 4
  return a


def block_cost(target, ids, gamma: int, cache_len: int, steps: int = 16, repeats: int = 5):
  """(gamma+1)-token / 1-token target step time at this batch, compiled loops (bench_bound)."""
  import bench_bound  # pylint: disable=import-outside-toplevel
  cache = bench_bound._jitted()['init_cache'](target, ids, max_len=cache_len)  # pylint: disable=protected-access
  t = bc.interleave({'1': bench_bound.step_loop(target, cache, 1, cache_len // 2, steps),
                     'g1': bench_bound.step_loop(target, cache, gamma + 1, cache_len // 2, steps)},
                    repeats=repeats)
  return t['g1']['median_s'] / t['1']['median_s']


REFILL_COLUMNS = [
    ('temperature', 'T', 'g'), ('batch', 'B', 'd'), ('mode', 'decoder', 's'),
    ('tok_s', 'tok/s', '.0f'), ('row_util', 'row util', '.0%'),
    ('tokens_per_call', 'tokens / target call', '.2f'), ('vs_lockstep', 'refill / lockstep', '.2f'),
    ('vs_best', 'vs best fixed', '.2f'), ('gamma_hist', 'gamma hist (0..)', 's'),
    ('compile_s', 'first call s', '.1f'),
]


def refill_rows(args, target, draft, padded, temperature: float, b: int, m: int):
  """One (T, B) cell of the --refill table: lockstep and refill, autoregressive, fixed gammas and
  auto, timed interleaved in one process."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop as decoding  # pylint: disable=import-outside-toplevel
  from specjax.runner.metrics import keep_outputs  # pylint: disable=import-outside-toplevel
  n = padded.shape[0]
  queue = jnp.asarray(padded)
  xs = [queue[i:i + b] for i in range(0, n - b + 1, b)]
  kw = dict(max_new_tokens=m, temperature=temperature, rng=jax.random.PRNGKey(0))
  gammas = [int(g) for g in args.gammas.split(',')]
  out = {}
  keep = functools.partial(keep_outputs, out)
  fns = {
      'AR lockstep': keep('AR lockstep', lambda: [
          decoding.autoregressive_decode(target, x, **kw) for x in xs]),
      f'spec g={args.gamma} lockstep': keep(f'spec g={args.gamma} lockstep', lambda: [
          decoding.speculative_decode(target, draft, x, gamma=args.gamma, **kw) for x in xs]),
      'AR refill': keep('AR refill', lambda: [
          decoding.autoregressive_decode(target, queue, slots=b, **kw)]),
  }
  from specjax.decoding import refill  # pylint: disable=import-outside-toplevel
  if getattr(args, 'shrink_compare', False) and b >= 2 * refill.SHRINK_MIN:
    # the refill loop without its tail shrinking (which needs B >= 2 * SHRINK_MIN)
    fns['AR refill full width'] = keep('AR refill full width', lambda: [refill.refill_decode(
        target, None, queue, slots=b, gamma=None, shrink=False, what='autoregressive_decode',
        **kw)])
    fns[f'spec g={args.gamma} refill full width'] = keep(
        f'spec g={args.gamma} refill full width', lambda: [refill.refill_decode(
            target, draft, queue, slots=b, gamma=args.gamma, shrink=False, **kw)])
  for g in sorted(set(gammas + [args.gamma])):
    fns[f'spec g={g} refill'] = keep(f'spec g={g} refill', lambda g=g: [
        decoding.speculative_decode(target, draft, queue, gamma=g, slots=b, **kw)])
  # gamma='auto' measures its cost curve at every call unless it is given one: measure it once.
  auto = refill.measured(target, draft, queue[:b], refill.Auto(g_max=max(gammas)),
                         max_new_tokens=m, sampling=decoding.make_sampling(temperature))
  fns['spec auto refill'] = keep('spec auto refill', lambda: [
      decoding.speculative_decode(target, draft, queue, auto=auto, slots=b, **kw)])
  t = bc.interleave(fns, repeats=args.repeats, shuffle=True)
  rows = []
  for name in fns:
    outs = out[name]
    tokens = sum(int(np.sum(o.lengths)) for o in outs)
    row = {'temperature': temperature, 'batch': b, 'mode': name,
           'tok_s': tokens / t[name]['median_s'], 'median_s': t[name]['median_s'],
           'compile_s': t[name]['first_s'], 'tokens': tokens}
    if name == 'AR lockstep':
      row['row_util'] = tokens / max(sum(int(o.stats['steps']) for o in outs) * b, 1)
      row['tokens_per_call'] = 1.0
    else:
      busy = sum(int(np.sum(o.stats.target_calls)) for o in outs)
      paid = sum(int(getattr(o.stats, 'row_iterations', int(o.stats.iterations) * b))
                 for o in outs)  # refill: the width halves in the tail
      row['row_util'] = busy / max(paid, 1)
      row['tokens_per_call'] = sum(int(np.sum(o.stats.emitted)) for o in outs) / max(busy, 1)
    if hasattr(outs[0].stats, 'gamma_hist') and 'auto' in name:
      row['gamma_hist'] = '/'.join(str(v) for v in np.asarray(outs[0].stats.gamma_hist))
    rows.append(row)
  by = {r['mode']: r for r in rows}
  by['AR refill']['vs_lockstep'] = by['AR refill']['tok_s'] / by['AR lockstep']['tok_s']
  main_g = f'spec g={args.gamma}'
  by[f'{main_g} refill']['vs_lockstep'] = (by[f'{main_g} refill']['tok_s']
                                           / by[f'{main_g} lockstep']['tok_s'])
  fixed = [r for r in rows if r['mode'] == 'AR refill' or
           (r['mode'].startswith('spec g=') and r['mode'].endswith('refill'))]
  best = max(fixed, key=lambda r: r['tok_s'])
  by['spec auto refill']['vs_best'] = by['spec auto refill']['tok_s'] / best['tok_s']
  by['spec auto refill']['best_fixed'] = best['mode']
  if temperature == 0:  # greedy: every decoder must give the same tokens
    ref = np.concatenate([np.asarray(o.tokens) for o in out['AR lockstep']])
    for r in rows:
      got = np.concatenate([np.asarray(o.tokens) for o in out[r['mode']]])
      r['identical_greedy'] = bool(np.array_equal(got, ref))
  return rows


def main_refill(args, gate) -> dict:
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  info = bc.print_machine()
  batches = [int(b) for b in args.batches.split(',')]
  m = int(args.lengths.split(',')[0])
  n = args.n or max(batches)
  target, draft, desc, padded, _ = bc.load_bench_pair(args.pair, n, smoke=args.smoke)
  print(f'pair: {desc}; {n} verses as one queue, {m} new tokens, source padded to '
        f'{padded.shape[1]}, lockstep gamma {args.gamma}, fixed gammas {args.gammas}')
  t0 = time.perf_counter()
  rows = []
  for temperature in [float(x) for x in args.temperatures.split(',')]:
    for b in batches:
      cell = refill_rows(args, target, draft, padded, temperature, b, m)
      rows += cell
      auto = [r for r in cell if r['mode'] == 'spec auto refill'][0]
      print(f"  T={temperature:g} B={b}: " + ', '.join(
          f"{r['mode']} {r['tok_s']:.0f} tok/s ({r['row_util']:.0%})" for r in cell)
          + f"; auto/best {auto['vs_best']:.2f} (best {auto['best_fixed']})", flush=True)
  rec, line = bc.table_load(gate)
  print('\nSlot refill and gamma=auto')
  print(bc.markdown_table(rows, REFILL_COLUMNS))
  print(line)
  bad = [r for r in rows if r.get('identical_greedy') is False]
  if bad:
    print(f'WARNING: greedy tokens differ from autoregressive in {len(bad)} cells')
  result = {'machine': info, 'args': vars(args), 'pair': desc, 'refill_rows': rows,
            'wall_s': time.perf_counter() - t0, 'table_load': rec}
  bc.finish_load(gate, result, args.out)
  return result


def main(argv=None) -> dict:
  args = parse_args(argv)
  gate = bc.load_gate(args)
  if args.refill:
    return main_refill(args, gate)
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop as decoding  # pylint: disable=import-outside-toplevel
  info = bc.print_machine()
  batches = [int(b) for b in args.batches.split(',')]
  lengths = [int(m) for m in args.lengths.split(',')]
  target, draft, desc, padded, _ = bc.load_bench_pair(args.pair, max(batches), smoke=args.smoke)
  print(f'pair: {desc}; gamma {args.gamma}, temperature {args.temperature:g}, source padded to '
        f'{padded.shape[1]}')
  t0 = time.perf_counter()
  rows = []
  n = max(batches)
  for m in lengths:
    for b in batches:
      # Every configuration decodes the same n verses: n // b calls of a [b, S] batch.
      xs = [jnp.asarray(padded[i:i + b]) for i in range(0, n - b + 1, b)]
      out = {}

      def ar(xs=xs, m=m):
        out['ar'] = [decoding.autoregressive_decode(target, x, max_new_tokens=m,
                                                    temperature=args.temperature,
                                                    rng=jax.random.PRNGKey(0)) for x in xs]
        return [o.tokens for o in out['ar']]

      def spec(xs=xs, m=m):
        out['spec'] = [decoding.speculative_decode(target, draft, x, gamma=args.gamma,
                                                   max_new_tokens=m, temperature=args.temperature,
                                                   rng=jax.random.PRNGKey(0)) for x in xs]
        return [o.tokens for o in out['spec']]

      t = bc.interleave({'ar': ar, 'spec': spec}, repeats=args.repeats)
      a_out, s_out = out['ar'], out['spec']
      n_ar = sum(int(np.sum(o.lengths)) for o in a_out)
      n_spec = sum(int(np.sum(o.lengths)) for o in s_out)
      loop_iters = sum(int(o.stats.iterations) for o in s_out)
      row_iters = np.concatenate([np.asarray(o.stats.target_calls) for o in s_out])
      a_sum = sum(float(np.sum(o.stats.alpha_sum)) for o in s_out)
      a_cnt = sum(int(np.sum(o.stats.alpha_count)) for o in s_out)
      row = {
          'batch': b, 'max_new_tokens': m, 'calls': len(xs),
          'ar_s': t['ar']['median_s'], 'spec_s': t['spec']['median_s'],
          'ar_tok_s': n_ar / t['ar']['median_s'], 'spec_tok_s': n_spec / t['spec']['median_s'],
          'alpha': a_sum / max(a_cnt, 1),
          'loop_iters': loop_iters / len(xs),  # per call
          'mean_row_iters': float(row_iters.mean()),
          'row_util': float(row_iters.mean()) * len(xs) / max(loop_iters, 1),
          'ar_steps': sum(int(o.stats['steps']) for o in a_out) / len(xs),
          'mean_len': float(np.mean(np.concatenate([np.asarray(o.lengths) for o in a_out]))),
          'ar_compile_s': t['ar']['first_s'], 'spec_compile_s': t['spec']['first_s'],
          'identical_greedy': (all(np.array_equal(np.asarray(a.tokens), np.asarray(s.tokens))
                                   for a, s in zip(a_out, s_out))
                               if args.temperature == 0 else None),
      }
      row['speedup'] = row['spec_tok_s'] / row['ar_tok_s']
      row['block_cost'] = block_cost(target, xs[0], args.gamma, m + args.gamma + 1,
                                     steps=4 if args.smoke else 16,
                                     repeats=1 if args.smoke else args.repeats)
      rows.append(row)
      print(f"  B={b} M={m}: AR {row['ar_tok_s']:.0f} tok/s, spec {row['spec_tok_s']:.0f} tok/s, "
            f"speedup {row['speedup']:.2f}x, row util {row['row_util']:.0%}, "
            f"block cost {row['block_cost']:.2f}", flush=True)
  print('\nBatch scaling (greedy)' if args.temperature == 0 else '\nBatch scaling')
  print(bc.markdown_table(rows, COLUMNS))
  for m in lengths:
    sp = ', '.join(f"B={r['batch']}: {r['speedup']:.2f}x" for r in rows
                   if r['max_new_tokens'] == m)
    print(f'speedup at {m} new tokens: {sp}')
  bad = [r for r in rows if r['identical_greedy'] is False]
  if bad:
    print(f'WARNING: greedy speculative differs from autoregressive in {len(bad)} cells')
  result = {'machine': info, 'args': vars(args), 'pair': desc, 'rows': rows,
            'wall_s': time.perf_counter() - t0, 'load_average_end': bc.load_average()}
  bc.finish_load(gate, result, args.out)
  return result


if __name__ == '__main__':
  main()
