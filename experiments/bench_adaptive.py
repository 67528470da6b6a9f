"""Adaptive draft length and block verification against fixed gamma, side by side in one process.

  python experiments/bench_adaptive.py [--pairs=tiny,t5-small] [--batches=1,8] [--temps=0,1]
                                       [--draft=model|head] [--out=FILE.json] [--allow-loaded]
  python experiments/bench_adaptive.py --smoke          # seconds, random smoke pair (tests)

For each pair, batch size B and temperature T, every variant decodes the same test verses (in
batches of B, right-padded to one source length, so each variant is one compiled program):

  fixed g      gamma = g in --gammas (the paper), token verification
  fixed g blk  gamma = g in --block_gammas, block verification (T > 0 only: at T = 0 block
               verification is token verification)
  RULE         each --rules stop rule at gamma = --g_max, token and (T > 0) block verification;
               'alpha' gets the measured c, 'budget' c, the measured block cost curve and the
               measured per-iteration overhead (runner.metrics.measure_overhead: what a fixed-4
               iteration costs beyond block cost + passes c, in target steps)
  learned      (--fit_n > 0) the learned stop rule (stopping.Learned, SpecDec++-style), fitted
               for this (pair, draft, B, T) on --fit_n DEV verses before the timed runs: a traced
               fixed-G_MAX run logs each draft's features and beta, a logistic regression
               predicts beta, and the threshold on the predicted prod a_<=k is the one with the
               best tokens per cost on that log, the cost being the block the loop verifies +
               n c + the overhead (specjax.decoding.acceptance_predictor); written beside --out as
               OUT.learned.PAIR.B<B>.T<T>.json, reusable as --rules=learned:FILE
  argmax g     (T > 0, model draft) the draft proposes its argmax with q one-hot
               (ModelDraft(argmax=True))
  AR           autoregressive decoding (the speedup's reference)

The draft is the pair's small T5 model (--draft=model) or, --draft=head, the shipped feature head
that reads the target's hidden states (tiny pair: specjax/assets/tiny_pair/head with its
2582-id draft vocabulary, as configs/tiny.py; smoke: a random head).

A stop rule's loop verifies only the block its rows need: the narrowest compiled width (one of
stopping.block_widths(--g_max): 1, 2, 3, 5, 9 at G_MAX 8) >= the longest row's proposal + 1
(specjax.decoding.engine). Its `predicted` charges the block of each proposal length (the
proposed-length histogram's mean of block cost(width - 1); exact at B = 1, a lower bound above,
where the batch waits for its longest row). `compile s` is the first call's extra time: a rule's
program compiles one target pass per width.

All variants of one (pair, B, T) are timed interleaved (specjax.runner.metrics.time_interleaved:
warm-up/compile apart, block_until_ready, median of --repeats). Reported per variant: tokens/s,
tokens per target call (E[emitted per row per iteration]), draft passes per target call (batch
passes per iteration, which every row waits for), alpha, and the cost model's prediction
E[tokens per call] / (E[draft passes per call] c + block cost(gamma)) with c and the block cost
measured (metrics.measure_c, metrics.measure_block_cost). Tokens per target call of block vs token
verification (fixed gamma >= 4, T > 0) is also measured untimed on every prompt repeated
--stat_seeds times in one batch, with a bootstrap standard error over rows. The machine's load is
recorded beside every table (bench_common's load gate).

The oracle row: what a stop rule that knew every position's acceptance probability could reach
(the code: experiments/length_oracle.py). One untimed, traced run at fixed gamma
G = max(--gammas, --g_max) logs each iteration's prefix and its G drafts; one teacher-forced pass
of each model over [start, prefix, drafts] (offline, not the compiled loop) gives q_i and p_i at
the drafted positions, processed as the loop processes them, and beta_i = sum_x min(p_i(x), q_i(x))
(at T = 0 the 0/1 match of the argmaxes): the probability that draft i is accepted given drafts
< i were. Proposing k drafts then yields E[tokens](k) = 1 + sum_{j <= k} prod_{i <= j} beta_i per
target call and costs block_cost(k) + k c target steps (block_cost(k): the measured (k+1)-token
target step over the 1-token one, or a wider block's where that measured cheaper; block_cost(0) =
1). The oracle picks k in 0..G per logged iteration to maximise the pooled E[tokens] / cost over
all of them (theory.oracle_lengths: argmax_k E(k) - rate* cost(k) at the optimal rate; the
per-iteration ratio alone is not the pooled optimum). Its gain over the best fixed gamma on the
same iterations, rate(oracle) / rate(best fixed gamma), is applied to the best fixed gamma's
measured tok/s (and to its `predicted`, tokens per unit cost): the oracle row. Each exact
token-verification rule gets its share of that gain, (rule - best fixed) / (oracle - best fixed),
in tok/s (`oracle share`) and in tokens per cost (`oracle_share_cost` in the JSON).

Why it bounds the exact rules (non-anticipation): an exact rule decides whether x_k is proposed
from what is known before x_k is sampled (the prefix, x_<k, q_k), never from p_k, which only the
verification pass computes. The oracle knows beta_k (and the later betas of the logged rollout)
before it decides and may choose any length 0..G, so an exact rule's lengths are among its
choices, judged by the same yardstick; a fixed gamma <= G is one of them, so the oracle is never
below the best fixed gamma. At T = 0 the yardstick is exact (beta_i is the 0/1 verdict of the
argmax verification, E[tokens](k) what the iteration yields). At T > 0 it is Eq. 1's model per
position (the product of the betas along the logged rollout), so there the bound holds under the
model the paper's optimal gamma uses too. Choices that favour the oracle further: its block is
exactly k + 1 tokens (a rule's program verifies the narrowest compiled width >= k + 1: the same
up to 2 drafts, up to 3 tokens wider above at G_MAX 8); at B > 1 each row is charged its own k
(the batch waits for its longest row). Limits: the iterations' starts are the fixed-G run's, not the rule's
own; it bounds token verification (block verification accepts more than the betas say, so a `blk`
rule can pass it: no share is given to those). With the feature head the betas are the loop's
own (trace_beta: its verifier's sum_x min(p, q) at every drafted position of the fixed-G block,
with the q each token was drawn from along the head's own rollout), at every temperature.

The last line printed starts `summary:`: issue 33's Done-when ratios with their goals, the best
exact rule over the best fixed gamma in tok/s and the best token rule's oracle share, each the
worst over the T = 1 settings (all settings when none is at T = 1).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position
import length_oracle  # noqa: E402  pylint: disable=wrong-import-position

COLUMNS = [
    ('variant', 'variant', ''), ('gamma', 'G', 'd'), ('verifier', 'verify', ''),
    ('tokens_per_s', 'tok/s', '.1f'), ('vs_best_fixed', 'vs best fixed', '.3f'),
    ('vs_ar', 'vs AR', '.2f'), ('tokens_per_call', 'tok / call', '.3f'),
    ('passes_per_call', 'passes / call', '.2f'), ('passes_per_token', 'passes / tok', '.3f'),
    ('proposed_per_call', 'proposed / call', '.2f'), ('alpha', 'alpha', '.3f'),
    ('predicted', 'predicted', '.2f'), ('oracle_share', 'oracle share', '.2f'),
    ('ms', 'median ms', '.1f'), ('compile_s', 'compile s', '.2f'),
]
BLOCK_COLUMNS = [
    ('variant', 'variant', ''), ('gamma', 'G', 'd'), ('token', 'token tok/call', '.4f'), ('block', 'block tok/call', '.4f'),
    ('ratio', 'block / token', '.4f'), ('se', 'se', '.4f'), ('rows', 'rows', 'd'),
]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--pairs', default='tiny,t5-small', help='comma list of tiny, t5-small')
  p.add_argument('--batches', default='1,8')
  p.add_argument('--temps', default='0,1')
  p.add_argument('--gammas', default='1,2,3,4,5,6,7,8', help='fixed gammas (token verification)')
  p.add_argument('--block_gammas', default='4,6,8', help='fixed gammas with block verification')
  p.add_argument('--g_max', type=int, default=8, help='block width of the stop rules')
  p.add_argument('--rules',
                 default='confidence:0.4,confidence:0.6,entropy:2.5,entropy:1.5,alpha,budget',
                 help="stop rules (specjax.stopping.parse spelling); 'alpha' gets the measured c, "
                      "'budget' c and the block cost curve")
  p.add_argument('--draft', default='model', choices=('model', 'head'),
                 help="the pair's small T5 draft, or the feature head on the target's features")
  p.add_argument('--argmax_gammas', default='3', help='(T > 0) argmax-draft gammas')
  p.add_argument('--fit_n', type=int, default=32,
                 help="dev verses the 'learned' rule is fitted on (0: no learned rule)")
  p.add_argument('--n', type=int, default=16, help='prompts (test verses)')
  p.add_argument('--max_new_tokens', type=int, default=48)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--stat_seeds', type=int, default=16,
                 help='block vs token tokens per call (fixed gamma >= 4, T > 0): each prompt '
                      'this many times in one untimed batch')
  a = bc.parse_bench_args(p, argv, out_default=None,
                          smoke_help='random smoke pair, 4 prompts, 1 repeat')
  if a.smoke:
    a.pairs, a.batches, a.n, a.max_new_tokens, a.repeats, a.stat_seeds = 'smoke', '2', 4, 8, 1, 2
    a.gammas, a.block_gammas, a.g_max, a.rules, a.argmax_gammas = '1,4', '4', 4, 'alpha,budget', '2'
    a.fit_n = 4
  return a


OVERHEAD_GAMMA = 4  # the fixed gamma whose iterations measure the per-iteration overhead


def ints(text):
  return [int(x) for x in str(text).split(',') if x.strip()]


def variants_for(temperature, args, c, block_cost, learned=None, overhead=0.0):
  """[(name, gamma, verifier, stop rule or None, argmax draft)] for one temperature.
  block_cost: {gamma: measured block cost}, at least 1 .. --g_max ('budget' reads the curve and
  the measured per-iteration `overhead`); `learned` the fitted stopping.Learned rule (or None)."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  from specjax import stopping  # pylint: disable=import-outside-toplevel
  sampled = temperature > 0
  curve = (1.0,) + tuple(float(block_cost[g]) for g in range(1, args.g_max + 1))
  out = [(f'fixed {g}', g, 'token', None, False) for g in ints(args.gammas)]
  if sampled:
    out += [(f'fixed {g} blk', g, 'block', None, False) for g in ints(args.block_gammas)]
  for text in [t for t in args.rules.split(',') if t.strip()]:
    rule = stopping.parse(text, c=c, block_costs=curve)
    if isinstance(rule, stopping.Budget):
      rule = dataclasses.replace(rule, overhead=overhead)
    out.append((text, args.g_max, 'token', rule, False))
    if sampled:
      out.append((f'{text} blk', args.g_max, 'block', rule, False))
  if learned is not None:
    out.append(('learned', args.g_max, 'token', learned, False))
    if sampled:
      out.append(('learned blk', args.g_max, 'block', learned, False))
  if sampled and args.draft == 'model':
    out += [(f'argmax {g}', g, 'token', None, True) for g in ints(args.argmax_gammas)]
  return out


