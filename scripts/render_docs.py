"""Render every figure of README.md and docs/*.md from the published records (docs/results/).

  python scripts/render_docs.py            # rewrite the marked regions in place
  python scripts/render_docs.py --check    # exit 1 when a document disagrees with its data (CI)
  python scripts/render_docs.py --list     # each region, its renderer and the command of its record

A region is `<!-- fig:NAME -->...<!-- /fig:NAME -->` in a Markdown file (on lines of their own for
a block, or inline within a sentence); what lies between the markers is the output of
`FIGURES[NAME].render(records)` and is overwritten: change the data (rerun the command) or the
renderer, never the text. A region whose record does not exist yet says so and names the command
that makes it. Records are JSON lines under docs/results/<benchmark>/<host id>.jsonl
(specjax/runner/results.py); figures that depend on the host are shown per host, newest record of
each host, so a reader on another machine sees what to expect and the host it came from.
`tests/test_render_docs.py` runs `--check` (CI) and shows that a hand-edited number fails it.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

from specjax.runner import console  # noqa: E402  pylint: disable=wrong-import-position
from specjax.runner import results  # noqa: E402  pylint: disable=wrong-import-position

REGION = re.compile(r'<!-- fig:(?P<name>[\w.-]+) -->(?P<body>.*?)<!-- /fig:(?P=name) -->', re.S)
ANY_MARK = re.compile(r'<!-- /?fig:([\w.-]+) -->')


@dataclasses.dataclass(frozen=True)
class Figure:
  render: Callable[[list[dict[str, Any]]], str]
  command: str  # what makes its record ('' for a figure computed from the code)
  benchmark: str = ''


# ----------------------------------------------------------------------------- helpers


def table(headers, rows) -> str:
  lines = ['| ' + ' | '.join(headers) + ' |', '|' + '---|' * len(headers)]
  lines += ['| ' + ' | '.join(str(c) for c in r) + ' |' for r in rows]
  return '\n'.join(lines)


def num(x, spec='.2f', suffix='') -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return '-'
  return f'{x:{spec}}{suffix}'


def host_cell(rec) -> str:
  """'AMD EPYC, 2 cores, L3 32 MiB, 48 GB/s' for a host column."""
  h = rec['host']
  parts = [h.get('accelerator') or h.get('cpu_model') or '?']
  if not h.get('accelerator'):
    parts.append(f"{h.get('cores_usable') or h.get('cores')} cores")
    if h.get('l3_bytes'):
      parts.append(f"L3 {h['l3_bytes'] / (1 << 20):.0f} MiB")
  if h.get('mem_bw_gbs'):
    parts.append(f"{h['mem_bw_gbs']:.0f} GB/s")
  return ', '.join(parts)


def stamp(rec) -> str:
  """'2026-12-05, 0cefe1fd904d' (date, commit; '+local changes' when the tree was dirty)."""
  commit = rec.get('commit') or 'commit not recorded'
  return f"{rec['created'][:10]}, {commit}{' +local changes' if rec.get('dirty') else ''}"


def missing(command: str) -> str:
  return f'_Not measured on a recorded host yet: run `{command}`._'


def newest(records, benchmark, where=lambda r: True):
  """Newest record of each host, the newest host first."""
  per_host = results.latest_per_host(records, benchmark, where)
  return sorted(per_host.values(), key=lambda r: r['created'], reverse=True)


def detailed(recs) -> tuple[list, str]:
  """A detailed table shows the newest host only (the page stays short as hosts are added; the
  per-host summaries show them all); the note names the other hosts' records."""
  others = recs[1:]
  note = ('' if not others else '\n\nOther recorded hosts: ' + '; '.join(
      f"{host_cell(r)} (`docs/results/{r['benchmark']}/{r['host_id']}.jsonl`)" for r in others)
          + '.')
  return recs[:1], note


def sources(recs) -> str:
  files = dict.fromkeys(f"`docs/results/{r['benchmark']}/{r['host_id']}.jsonl`" for r in recs)
  return f"Record{'s' if len(files) > 1 else ''}: {', '.join(files)}."


