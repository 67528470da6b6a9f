"""What the runner prints: a quiet start and a compact results table that fits the terminal.

`quiet()` silences start-up lines that say nothing about the run (absl's INFO about a missing
libtpu, transformers' "PyTorch was not found", matplotlib's font-cache notice); call it before
those libraries are imported or initialised. `results_table(rows)` keeps only the columns that
carry information (a column with one value for every row moves into the title; empty paper
columns and legends with nothing to explain are left out) and drops the least important columns
while the table is wider than the terminal. table.csv / table.md keep every column.
`beside_recorded(record)` sets the run's best speedups and block costs beside those recorded
(docs/results/) on the closest host.
"""

from __future__ import annotations

import logging
import os
import shutil

# Start-up chatter to silence: logger name -> the level from which it still speaks.
_QUIET_LOGGERS = {
    'jax._src.xla_bridge': logging.WARNING,      # "Unable to initialize backend 'tpu'" (INFO)
    'matplotlib.font_manager': logging.ERROR,    # "Matplotlib is building the font cache"
}


def quiet():
  """Environment and logger levels that keep the default run's output to the run itself."""
  os.environ.setdefault('TRANSFORMERS_NO_ADVISORY_WARNINGS', '1')  # "PyTorch was not found"
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')               # XLA's C++ INFO lines
  for name, level in _QUIET_LOGGERS.items():
    logging.getLogger(name).setLevel(level)


# ----------------------------------------------------------------------------- the table


def _x(value):
  return f'{value:.2f}X'


def _pair(a, b, fmt, sep=' / '):
  return f'{fmt.format(a)}{sep}{fmt.format(b)}'


def _quality(row):
  qb, qs = row.get('quality_baseline') or {}, row.get('quality_speculative') or {}
  key = 'bleu' if 'bleu' in qb else 'rougeL'
  return (key, qb[key], qs[key]) if key in qb and key in qs else None


def _columns(rows, describe):
  """(header, cell function, priority, right-aligned) in display order; higher priority stays
  longer when the terminal is narrow."""
  metric = {q[0] for q in map(_quality, rows) if q}
  metric_name = {'bleu': 'BLEU', 'rougeL': 'ROUGE-L'}.get(next(iter(metric)), '') if len(metric) == 1 else 'quality'
  greedy = any(float(r['temperature']) == 0.0 for r in rows)
  marked = any(r.get('paper_gamma') for r in rows)

  def quality(r):
    q = _quality(r)
    if not q:
      return '-'
    return (f'{q[1]:.1f}/{q[2]:.1f}' if len(metric) == 1 else f'{q[0]} {q[1]:.1f}/{q[2]:.1f}')

  def same(r):
    if float(r['temperature']) != 0.0:
      return '-'
    return 'yes' if r.get('identical_to_baseline') else 'NO'

  cols = [
      ('task', lambda r: r['task'], 9, False),
      ('draft', lambda r: describe(r.get('draft_path') or r['draft']), 9, False),
      ('T', lambda r: f"{float(r['temperature']):g}", 10, True),
      ('gamma', lambda r: f"{r['gamma']}{'*' if marked and r.get('paper_gamma') else ''}", 10, True),
      ('alpha', lambda r: f"{r['alpha']:.2f}", 8, True),
      ('c', lambda r: f"{r['c']:.3f}", 6, True),
      ('tok/call (pred)', lambda r: f"{r['tokens_per_target_call']:.2f} "
                                    f"({r['tokens_per_target_call_pred']:.2f})", 7, True),
      ('speedup (pred)', lambda r: f"{_x(r['speedup'])} ({_x(r['pred_improvement'])})", 8, True),
      ('base / spec s', lambda r: _pair(r['baseline_s'], r['speculative_s'], '{:.3f}'), 4, True),
      (f'{metric_name} base/spec', quality, 3, True),
  ]
  if any((r.get('stop', 'fixed'), r.get('verifier', 'token')) != ('fixed', 'token') for r in rows):
    cols[4:4] = [('stop', lambda r: r.get('stop', 'fixed'), 9, False),
                 ('verify', lambda r: r.get('verifier', 'token'), 9, False),
                 ('passes/tok', lambda r: '-' if r.get('draft_passes_per_call') is None else
                  f"{r['draft_passes_per_call'] / max(r['tokens_per_target_call'], 1e-9):.2f}",
                  6, True)]
  if any(r.get('block_cost', 1.0) != 1.0 for r in rows):  # the measured block cost's prediction
    at = [c[0] for c in cols].index('speedup (pred)') + 1
    cols.insert(at, ('pred (block)', lambda r: ('-' if r.get('pred_improvement_measured') is None
                                                else _x(r['pred_improvement_measured'])), 6, True))
  if any(r.get('pred_improvement_call') is not None for r in rows):  # and the calls' fixed cost
    at = [c[0] for c in cols].index('pred (block)') + 1 if 'pred (block)' in [
        c[0] for c in cols] else [c[0] for c in cols].index('speedup (pred)') + 1
    cols.insert(at, ('pred (call)', lambda r: ('-' if r.get('pred_improvement_call') is None
                                               else _x(r['pred_improvement_call'])), 6, True))
  if any(r.get('tree') for r in rows):
    cols[4:4] = [('tree', lambda r: r.get('tree') or '-', 9, False)]
  if greedy:
    cols.append(('same tokens', same, 5, True))
  if any(r.get('paper_alpha') is not None for r in rows):
    cols.append(('paper alpha', lambda r: '-' if r.get('paper_alpha') is None
                 else f"{r['paper_alpha']:.2f}", 2, True))
  if any(r.get('paper_speedup') is not None for r in rows):
    cols.append(('paper speedup', lambda r: '-' if r.get('paper_speedup') is None
                 else f"{r['paper_speedup']:.1f}X", 1, True))
  return cols