def verified_block_cost(proposed_hist, gamma, stop, block_cost) -> float:
  """The mean block cost a variant pays per iteration: block cost(gamma) for a fixed gamma; for a
  rule the narrowest compiled width > n for each proposal length n (proposed_hist [G1], summed
  over rows: exact at B = 1, a lower bound above)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from specjax import stopping  # pylint: disable=import-outside-toplevel
  if not stopping.may_shorten(stop):
    return block_cost.get(gamma, 1.0)
  widths = stopping.block_widths(gamma)
  cost = [1.0] + [block_cost.get(w - 1, 1.0) for w in range(2, gamma + 2)]
  per_n = [cost[min(w for w in widths if w > n) - 1] for n in range(gamma + 1)]
  hist = np.asarray(proposed_hist, np.float64)
  return float(hist @ np.asarray(per_n) / max(hist.sum(), 1.0))


def fit_learned(target, draft, prompts_NxS, *, batch, temperature, args, c, block_cost, overhead,
                path, log=print):
  """(the learned stop rule fitted on `prompts_NxS` (dev verses), its report): module
  docstring. Saved at `path` when given."""
  from specjax import stopping  # pylint: disable=import-outside-toplevel
  from specjax.decoding import acceptance_predictor  # pylint: disable=import-outside-toplevel
  curve = (1.0,) + tuple(float(block_cost[g]) for g in range(1, args.g_max + 1))
  costs = stopping.Budget(c=c, block_costs=curve, overhead=overhead).costs(args.g_max)
  logged = acceptance_predictor.record(
      target, draft, prompts_NxS, gamma=args.g_max, temperature=temperature, batch=batch,
      max_new_tokens=args.max_new_tokens, rng=7919)
  rule, report = acceptance_predictor.fit(logged, costs, source=path or '')
  if path:
    rule.save(path, fitted_on=f'{prompts_NxS.shape[0]} dev verses', batch=batch,
              temperature=temperature, g_max=args.g_max, c=c, costs=list(costs), **{
                  k: v for k, v in report.items() if k != 'fixed_rates'})
  log(f"learned rule: fitted on {report['iterations']} logged iterations of "
      f"{prompts_NxS.shape[0]} dev verses; threshold {rule.threshold:.2f}, mean length "
      f"{report['mean_length']:.2f}; on its log {report['vs_best_fixed']:.3f}x the best fixed "
      f"gamma ({report['best_fixed']}) in tokens per cost; Brier {report['brier']:.4f} vs "
      f"{report['brier_constant']:.4f} for a constant")
  return rule, report


def _summ(stats_list):
  """Pooled statistics of several calls (numpy SpecStats)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  emitted = np.concatenate([np.asarray(s.emitted) for s in stats_list])
  calls = np.concatenate([np.asarray(s.target_calls) for s in stats_list])
  proposed = sum(float(np.sum(s.proposed)) for s in stats_list)
  iters = sum(int(s.iterations) for s in stats_list)
  passes = sum(int(s.draft_passes) for s in stats_list)
  a_sum = sum(float(np.sum(s.alpha_sum)) for s in stats_list)
  a_cnt = sum(int(np.sum(s.alpha_count)) for s in stats_list)
  hist = sum(np.asarray(s.proposed_hist).sum(0) for s in stats_list)
  return dict(emitted=emitted, calls=calls, tokens_per_call=emitted.sum() / max(calls.sum(), 1),
              proposed_per_call=proposed / max(calls.sum(), 1),
              passes_per_call=passes / max(iters, 1), alpha=a_sum / max(a_cnt, 1),
              proposed_hist=hist)