def describe_model(path: str) -> str:
  """'T5 1.6M' for a checkpoint of the repository (records keep repo-relative paths; a draft's
  options after ':' as in 'head:vocab=2582' stay with it)."""
  from specjax.runner import drafts, report  # pylint: disable=import-outside-toplevel
  local = path and ((REPO / path).is_dir() or drafts.is_head_dir(str(REPO / path)))
  return report.describe(str(REPO / path)) if local else path


# ----------------------------------------------------------------------------- the default run

RUN_CMD = 'python scripts/make_docs.py --only=run.tiny'


def render_run_output(records) -> str:
  recs = newest(records, 'run.tiny')
  if not recs:
    return missing(RUN_CMD)
  rec = recs[0]
  text = rec['figures'].get('table_text', '').rstrip()
  return f"```text\n{text}\n```\n(the newest record: {host_cell(rec)}; {stamp(rec)})"


def render_run_hosts(records) -> str:
  recs = newest(records, 'run.tiny')
  if not recs:
    return missing(RUN_CMD)
  rows = []
  for rec in recs:
    run = rec['figures']['rows']
    best = console.best_speedups(run)
    drafts = list(dict.fromkeys(r.get('draft_path') or r['draft'] for r in run))
    cost = console.block_costs(run)
    c = {r.get('draft_path') or r['draft']: r['c'] for r in run}
    cells = []
    for t in (0.0, 1.0):
      cells.append(' / '.join(f'{best[(d, t)][0]:.2f}X' if (d, t) in best else '-'
                              for d in drafts))
    rows.append([host_cell(rec),
                 ', '.join(f'{v:.2f} ({g})' for g, v in sorted(cost.items())) or '-',
                 ' / '.join(num(c.get(d), '.3f') for d in drafts), *cells, stamp(rec)])
  names = ' / '.join(describe_model(d) for d in dict.fromkeys(
      r.get('draft_path') or r['draft'] for r in recs[0]['figures']['rows']))
  return table(['host', 'block cost (gamma)', f'c ({names})', 'best speedup T = 0',
                'best speedup T = 1', 'recorded'], rows)


def render_run_cells(records) -> str:
  recs = newest(records, 'run.tiny')
  if not recs:
    return missing(RUN_CMD)
  out = []
  shown, note = detailed(recs)
  for rec in shown:
    rows = [[describe_model(r.get('draft_path') or r['draft']), f"{r['temperature']:g}",
             r['gamma'], num(r['alpha']), num(r['tokens_per_target_call']), num(r['c'], '.3f'),
             num(r.get('block_cost')), num(r['speedup'], '.2f', 'X'),
             num(r['pred_improvement'], '.2f', 'X'),
             num(r.get('pred_improvement_measured'), '.2f', 'X'),
             num(r.get('pred_improvement_call'), '.2f', 'X'),
             'yes' if r.get('identical_to_baseline') else
             ('-' if r['temperature'] else 'NO')]
            for r in rec['figures']['rows']]
    out.append(f"{host_cell(rec)} ({stamp(rec)}):\n\n" + table(
        ['draft', 'T', 'gamma', 'alpha', 'tok/call', 'c', 'block cost', 'speedup',
         'pred (Thm 3.8)', 'pred (block cost)', 'pred (+ per call)', 'same tokens'], rows))
  return '\n\n'.join(out) + note


# ----------------------------------------------------------------------------- CPU benchmarks

BLOCK_CMD = 'python scripts/make_docs.py --only=bench_block'


def render_block_cost(records) -> str:
  """experiments/bench_block.py: figures['rows'] = [{'tokens': K, 'step_ms', 'floor_ms'?}]."""
  recs = newest(records, 'bench_block')
  if not recs:
    return missing(BLOCK_CMD)
  ks = sorted({int(r.get('tokens', r.get('k', 0))) for rec in recs
               for r in rec['figures'].get('rows', [])})
  rows = []
  for rec in recs:
    by_k = {int(r.get('tokens', r.get('k', 0))): r for r in rec['figures'].get('rows', [])}
    one = by_k.get(1, {}).get('step_ms')
    floor = by_k.get(1, {}).get('floor_ms')
    rows.append([host_cell(rec), num(one, '.2f'), num(floor, '.2f'),
                 num(one / floor if one and floor else None, '.2f', 'X'),
                 *(num(by_k[k]['step_ms'] / one if k in by_k and one else None) for k in ks[1:]),
                 stamp(rec)])
  summary = table(['host', '1-token step ms', 'bandwidth floor ms', 'step / floor',
                   *(f'K = {k}' for k in ks[1:]), 'recorded'], rows)
  return summary + '\n\n' + _block_levers(recs)


