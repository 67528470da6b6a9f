"""Token trees (static and dynamic) against chains with the same number of verified tokens, side by
side in one process.

  python experiments/bench_tree.py [--pairs=tiny,t5-small] [--temps=0,1] [--draft=model|head]
                                   [--trees='(2,1,1,1);dynamic:8,4,2,1'] [--gammas=4,8,16]
                                   [--out=FILE.json] [--allow-loaded]
  python experiments/bench_tree.py --smoke          # seconds, random smoke pair (tests)

Batch 1 (the low-latency setting trees are for). For each pair and temperature every variant
decodes the same test verses, one prompt per call:

  chain g        speculative_decode(gamma=g): the paper's chain, g verified draft tokens per call
  tree (b1,..)   a static tree: M = b1 + b1 b2 + .. verified nodes per call, depth D
  dynamic:M,b..  a dynamic tree (specjax.decoding.dynamic_tree): the draft expands the template
                 (b1, b2, ..), the target verifies the M nodes the draft rates most likely to be
                 accepted, chosen per row and call (':reach=L' the 'reach' score)
  AR             autoregressive decoding

--draft=model drafts with the pair's small T5; --draft=head with the shipped feature head (the
tiny pair only; smoke: a random head). The default trees are budgets 4, 8 and 16, each as a
static tree and as a dynamic one, beside chains of gamma 4, 8 and 16.

At temperature 0 every variant's tokens are checked against AR's (column `= AR`: greedy
speculative decoding must be token-identical). Timed interleaved
(specjax.runner.metrics.time_interleaved: compile apart, block_until_ready, median of --repeats).
Tokens per target call, accepted path lengths and nodes per call are pooled over the timed run
and --stat_seeds extra untimed seeds (sampling only); the ratio of a tree to the chain with the
same number of verified tokens (`vs chain`) is the headline. The machine's load
is recorded beside every table (bench_common's load gate). With --out a plot of tokens/s against
the verify budget, one line per method (chain, static tree, dynamic tree), is written beside the
JSON. The last line printed (`summary:`) gives issue 33's two ratios with their goals, the worst
over pairs at T = 1: the best dynamic tree of budget 8 (else the largest budget measured) over the
chain of that budget in tokens per call, and the fastest dynamic tree over the fastest chain in
tok/s, naming the variants; then the same two for the static trees.
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
    ('ms', 'median ms', '.1f'), ('compile_s', 'compile s', '.1f'), ('identical', '= AR (T=0)', ''),
    ('hist', 'accepted hist', ''),
]
STATS_COLUMNS = [c for c in COLUMNS
                 if c[0] not in ('tokens_per_s', 'vs_ar', 'ms', 'compile_s', 'identical')]
# Budgets 4, 8 and 16: a static tree, then dynamic trees over deep templates (the chain's depth
# with a second candidate at the root or the first two levels), with the 'mass' score and with
# 'reach=0.1' (a sharper acceptance estimate, better suited to a well-aligned draft such as the
# feature head).
DEFAULT_TREES = ';'.join([
    '(2,1)', 'dynamic:4,2,1,1,1,1', 'dynamic:4,2,1,1,1,1:reach=0.1',
    '(2,1,1,1)', 'dynamic:8,2,1,1,1,1,1,1,1', 'dynamic:8,2,1,1,1,1,1,1,1:reach=0.1',
    'dynamic:8,2,2,1,1,1,1,1:reach=0.1',
    '(2,1,1,1,1,1,1,1)', 'dynamic:16,2,2,1,1,1,1,1,1,1,1',
    'dynamic:16,2,2,1,1,1,1,1,1,1,1:reach=0.1'])


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--pairs', default='tiny,t5-small', help='comma list of tiny, t5-small')
  p.add_argument('--temps', default='0,1')
  p.add_argument('--trees', default=DEFAULT_TREES,
                 help="trees separated by ';': branching tuples (2,1,1,1) or dynamic:M,b1,b2,..")
  p.add_argument('--gammas', default='4,8,16', help='chain gammas to compare against')
  p.add_argument('--draft', default='model', choices=('model', 'head'),
                 help="the pair's small T5 draft, or the feature head on the target's features")
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
    # tree (2,1) and the dynamic tree verify 4 nodes: chain 4
    args.trees, args.gammas = '(2,1);dynamic:4,2,2', '4'
  return args


def variants(args):
  """[(name, kind, argument, verified tokens per call, depth)]; kind chain, tree or dynamic."""
  from specjax.decoding import shapes  # pylint: disable=import-outside-toplevel
  out = [(f'chain {g}', 'chain', int(g), int(g), int(g)) for g in args.gammas.split(',')]
  for shape in shapes.parse_trees(args.trees):
    if isinstance(shape, shapes.DynamicTree):
      out.append((str(shape), 'dynamic', shape, shape.nodes, shape.depth))
    else:
      out.append((f'tree {shape}', 'tree', shape.branching, shape.nodes, shape.depth))
  return out


def method(variant: str) -> str:
  """'chain', 'tree' (static) or 'dynamic' from a row's variant name."""
  return variant.split(' ')[0].split(':')[0]


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
    key = 'gamma' if kind == 'chain' else 'tree'
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
    if timed and temperature == 0 and name != 'AR':  # greedy: the autoregressive tokens exactly
      row['identical'] = all(np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
                             for a, b in zip(last[name], last['AR']))
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
  if args.draft == 'head':
    draft, head_desc = bc.head_draft(name, target)
    desc = f'{desc}; draft: {head_desc}'
  log(f'\n== {name}: {desc}')
  record = {'pair': name, 'description': desc, 'draft': args.draft, 'settings': []}
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