def _render(headers, body, right):
  widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(headers)]
  align = lambda text, i: text.rjust(widths[i]) if right[i] else text.ljust(widths[i])
  lines = ['  '.join(align(h, i) for i, h in enumerate(headers)).rstrip(),
           '  '.join('-' * w for w in widths)]
  lines += ['  '.join(align(c, i) for i, c in enumerate(r)).rstrip() for r in body]
  return lines


def results_table(rows, title: str, describe=lambda name: name, width: int | None = None) -> str:
  """The compact terminal table of sorted `rows` (results.jsonl records) under `title`."""
  width = width or shutil.get_terminal_size((100, 24)).columns
  cols = _columns(rows, describe)
  cells = [[fn(r) for r in rows] for _, fn, _, _ in cols]
  constant = [h for (h, _, _, _), values in zip(cols, cells)
              if len(rows) > 1 and len(set(values)) == 1
              and h in ('task', 'draft', 'c', 'stop', 'verify')]
  facts = [f'{h} {values[0]}' for (h, _, _, _), values in zip(cols, cells)
           if h in constant and h != 'draft']
  keep = [i for i, (h, _, _, _) in enumerate(cols) if h not in constant]
  dropped = []
  while True:
    headers = [cols[i][0] for i in keep]
    body = [[cells[i][j] for i in keep] for j in range(len(rows))]
    lines = _render(headers, body, [cols[i][3] for i in keep])
    if len(lines[0]) <= width and all(len(line) <= width for line in lines) or len(keep) <= 4:
      break
    lowest = min(keep, key=lambda i: cols[i][2])
    dropped.append(cols[lowest][0])
    keep.remove(lowest)
  head = title + (f" ({', '.join(facts)})" if facts else '')
  notes = []
  if any(r.get('paper_gamma') for r in rows) and 'gamma' in headers:
    notes.append("* = the paper's gamma for this row; paper columns from its Tables 2 and 3")
  if dropped:
    notes.append(f"left out for the terminal width: {', '.join(dropped)} (all in table.md)")
  return '\n'.join([head, *lines, *notes])


# ----------------------------------------------------------------------------- beside the records


def best_speedups(rows) -> dict[tuple[str, float], tuple[float, int]]:
  """{(draft path, temperature): (best measured speedup, its gamma)} over the paper's cells
  (fixed gamma, token verification, no tree)."""
  best: dict[tuple[str, float], tuple[float, int]] = {}
  for r in rows:
    if (r.get('stop', 'fixed'), r.get('verifier', 'token')) != ('fixed', 'token') or r.get('tree'):
      continue
    key = (r.get('draft_path') or r['draft'], float(r['temperature']))
    if key not in best or r['speedup'] > best[key][0]:
      best[key] = (float(r['speedup']), int(r['gamma']))
  return best


def block_costs(rows) -> dict[int, float]:
  """{gamma: the target's (gamma+1)-token step over its 1-token step}, where measured."""
  return {int(r['gamma']): float(r['block_cost']) for r in rows
          if r.get('block_cost') not in (None, 1.0) and not r.get('tree')}


def beside_recorded(record, records_dir=None, describe=lambda name: name) -> str:
  """A few lines: this run's best speedups and block costs beside the ones recorded for the
  closest host (docs/results/<benchmark>/); '' outside a checkout with records."""
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  from specjax.runner import results  # pylint: disable=import-outside-toplevel
  records_dir = records_dir or results.RECORDS_DIR
  bench = record['benchmark']
  if not os.path.isdir(records_dir):
    return ''
  hosts = results.latest_per_host(results.load_records(records_dir, bench), bench)
  if not hosts:
    shown = os.path.relpath(os.path.join(records_dir, bench), results.REPO)
    return (f'no published record of this configuration to compare with yet ({shown}/; '
            'docs/reproducing.md)')
  near = results.closest_host(record['host'], hosts.values())
  mine, theirs = record['figures']['rows'], near['figures']['rows']
  best_mine, best_theirs = best_speedups(mine), best_speedups(theirs)
  same = near['host_id'] == record['host_id']
  where = 'this host' if same else 'the closest recorded host'
  head = (f"best speedup beside the one recorded on {where} ({near['created'][:10]}, commit "
          f"{near.get('commit') or '?'}):\n  {machine.describe_host(near['host'])}")
  body = [('draft', 'T', 'this run', 'recorded')]
  for key in sorted(set(best_mine) | set(best_theirs), key=lambda k: (k[1], k[0])):
    cell = lambda d: f'{d[key][0]:.2f}X (gamma {d[key][1]})' if key in d else '-'  # noqa: E731
    body.append((describe(key[0]), f'{key[1]:g}', cell(best_mine), cell(best_theirs)))
  lines = _render(list(body[0]), [list(b) for b in body[1:]], [False, True, True, True])
  costs = lambda d: ', '.join(f'{v:.2f} (gamma {g})' for g, v in sorted(d.items())) or '-'  # noqa: E731
  lines = [head, *lines, f'block cost: this run {costs(block_costs(mine))}; '
                         f'recorded {costs(block_costs(theirs))}']
  return '\n'.join(lines)