def _block_levers(recs) -> str:
  """The newest host's levers: every model, batch and weight storage, 1-token step and costs."""
  shown, note = detailed(recs)
  out = []
  for rec in shown:
    models = rec['figures'].get('models', [])
    ks = sorted({int(k) for m in models for b in m['batches'] for r in b['rows'] for k in r['ms']})
    rows = [[m['model'], b['batch'], r['lever'], r.get('weights', '-'), num(r['ms'][str(1)]
             if str(1) in r['ms'] else r['ms'].get(1), '.3f'),
             num(r.get('step_over_floor'), '.2f', 'X'),
             *(num(r['block_cost'].get(str(k), r['block_cost'].get(k))) for k in ks[1:])]
            for m in models for b in m['batches'] for r in b['rows']]
    if rows:
      out.append(f'Levers on {host_cell(rec)} ({stamp(rec)}), ms per 1-token step and the '
                 'block cost per K:\n\n' + table(
                     ['target', 'batch', 'lever', 'weights', '1-token ms', 'step / floor',
                      *(f'K = {k}' for k in ks[1:])], rows))
  plot = shown[0]['figures'].get('plot') if shown else None
  if plot and plot.startswith('docs/') and (REPO / plot).is_file():
    out.append(f"![ms per step against K, per lever and target]({plot[len('docs/'):]})")
  return '\n\n'.join(out) + note


TF_CMD = 'python scripts/make_docs.py --only=bench_transformers'


def render_transformers(records) -> str:
  recs = newest(records, 'bench_transformers')
  if not recs:
    return missing(TF_CMD)
  out = []
  shown, note = detailed(recs)
  for rec in shown:
    for pair in rec['figures'].get('pairs', []):
      rows = [[r['method'], num(r.get('tokens_per_s'), '.0f'),
               num(r.get('vs_tf_greedy'), '.2f', 'X'), num(r.get('vs_tf_assisted'), '.2f', 'X'),
               num(r.get('vs_ct2'), '.2f', 'X'),
               r['identical'] if isinstance(r.get('identical'), str)
               else ('yes' if r.get('identical') else 'NO')] for r in pair['rows']]
      out.append(f"{pair['pair']} pair (gamma {pair.get('gamma')}), {host_cell(rec)} "
                 f"({stamp(rec)}):\n\n" + table(
                     ['batch 1, greedy', 'tokens/s', 'vs transformers greedy',
                      'vs transformers assisted', 'vs CTranslate2', 'same tokens'], rows))
  return '\n\n'.join(out) + note


REFILL_CMD = 'python scripts/make_docs.py --only=bench_batch.refill'


def render_refill(records) -> str:
  recs = newest(records, 'bench_batch', where=lambda r: r['args'].get('refill'))
  if not recs:
    return missing(REFILL_CMD)
  out = []
  shown, note = detailed(recs)
  for rec in shown:
    groups: dict[tuple, list] = {}
    for r in rec['figures'].get('refill_rows', []):
      groups.setdefault((r['temperature'], r['batch']), []).append(r)
    rows = []
    for (t, b), cell in sorted(groups.items()):
      by = {r['mode']: r for r in cell}
      lock = next((r for r in cell if r['mode'].startswith('spec') and 'lockstep' in r['mode']),
                  {})
      auto = by.get('spec auto refill', {})
      best = by.get(auto.get('best_fixed', ''), {})
      rows.append([f'{t:g}', b, num(by.get('AR lockstep', {}).get('tok_s'), '.0f'),
                   f"{num(lock.get('tok_s'), '.0f')} ({num(lock.get('row_util'), '.0%')})",
                   f"{num(best.get('tok_s'), '.0f')} ({best.get('mode', '-')})",
                   f"{num(auto.get('tok_s'), '.0f')} ({num(auto.get('row_util'), '.0%')})",
                   num(auto.get('tok_s') / best['tok_s'] if auto and best else None, '.2f', 'X')])
    out.append(f"{host_cell(rec)} ({stamp(rec)}):\n\n" + table(
        ['T', 'B', 'AR lockstep tok/s', 'spec lockstep tok/s (row util)',
         'best fixed refill tok/s', "gamma='auto' refill tok/s (row util)", 'auto / best fixed'],
        rows))
  return '\n\n'.join(out) + note