# Issue 33's Done-when ratios (a dynamic tree against the chain).
GOALS = {'tokens_per_call': 1.15, 'tokens_per_s': 1.10}
BUDGET = 8  # verified tokens per call


def _ratios(shown, kind):
  """[(tokens-per-call ratio, what, budget)], [(tok/s ratio, what)] of `kind`'s trees, per
  setting."""
  per_call, per_s = [], []
  for pair, s in shown:
    trees = [r for r in s['rows'] if method(r['variant']) == kind]
    chains = [r for r in s['rows'] if method(r['variant']) == 'chain']
    budgets = {r['verified'] for r in trees if r.get('vs_chain') is not None}
    budget = BUDGET if BUDGET in budgets else max(budgets, default=None)
    at = [r for r in trees if r['verified'] == budget and r.get('vs_chain') is not None]
    if at:
      best = max(at, key=lambda r: r['vs_chain'])
      per_call.append((best['vs_chain'], f"{pair}: {best['variant']} vs {best['vs_chain_of']}",
                       budget))
    timed_trees = [r for r in trees if 'tokens_per_s' in r]
    timed_chains = [r for r in chains if 'tokens_per_s' in r]
    if timed_trees and timed_chains:
      tree = max(timed_trees, key=lambda r: r['tokens_per_s'])
      chain = max(timed_chains, key=lambda r: r['tokens_per_s'])
      per_s.append((tree['tokens_per_s'] / chain['tokens_per_s'],
                    f"{pair}: {tree['variant']} vs {chain['variant']}"))
  return per_call, per_s


def summary_line(result) -> str:
  """The run's last line: the best dynamic tree against the chain of the same budget (tokens per
  call) and the fastest dynamic tree against the fastest chain (tok/s), at T = 1 when measured,
  the worst over pairs; then the static trees' two ratios."""
  settings = [(p['pair'], s) for p in result['pairs'] for s in p['settings']]
  shown = [x for x in settings if x[1]['temperature'] == 1.0] or settings
  temps = ','.join(sorted({f"{s['temperature']:g}" for _, s in shown}))
  parts = []
  for kind, label in (('dynamic', 'dynamic'), ('tree', 'static-tree')):
    per_call, per_s = _ratios(shown, kind)
    call = min(per_call, default=(math.nan, 'not measured', BUDGET))
    speed = min(per_s, default=(math.nan, 'not measured'))
    parts.append(f"{label}/chain tokens per call T={temps} budget {call[2]} "
                 f"{bc.fmt(call[0], '.2f')} (goal {GOALS['tokens_per_call']:.2f}; {call[1]}); "
                 f"{label}/best chain tok/s {bc.fmt(speed[0], '.2f')} "
                 f"(goal {GOALS['tokens_per_s']:.2f}; {speed[1]})")
  return 'summary: ' + '; '.join(parts)


def plot(result, path) -> str | None:
  """Tokens per second against the verify budget, one line per method, one panel per (pair, T)."""
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  settings = [(p['pair'], s) for p in result['pairs'] for s in p['settings']]
  if not settings or not any('tokens_per_s' in r for _, s in settings for r in s['rows']):
    return None
  fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.6), squeeze=False)
  for ax, (pair, s) in zip(axes[0], settings):
    for i, kind in enumerate(('chain', 'tree', 'dynamic')):
      best = {}  # budget -> the fastest variant of this method
      for r in s['rows']:
        if method(r['variant']) == kind and 'tokens_per_s' in r:
          best[r['verified']] = max(best.get(r['verified'], 0.0), r['tokens_per_s'])
      if best:
        xs = sorted(best)
        ax.plot(xs, [best[x] for x in xs], marker='o', color=f'C{i}',
                label={'tree': 'static tree'}.get(kind, kind))
    ar = next((r for r in s['rows'] if r['variant'] == 'AR'), None)
    if ar is not None:
      ax.axhline(ar['tokens_per_s'], color='grey', ls='--', lw=1, label='AR')
    ax.set_title(f"{pair} T={s['temperature']:g}", fontsize=9)
    ax.set_xlabel('verified tokens per call (budget)')
    ax.set_ylabel('tokens / s')
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def main(argv=None) -> dict:
  args = parse_args(argv)
  result, gate = bc.run_pairs(args, run_pair)
  if args.out:
    result['plot'] = plot(result, os.path.splitext(args.out)[0] + '.png')
  result['summary'] = summary_line(result)
  bc.finish_load(gate, result, args.out)
  print(result['summary'])
  return result


if __name__ == '__main__':
  main()