def compare(target, draft, prompts_NxS, *, batch, temperature, variants, max_new_tokens, repeats,
            c, block_cost, stat_seeds=0, log=print):
  """Times every variant interleaved on the same prompts; returns (rows, block-vs-token rows).

  block_cost: {gamma: measured (gamma+1)-token / 1-token target step}.
  """
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop  # pylint: disable=import-outside-toplevel
  from specjax.decoding.drafts import ModelDraft  # pylint: disable=import-outside-toplevel
  from specjax.decoding.model_draft import as_draft  # pylint: disable=import-outside-toplevel
  from specjax.runner import metrics  # pylint: disable=import-outside-toplevel

  n = prompts_NxS.shape[0] - prompts_NxS.shape[0] % batch
  chunks = [prompts_NxS[i:i + batch] for i in range(0, n, batch)]
  kw = dict(max_new_tokens=max_new_tokens, temperature=temperature)
  drafts = {False: as_draft(draft)}
  if any(v[4] for v in variants):
    drafts[True] = ModelDraft(draft, argmax=True)
  last = {}

  def spec_fn(name, gamma, verifier, stop, argmax):
    return bc.keep_chunks(last, name, chunks, lambda x, i: loop.speculative_decode(
        target, drafts[argmax], x, gamma=gamma, stop=stop, verifier=verifier, rng=i, **kw))

  fns = {name: spec_fn(name, g, v, s, a) for name, g, v, s, a in variants}
  fns['AR'] = bc.keep_chunks(last, 'AR', chunks, lambda x, i: loop.autoregressive_decode(
      target, x, rng=i, **kw))
  timings = metrics.time_interleaved(fns, repeats=repeats)
  rows = []
  for name, g, v, s, a in variants + [('AR', 1, '', None, False)]:
    t = timings[name]
    tokens = sum(int(np.sum(o.lengths)) for o in last[name])
    row = dict(variant=name, gamma=g, verifier=v, ms=1e3 * t.median_s, compile_s=t.compile_s,
               times_s=list(t.times_s), tokens=tokens, tokens_per_s=tokens / t.median_s)
    if name != 'AR':
      st = _summ([jax.device_get(o.stats) for o in last[name]])
      row.update(tokens_per_call=st['tokens_per_call'], passes_per_call=st['passes_per_call'],
                 passes_per_token=st['passes_per_call'] / max(st['tokens_per_call'], 1e-9),
                 proposed_per_call=st['proposed_per_call'], alpha=st['alpha'],
                 block_cost=verified_block_cost(st['proposed_hist'], g, s, block_cost),
                 proposed_hist=st['proposed_hist'].tolist(),
                 exact=bool(getattr(s, 'exact', True)))
      row['predicted'] = metrics.predicted_speedup(st['tokens_per_call'], st['passes_per_call'],
                                                   c, row['block_cost'])
    rows.append(row)
  ar_s = timings['AR'].median_s
  fixed = [r for r in rows if r['variant'].startswith('fixed') and r['verifier'] == 'token']
  best_fixed = max(r['tokens_per_s'] for r in fixed) if fixed else float('nan')
  for r in rows:
    r['vs_ar'] = ar_s / (r['ms'] / 1e3)
    r['vs_best_fixed'] = r['tokens_per_s'] / best_fixed

  block_rows = []
  if temperature > 0 and stat_seeds:
    # Untimed: every prompt repeated `stat_seeds` times in ONE batch per variant (rows are
    # independent samples), for fixed gammas >= 4 with block vs token verification.
    big = np.repeat(prompts_NxS[:n], stat_seeds, axis=0)
    by_name = {x[0]: x for x in variants}
    for name, g, v, s, a in variants:
      tok_name = name[:-len(' blk')]
      if v != 'block' or s is not None or g < 4 or tok_name not in by_name:
        continue
      pooled = {}
      for which in (tok_name, name):
        _, gg, vv, ss, aa = by_name[which]
        out = loop.speculative_decode(target, drafts[aa], big, gamma=gg, stop=ss, verifier=vv,
                                      rng=12345, **kw)
        pooled[which] = _summ([jax.device_get(out.stats)])
      t_, b_ = pooled[tok_name], pooled[name]
      ratio = b_['tokens_per_call'] / t_['tokens_per_call']
      se = bc.bootstrap_ratio_se(b_['emitted'], b_['calls'], t_['emitted'], t_['calls'])
      block_rows.append(dict(variant=name, gamma=g, token=t_['tokens_per_call'],
                             block=b_['tokens_per_call'], ratio=ratio, se=se,
                             rows=len(b_['emitted'])))
  return rows, block_rows