ADAPTIVE_CMD = 'python scripts/make_docs.py --only=bench_adaptive'


def render_adaptive(records) -> str:
  """One table per draft (the pair's small T5, the feature head): the newest record of each
  host, each table followed by the names of its other hosts' records."""
  out = []
  for draft in ('model', 'head'):
    recs = newest(records, 'bench_adaptive', lambda r, d=draft: _draft_of(r) == d)
    shown, note = detailed(recs)
    for rec in shown:
      rows = []
      for pair in rec['figures'].get('pairs', []):
        for s in pair['settings']:
          by = {r['variant']: r for r in s['rows']}
          fixed = by.get(s.get('best_fixed'), {})
          learned = by.get('learned', {})
          rows.append([pair['pair'], s['batch'], f"{s['temperature']:g}", num(s.get('c'), '.3f'),
                       num(s.get('overhead'), '.2f'),
                       f"{s.get('best_fixed')} ({num(fixed.get('tokens_per_s'), '.0f')} tok/s)",
                       s.get('best_rule') or '-', num(s.get('rule_vs_fixed'), '.3f', 'X'),
                       num(learned.get('vs_best_fixed'), '.3f', 'X'),
                       num(learned.get('oracle_share'), '.2f'),
                       num(s.get('oracle_vs_fixed'), '.3f', 'X'),
                       f"{num(s.get('oracle_share'), '.2f')} ({s.get('oracle_token_rule') or '-'})",
                       num(s.get('block_ratio_min'), '.3f')])
      out.append(f"Draft: {DRAFT_NAMES[draft]}. {host_cell(rec)} ({stamp(rec)}):\n\n" + table(
          ['pair', 'B', 'T', 'c', 'overhead', 'best fixed gamma', 'best exact stop rule',
           'rule / fixed', 'learned / fixed', 'learned oracle share', 'oracle / fixed',
           "oracle share (best token rule)",
           'block / token verification, tok/call (min over gamma >= 4)'], rows) + note)
  if not out:
    return missing(ADAPTIVE_CMD)
  return '\n\n'.join(out)


TREE_CMD = 'python scripts/make_docs.py --only=bench_tree'


DRAFT_NAMES = {'model': "the pair's small T5", 'head': 'the feature head'}


def _draft_of(rec) -> str:
  """The draft a bench_tree / bench_adaptive record measured ('model' before --draft existed)."""
  return (rec.get('args') or {}).get('draft') or 'model'


def render_trees(records) -> str:
  """One table per draft (the pair's small T5, the feature head): the newest record of each
  host, every static and dynamic tree against the chain of its budget, and the run's summary;
  each table followed by the names of its other hosts' records."""
  out = []
  for draft in ('model', 'head'):
    recs = newest(records, 'bench_tree', lambda r, d=draft: _draft_of(r) == d)
    shown, note = detailed(recs)
    for rec in shown:
      rows = []
      for pair in rec['figures'].get('pairs', []):
        for s in pair['settings']:
          chains = [r for r in s['rows'] if r['variant'].startswith('chain')
                    and r.get('tokens_per_s')]
          best = max((r['tokens_per_s'] for r in chains), default=None)
          for r in s['rows']:
            if r.get('vs_chain') is None:  # the chains and AR: the trees' references
              continue
            se = f" ± {r['se']:.3f}" if r.get('se') is not None else ''
            rows.append([pair['pair'], f"{s['temperature']:g}", r['variant'], r['verified'],
                         num(r.get('tokens_per_call')),
                         num(r.get('vs_chain'), '.3f') + se if r.get('vs_chain') else '-',
                         num(r['tokens_per_s'] / best if best and r.get('tokens_per_s')
                             else None, '.2f', 'X'),
                         num(r.get('vs_ar'), '.2f', 'X')])
      summary = rec['figures'].get('summary')
      out.append(f"Draft: {DRAFT_NAMES[draft]}. {host_cell(rec)} ({stamp(rec)}):\n\n" + table(
          ['pair', 'T', 'tree', 'verified tokens', 'tok/call', 'vs chain (tok/call)',
           'tok/s vs best chain', 'speedup vs AR'], rows)
                 + (f'\n\n`{summary}`' if summary else '') + note)
  if not out:
    return missing(TREE_CMD)
  return '\n\n'.join(out)


