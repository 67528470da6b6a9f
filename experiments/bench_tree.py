"""Token trees against chains with the same number of verified tokens, side by side in one process.

  python experiments/bench_tree.py [--pairs=tiny,t5-small] [--temps=0,1] [--trees=...]
                                   [--gammas=7,8] [--out=FILE.json] [--allow-loaded]
  python experiments/bench_tree.py --smoke          # seconds, random smoke pair (tests)

Batch 1 (the low-latency setting trees are for). For each pair and temperature every variant
decodes the same test verses, one prompt per call:

  chain g     speculative_decode(gamma=g): the paper's chain, g verified draft tokens per call
  tree S      speculative_decode(tree=S): M(S) verified nodes per call, depth D(S)
  AR          autoregressive decoding

Timed interleaved (specjax.runner.metrics.time_interleaved: compile apart, block_until_ready,
median of --repeats). Tokens per target call, accepted path lengths and nodes per call are pooled
over the timed run and --stat_seeds extra untimed seeds (sampling only); the ratio of a tree to
the chain with the same number of verified tokens (`vs chain`) is the headline. The machine's load
is recorded beside every table (bench_common's load gate). The last line printed (`summary:`)
gives issue 33's two ratios with their goals, the worst over pairs at T = 1: the best tree of
budget 8 (else the largest budget measured) over the chain of that budget in tokens per call, and
the fastest tree over the fastest chain in tok/s, naming the variants.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position

COLUMNS = [
    ('variant', 'variant', ''), ('verified', 'verified / call', 'd'), ('depth', 'depth', 'd'),
    ('tokens_per_call', 'tok / call', '.3f'), ('vs_chain', 'vs chain (same verified)', '.3f'),
    ('se', 'se', '.3f'), ('tokens_per_s', 'tok/s', '.1f'), ('vs_ar', 'vs AR', '.2f'),
    ('ms', 'median ms', '.1f'), ('compile_s', 'compile s', '.1f'), ('hist', 'accepted hist', ''),
]
STATS_COLUMNS = [c for c in COLUMNS if c[0] not in ('tokens_per_s', 'vs_ar', 'ms', 'compile_s')]
DEFAULT_TREES = '((2,1,1,1), (4,1), (2,3), (1,2,1,1), (3,1,1), (2,2,1))'


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--pairs', default='tiny,t5-small', help='comma list of tiny, t5-small')
  p.add_argument('--temps', default='0,1')
  p.add_argument('--trees', default=DEFAULT_TREES, help='trees as branching tuples')
  p.add_argument('--gammas', default='7,8', help='chain gammas to compare against')
  p.add_argument('--n', type=int, default=8, help='prompts (test verses), batch 1 each')
  p.add_argument('--max_new_tokens', type=int, default=48)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--stat_seeds', type=int, default=4,
                 help='extra untimed seeds pooled into the tokens-per-call figures (T > 0)')
  p.add_argument('--stats_only', action='store_true',
                 help='untimed: tokens per target call only (no AR, no timing), e.g. a budget '
                      'sweep with large trees and chains')
  args = bc.parse_bench_args(p, argv, out_default=None,
                             smoke_help='random smoke pair, 2 prompts, 1 repeat')
  if args.smoke:
    args.pairs, args.n, args.repeats, args.stat_seeds, args.max_new_tokens = 'smoke', 2, 1, 0, 12
    args.trees, args.gammas = '((2,1),)', '4'  # tree (2,1) verifies 4 nodes: chain 4
  return args


def variants(args):
  from specjax.decoding import tree as tree_lib  # pylint: disable=import-outside-toplevel
  out = [(f'chain {g}', 'chain', int(g), int(g), int(g)) for g in args.gammas.split(',')]
  for shape in tree_lib.parse_trees(args.trees):
    out.append((f'tree {shape}', 'tree', shape.branching, shape.nodes, shape.depth))
  return out


def _pool(stats_list, kind):
  import numpy as np  # pylint: disable=import-outside-toplevel
  emitted = np.concatenate([np.asarray(s.emitted).ravel() for s in stats_list])
  calls = np.concatenate([np.asarray(s.target_calls).ravel() for s in stats_list])
  hist = sum(np.asarray(s.accepted_hist).sum(0) for s in stats_list)
  return emitted, calls, hist.tolist()


def compare(target, draft, prompts_NxS, *, temperature, variants, max_new_tokens, repeats,
            stat_seeds, timed=True):
  """Times every variant interleaved (batch 1); returns the table rows. timed=False: only the
  statistics (each variant run once per seed, no AR)."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop  # pylint: disable=import-outside-toplevel
  from specjax.runner import metrics  # pylint: disable=import-outside-toplevel

  chunks = [prompts_NxS[i:i + 1] for i in range(prompts_NxS.shape[0])]
  kw = dict(max_new_tokens=max_new_tokens, temperature=temperature)
  last = {}

  def spec_fn(name, kind, arg, seed=0):
    key = 'tree' if kind == 'tree' else 'gamma'
    return bc.keep_chunks(last, name, chunks, lambda x, i: loop.speculative_decode(
        target, draft, x, rng=1000 * seed + i, **{key: arg}, **kw))

  fns = {name: spec_fn(name, kind, arg) for name, kind, arg, _, _ in variants}
  if timed:
    fns['AR'] = bc.keep_chunks(last, 'AR', chunks, lambda x, i: loop.autoregressive_decode(
        target, x, rng=i, **kw))
    timings = metrics.time_interleaved(fns, repeats=repeats)
  else:
    for fn in fns.values():
      fn()
  pooled = {}
  for name, kind, arg, _, _ in variants:
    outs = list(last[name])
    if temperature > 0:
      for seed in range(1, stat_seeds + 1):
        outs += spec_fn(name, kind, arg, seed)()
    pooled[name] = _pool([jax.device_get(o.stats) for o in outs], kind)
  rows = []
  chains = {verified: name for name, kind, _, verified, _ in variants if kind == 'chain'}
  for name, kind, arg, verified, depth in variants + ([('AR', 'ar', None, 0, 0)] if timed else []):
    tokens = sum(int(np.sum(o.lengths)) for o in last[name])
    row = dict(variant=name, verified=verified, depth=depth, tokens=tokens)
    if timed:
      t, ar_s = timings[name], timings['AR'].median_s
      row.update(ms=1e3 * t.median_s, compile_s=t.compile_s, times_s=list(t.times_s),
                 tokens_per_s=tokens / t.median_s, vs_ar=ar_s / t.median_s)
    if name in pooled:
      e, c, hist = pooled[name]
      row.update(tokens_per_call=float(e.sum() / max(c.sum(), 1)), hist=hist, calls=int(c.sum()))
      ref = chains.get(verified)
      if ref is not None and ref != name:
        er, cr, _ = pooled[ref]
        row['vs_chain'] = row['tokens_per_call'] / float(er.sum() / max(cr.sum(), 1))
        row['vs_chain_of'] = ref
        row['se'] = bc.bootstrap_ratio_se(e, c, er, cr)
        if timed:
          row['vs_chain_tokens_per_s'] = row['tokens_per_s'] / (
              sum(int(np.sum(o.lengths)) for o in last[ref]) / timings[ref].median_s)
    rows.append(row)
  return rows