def _is_fixed(r):
  return r['variant'].startswith('fixed') and r['verifier'] == 'token'


def _is_rule(r):
  return (not r['variant'].startswith(('fixed', 'argmax', 'AR', 'oracle')) and not r.get('bound')
          and r.get('exact', True))


def run_pair(name, args, gate=None, log=print) -> dict:
  import numpy as np  # pylint: disable=import-outside-toplevel
  from specjax.runner import metrics  # pylint: disable=import-outside-toplevel

  target, draft, desc, padded, ids = bc.load_bench_pair(name, args.n, smoke=(name == 'smoke'))
  if args.draft == 'head':
    draft, head_desc = bc.head_draft(name, target)
    desc = f'{desc}; draft: {head_desc}'
  log(f'\n== {name}: {desc}')
  cache_len = args.max_new_tokens + args.g_max + 1
  record = {'pair': name, 'description': desc, 'draft': args.draft, 'settings': []}
  for batch in ints(args.batches):
    probe = padded[:batch]
    c = metrics.measure_c(target, draft, probe, cache_len)
    oracle_g = max(ints(args.gammas) + [args.g_max])  # the oracle's lengths: 0..oracle_g
    gammas = sorted(set(ints(args.gammas) + ints(args.block_gammas) + ints(args.argmax_gammas)
                        + list(range(1, oracle_g + 1))))
    block_cost = {g: metrics.measure_block_cost(target, probe, cache_len, g) for g in gammas}
    log(f"batch {batch}: c = {c:.3f}; block cost (G+1 vs 1 token): "
        + ', '.join(f'{g}: {block_cost[g]:.2f}' for g in gammas))
    for temperature in [float(t) for t in args.temps.split(',')]:
      og = min(OVERHEAD_GAMMA, args.g_max)
      overhead = max(0.0, metrics.measure_overhead(
          target, draft, probe, gamma=og, c=c, block_cost=block_cost[og],
          max_new_tokens=args.max_new_tokens, temperature=temperature))
      log(f'T = {temperature:g}: per-iteration overhead {overhead:.2f} target steps (fixed '
          f'{og}, beyond block cost + passes c)')
      learned, learned_report = None, None
      if args.fit_n:
        path = (f'{os.path.splitext(args.out)[0]}.learned.{name}.B{batch}.T{temperature:g}.json'
                if args.out else None)
        learned, learned_report = fit_learned(
            target, draft, bc.dev_prompts(name, args.fit_n, target, smoke=(name == 'smoke')),
            batch=batch, temperature=temperature, args=args, c=c, block_cost=block_cost,
            overhead=overhead, path=path, log=log)
      start = gate.mark() if gate is not None else None
      rows, block_rows = compare(
          target, draft, np.asarray(padded), batch=batch, temperature=temperature,
          variants=variants_for(temperature, args, c, block_cost, learned, overhead),
          max_new_tokens=args.max_new_tokens,
          repeats=args.repeats, c=c, block_cost=block_cost, stat_seeds=args.stat_seeds, log=log)
      beta_IxG, accepted_I = length_oracle.logged_betas(
          target, draft, np.asarray(padded), batch=batch, temperature=temperature,
          gamma=oracle_g, max_new_tokens=args.max_new_tokens)
      oracle = length_oracle.add_oracle(
          rows, [r for r in rows if _is_fixed(r)],
          [r for r in rows if _is_rule(r) and r['verifier'] == 'token'], beta_IxG, accepted_I,
          length_oracle.iteration_costs(block_cost, c, oracle_g), temperature)
      setting = dict(batch=batch, temperature=temperature, c=c,
                     block_cost={str(k): v for k, v in block_cost.items()}, rows=rows,
                     block_vs_token=block_rows, learned=learned_report, overhead=overhead,
                     **summarise(rows, block_rows), **oracle)
      log(f'\n{name}, batch {batch}, T = {temperature:g}, {len(ids)} prompts x '
          f'{args.max_new_tokens} new tokens')
      log(bc.markdown_table(rows, COLUMNS))
      if block_rows:
        log('block vs token verification, tokens per target call (bootstrap se over rows):')
        log(bc.markdown_table(block_rows, BLOCK_COLUMNS))
      log(f"best exact rule {setting['best_rule']} vs best fixed {setting['best_fixed']}: "
          f"{setting['rule_vs_fixed']:.3f}x tokens/s")
      log(f"oracle (knows each beta_i; lengths 0..{oracle_g} over "
          f"{oracle['oracle_iterations']} logged iterations, alpha "
          f"{oracle['logged_alpha']:.3f}): {oracle['oracle_vs_fixed']:.3f}x the best fixed "
          f"gamma, {oracle['oracle_tokens_per_call']:.3f} tok/call; best token rule "
          f"{oracle['oracle_token_rule']} has {bc.fmt(oracle['oracle_share'], '.2f')} of its "
          f"gain in tok/s, {bc.fmt(oracle['oracle_share_cost'], '.2f')} in tokens per cost")
      if gate is not None:
        setting['load'], line = bc.table_load(gate, start)
        log(line)
      record['settings'].append(setting)
  return record