TREE_COST_CMD = 'python scripts/make_docs.py --only=tree_step_cost'


def render_tree_cost(records) -> str:
  """One iteration's cost by piece, chain against trees: the newest host, both drafts."""
  out, notes = [], []
  rows = []
  shown_recs = []
  for draft in ('model', 'head'):
    recs = newest(records, 'tree_step_cost', lambda r, d=draft: _draft_of(r) == d)
    shown, note = detailed(recs)
    notes.append(note)
    for rec in shown:
      shown_recs.append(rec)
      for pair in rec['figures'].get('pairs', []):
        for s in pair['settings']:
          for r in s['rows']:
            rows.append([DRAFT_NAMES[draft], f"{s['temperature']:g}", r['form'],
                         num(r.get('propose')), num(r.get('score')), num(r.get('verify')),
                         num(r.get('step')), num(r.get('vs_chain'), '.2f', 'X'),
                         num(r.get('vs_target'), '.2f')])
  if not rows:
    return missing(TREE_COST_CMD)
  hosts = '; '.join(dict.fromkeys(f"{host_cell(r)} ({stamp(r)})" for r in shown_recs))
  out.append(f"{hosts}:\n\n" + table(
      ['draft', 'T', 'form', 'propose ms', 'score ms', 'verify ms', 'step ms', 'step / chain step',
       'step / target step'], rows))
  return '\n\n'.join(out) + ''.join(dict.fromkeys(notes))


PAIR_CMD = 'python scripts/make_docs.py --only=pair_eval'


def render_pair_quality(records) -> str:
  recs = newest(records, 'pair_eval')
  if not recs:
    return missing(PAIR_CMD)
  rec = recs[0]  # counts, not timings: the same on every host
  a = rec['args']
  rows = [[r['draft'], r.get('kind', '-'), num(r.get('params_m'), '.1f', 'M'),
           num(r.get('bleu'), '.1f'), num(r.get('alpha_t0')), num(r.get('tpc_t0')),
           num(r.get('alpha_t1')), num(r.get('tpc_t1')),
           '-' if 'same' not in r else ('yes' if r['same'] else 'NO')]
          for r in rec['figures']['rows']]
  return (table(['model', 'kind', 'params', 'BLEU (greedy)', 'alpha T = 0', 'tok/call T = 0',
                 'alpha T = 1', 'tok/call T = 1', 'greedy == AR'], rows)
          + f"\n\nBLEU on {a.get('bleu_n')} test verses, alpha and tokens per target call on "
            f"{a.get('alpha_n')} at gamma {a.get('gamma')}. {sources([rec])}")


# ----------------------------------------------------------------------------- accelerators

GPU_CMD = 'python scripts/make_docs.py --only=gpu_step   # on a GPU host'


def _gpu(records, key):
  """Every gpu_step record with stage `key` (each run a row: runs on one host differ)."""
  return [r for r in records
          if r['benchmark'] == 'gpu_step' and not r.get('smoke') and r['figures'].get(key)]