def run_pair(name, args, gate=None, log=print) -> dict:
  import numpy as np  # pylint: disable=import-outside-toplevel

  target, draft, desc, padded, ids = bc.load_bench_pair(name, args.n, smoke=(name == 'smoke'))
  log(f'\n== {name}: {desc}')
  record = {'pair': name, 'description': desc, 'settings': []}
  for temperature in [float(t) for t in args.temps.split(',')]:
    start = gate.mark() if gate is not None else None
    rows = compare(target, draft, np.asarray(padded), temperature=temperature,
                   variants=variants(args), max_new_tokens=args.max_new_tokens,
                   repeats=args.repeats, stat_seeds=args.stat_seeds, timed=not args.stats_only)
    setting = dict(batch=1, temperature=temperature, rows=rows)
    log(f'\n{name}, batch 1, T = {temperature:g}, {len(ids)} prompts x {args.max_new_tokens} new '
        f'tokens (tok / call pooled over {1 + (args.stat_seeds if temperature > 0 else 0)} seeds)')
    log(bc.markdown_table(rows, STATS_COLUMNS if args.stats_only else COLUMNS))
    if gate is not None:
      setting['load'], line = bc.table_load(gate, start)
      log(line)
    record['settings'].append(setting)
  return record


# Issue 33's Done-when ratios (for a dynamic tree; the static trees stand in until it exists).
GOALS = {'tokens_per_call': 1.15, 'tokens_per_s': 1.10}
BUDGET = 8  # verified tokens per call


def summary_line(result) -> str:
  """The run's last line: the best tree against the chain of the same budget (tokens per call) and
  the best tree against the best chain (tok/s), at T = 1 when measured, the worst over pairs."""
  settings = [(p['pair'], s) for p in result['pairs'] for s in p['settings']]
  shown = [x for x in settings if x[1]['temperature'] == 1.0] or settings
  temps = ','.join(sorted({f"{s['temperature']:g}" for _, s in shown}))
  per_call, per_s = [], []  # (ratio, what) per setting
  for pair, s in shown:
    trees = [r for r in s['rows'] if r['variant'].startswith('tree')]
    chains = [r for r in s['rows'] if r['variant'].startswith('chain')]
    budgets = {r['verified'] for r in trees if r.get('vs_chain') is not None}
    budget = BUDGET if BUDGET in budgets else max(budgets, default=None)
    at = [r for r in trees if r['verified'] == budget and r.get('vs_chain') is not None]
    if at:
      best = max(at, key=lambda r: r['vs_chain'])
      per_call.append((best['vs_chain'], f"{pair}: {best['variant']} vs {best['vs_chain_of']}",
                       budget))
    timed = [r for r in trees + chains if 'tokens_per_s' in r]
    if any(r in trees for r in timed) and any(r in chains for r in timed):
      tree = max((r for r in timed if r in trees), key=lambda r: r['tokens_per_s'])
      chain = max((r for r in timed if r in chains), key=lambda r: r['tokens_per_s'])
      per_s.append((tree['tokens_per_s'] / chain['tokens_per_s'],
                    f"{pair}: {tree['variant']} vs {chain['variant']}"))
  call = min(per_call, default=(math.nan, 'not measured', BUDGET))
  speed = min(per_s, default=(math.nan, 'not measured'))
  return (f"summary: static-tree/chain tokens per call T={temps} budget {call[2]} "
          f"{bc.fmt(call[0], '.2f')} (goal {GOALS['tokens_per_call']:.2f}; {call[1]}); "
          f"static-tree/best chain tok/s {bc.fmt(speed[0], '.2f')} "
          f"(goal {GOALS['tokens_per_s']:.2f}; {speed[1]})")


def main(argv=None) -> dict:
  args = parse_args(argv)
  result, gate = bc.run_pairs(args, run_pair)
  result['summary'] = summary_line(result)
  bc.finish_load(gate, result, args.out)
  print(result['summary'])
  return result


if __name__ == '__main__':
  main()