def summarise(rows, block_rows) -> dict:
  fixed = [r for r in rows if _is_fixed(r)]
  rules = [r for r in rows if _is_rule(r)]
  best_fixed = max(fixed, key=lambda r: r['tokens_per_s'])
  best_rule = max(rules, key=lambda r: r['tokens_per_s']) if rules else None
  return dict(best_fixed=best_fixed['variant'], best_rule=best_rule and best_rule['variant'],
              rule_vs_fixed=(best_rule['tokens_per_s'] / best_fixed['tokens_per_s']
                             if best_rule else float('nan')),
              block_ratio_min=min((b['ratio'] for b in block_rows if b['gamma'] >= 4),
                                  default=float('nan')))


def plot(result, path) -> str | None:
  """Tokens per target call against draft passes per token, one panel per (pair, B, T)."""
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  settings = [(p['pair'], s) for p in result['pairs'] for s in p['settings']]
  fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.6), squeeze=False)
  for ax, (pair, s) in zip(axes[0], settings):
    for r in s['rows']:
      if r['variant'] == 'AR':
        continue
      fixed = r['variant'].startswith('fixed')
      ax.scatter(r['passes_per_token'], r['tokens_per_call'], s=18,
                 marker='o' if fixed else '^', c='C0' if r['verifier'] == 'token' else 'C3')
      ax.annotate(r['variant'].replace('fixed ', 'g'), (r['passes_per_token'],
                                                        r['tokens_per_call']), fontsize=6)
    ax.set_title(f"{pair} B={s['batch']} T={s['temperature']:g}", fontsize=9)
    ax.set_xlabel('draft passes per token')
    ax.set_ylabel('tokens per target call')
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return path


GOALS = {'rule_vs_fixed': 1.05, 'oracle_share': 0.5}  # issue 33's Done-when ratios


def summary_line(result) -> str:
  """The run's last line: the Done-when ratios (the worst over the T = 1 settings) and goals."""
  settings = [(p['pair'], s) for p in result['pairs'] for s in p['settings']]
  shown = [x for x in settings if x[1]['temperature'] == 1.0] or settings
  temps = sorted({s['temperature'] for _, s in shown})

  def worst(key):
    values = [s.get(key, float('nan')) for _, s in shown]
    return float('nan') if any(math.isnan(v) for v in values) else min(values, default=math.nan)
  where = ', '.join(f"{pair} B={s['batch']}" for pair, s in shown)
  return (f"summary: adaptive/fixed tok/s T={','.join(f'{t:g}' for t in temps)} "
          f"{bc.fmt(worst('rule_vs_fixed'), '.2f')} (goal {GOALS['rule_vs_fixed']:.2f}); "
          f"oracle share {bc.fmt(worst('oracle_share'), '.2f')} (goal {GOALS['oracle_share']}; "
          f"the oracle's own gain: {bc.fmt(worst('oracle_vs_fixed'), '.3f')}x the best fixed); "
          f"worst of {where}")


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