def render_gpu_steps(records) -> str:
  recs = _gpu(records, 'steps')
  if not recs:
    return missing(GPU_CMD)
  ks = sorted({s['tokens'] for r in recs for s in r['figures']['steps'] if s['model'] == 'target'})
  rows = []
  for rec in recs:
    steps = {s['tokens']: s for s in rec['figures']['steps'] if s['model'] == 'target'}
    draft = next((s for s in rec['figures']['steps'] if s['model'] == 'draft'), {})
    floor = (rec['figures'].get('floor') or [{}])[0]
    rows.append([host_cell(rec), rec['args'].get('dtype', '-'), num(steps[1]['step_ms']),
                 num(floor.get('x_floor'), '.2f', 'X'),
                 *(num(steps[k]['vs_1']) if k in steps else '-' for k in ks if k != 1),
                 num(draft.get('c'), '.3f'), stamp(rec)])
  return table(['device', 'dtype', '1-token step ms', 'step / bandwidth floor',
                *(f'{k} tokens / 1' for k in ks if k != 1), 'c (2-layer draft)', 'recorded'],
               rows) + '\n\n' + sources(recs)


def render_gpu_end2end(records) -> str:
  recs = _gpu(records, 'end2end_rows')
  if not recs:
    return missing(GPU_CMD)
  rows = []
  for rec in recs:
    for e in rec['figures']['end2end_rows']:
      rows.append([host_cell(rec), f"{e['temperature']:g}", e['gamma'], num(e['alpha']),
                   num(e['tokens_per_iter']), num(e['c'], '.3f'), num(e['speedup'], '.2f', 'X'),
                   num(e['predicted'], '.2f', 'X'), num(e['measured_over_predicted']),
                   stamp(rec)])
  return table(['device', 'T', 'gamma', 'alpha', 'tok/iteration', 'c', 'speedup',
                'predicted (Thm 3.8)', 'measured / predicted', 'recorded'], rows)


def render_gpu_identity(records) -> str:
  recs = _gpu(records, 'identity')
  if not recs:
    return missing(GPU_CMD)
  rows = []
  for rec in recs:
    for i in rec['figures']['identity']:
      rows.append([host_cell(rec), i['dtype'], 'yes' if i['identical'] else 'NO',
                   i['first_divergence'] if i['first_divergence'] is not None else '-',
                   i['block_argmax_flips'], num(i['delta_max'], '.2g'),
                   num(i['margin_median'], '.2g'), stamp(rec)])
  return table(['device', 'dtype', 'greedy spec == AR', 'first divergence',
                'block argmax flips', 'max logit change, block vs step', 'median top-2 margin',
                'recorded'], rows)


# ----------------------------------------------------------------------------- computed


def render_model_table(records) -> str:  # pylint: disable=unused-argument
  sys.path.insert(0, str(REPO / 'scripts'))
  import model_table  # pylint: disable=import-outside-toplevel
  return model_table.table().strip()


def render_memory_plan(records) -> str:  # pylint: disable=unused-argument
  import contextlib  # pylint: disable=import-outside-toplevel
  import io  # pylint: disable=import-outside-toplevel
  sys.path.insert(0, str(REPO / 'scripts'))
  import memory_plan  # pylint: disable=import-outside-toplevel
  buf = io.StringIO()
  with contextlib.redirect_stdout(buf):
    memory_plan.main([])
  return buf.getvalue().strip()


def render_pair_models(records) -> str:  # pylint: disable=unused-argument
  """The shipped pair's checkpoints: parameters, bytes on disk, and the float32 bytes one decode
  step streams (decoder blocks and output head; the embedding is a row lookup)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from safetensors import safe_open  # pylint: disable=import-outside-toplevel
  root = REPO / 'specjax' / 'assets' / 'tiny_pair'
  rows = []
  for name, file in (('target', 'model.safetensors'), ('draft', 'model.safetensors'),
                     ('head', 'head.safetensors')):
    path = root / name / file
    with safe_open(str(path), 'np') as f:
      sizes = {k: int(np.prod(f.get_slice(k).get_shape())) for k in f.keys()}
    if name == 'head':  # its own block and output head (it reads the target's K/V besides)
      step = sum(n for k, n in sizes.items() if k != 'start_feature')
    else:
      step = sum(n for k, n in sizes.items()
                 if (k.startswith('decoder.') and 'embed' not in k) or k.startswith('lm_head'))
    disk = sum(p.stat().st_size for p in (root / name).iterdir())
    rows.append([f'`{name}`', f'{sum(sizes.values()):,}', f'{disk / 1e6:.1f} MB',
                 f'{4 * step / 1e6:.1f} MB'])
  return table(['checkpoint', 'parameters', 'on disk (bf16)',
                'one decode step streams (float32)'], rows)


FIGURES: dict[str, Figure] = {
    'run-output': Figure(render_run_output, RUN_CMD, 'run.tiny'),
    'run-hosts': Figure(render_run_hosts, RUN_CMD, 'run.tiny'),
    'run-cells': Figure(render_run_cells, RUN_CMD, 'run.tiny'),
    'block-cost': Figure(render_block_cost, BLOCK_CMD, 'bench_block'),
    'transformers': Figure(render_transformers, TF_CMD, 'bench_transformers'),
    'refill': Figure(render_refill, REFILL_CMD, 'bench_batch'),
    'adaptive': Figure(render_adaptive, ADAPTIVE_CMD, 'bench_adaptive'),
    'trees': Figure(render_trees, TREE_CMD, 'bench_tree'),
    'tree-cost': Figure(render_tree_cost, TREE_COST_CMD, 'tree_step_cost'),
    'pair-quality': Figure(render_pair_quality, PAIR_CMD, 'pair_eval'),
    'gpu-steps': Figure(render_gpu_steps, GPU_CMD, 'gpu_step'),
    'gpu-end2end': Figure(render_gpu_end2end, GPU_CMD, 'gpu_step'),
    'gpu-identity': Figure(render_gpu_identity, GPU_CMD, 'gpu_step'),
    'model-table': Figure(render_model_table, ''),
    'memory-plan': Figure(render_memory_plan, ''),
    'pair-models': Figure(render_pair_models, ''),
}


# ----------------------------------------------------------------------------- documents


def documents(root: Path) -> list[Path]:
  return [root / 'README.md', *sorted((root / 'docs').glob('*.md'))]


def render_text(text: str, records, where: str = '') -> str:
  """`text` with every region rendered; unknown or unbalanced markers are errors."""
  names = ANY_MARK.findall(text)
  found = [m.group('name') for m in REGION.finditer(text)]
  if len(names) != 2 * len(found):
    raise SystemExit(f'{where}: unbalanced figure markers ({sorted(set(names))})')
  unknown = sorted(set(found) - set(FIGURES))
  if unknown:
    raise SystemExit(f'{where}: unknown figure(s) {unknown}; known: {sorted(FIGURES)}')

  def one(m):
    body = FIGURES[m.group('name')].render(records).strip()
    block = m.group('body').startswith('\n')
    inner = f'\n{body}\n' if block else body
    return f"<!-- fig:{m.group('name')} -->{inner}<!-- /fig:{m.group('name')} -->"
  return REGION.sub(one, text)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--check', action='store_true', help='fail (exit 1) where a document differs')
  p.add_argument('--list', action='store_true', help='regions, renderers and record commands')
  p.add_argument('--root', default=str(REPO), help='the tree to render (its docs/results too)')
  a = p.parse_args(argv)
  root = Path(a.root)
  records = results.load_records(root / 'docs' / 'results')
  if a.list:
    for path in documents(root):
      for m in REGION.finditer(path.read_text(encoding='utf-8')):
        fig = FIGURES.get(m.group('name'))
        print(f"{path.relative_to(root)}: fig:{m.group('name')} <- "
              f"{fig.render.__name__ if fig else '?'}; record: {fig.command or 'computed'}")
    return 0
  stale = []
  for path in documents(root):
    text = path.read_text(encoding='utf-8')
    new = render_text(text, records, str(path.relative_to(root)))
    if new == text:
      continue
    if a.check:
      stale.append(path)
      sys.stdout.writelines(difflib.unified_diff(
          text.splitlines(True), new.splitlines(True), f'{path.relative_to(root)} (as written)',
          f'{path.relative_to(root)} (rendered from docs/results)', n=1))
    else:
      path.write_text(new, encoding='utf-8')
      print(f'rendered {path.relative_to(root)}')
  if stale:
    print(f"\n{len(stale)} document(s) differ from their data: "
          f"{', '.join(str(s.relative_to(root)) for s in stale)}. Figures are rendered, not "
          'written: run python scripts/render_docs.py (after rerunning the measurement).',
          file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
