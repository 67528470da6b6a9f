"""Tables (terminal, CSV, Markdown) and plots (PNG) of a sweep's results.jsonl."""

from __future__ import annotations

import csv
import io
import os
import sys
from typing import Any

import numpy as np

COLUMNS = [
    # header, key, format
    ('task', 'task', '{}'), ('draft', 'draft', '{}'), ('temp', 'temperature', '{:g}'),
    ('gamma', 'gamma', '{}'), ('alpha', 'alpha', '{:.2f}'), ('accept', 'acceptance_rate', '{:.2f}'),
    ('tok/call', 'tokens_per_target_call', '{:.2f}'),
    ('tok/call pred', 'tokens_per_target_call_pred', '{:.2f}'), ('c', 'c', '{:.3f}'),
    ('pred', 'pred_improvement', '{:.2f}X'), ('speedup', 'speedup', '{:.2f}X'),
    ('base s', 'baseline_s', '{:.3f}'), ('spec s', 'speculative_s', '{:.3f}'),
    ('compile s', 'speculative_compile_s', '{:.1f}'),
    ('quality base/spec', None, None), ('same', 'identical_to_baseline', '{}'),
    ('paper alpha', 'paper_alpha', '{:.2f}'), ('paper speedup', 'paper_speedup', '{:.1f}X'),
]


def _quality(row):
  qb, qs = row.get('quality_baseline', {}), row.get('quality_speculative', {})
  key = 'bleu' if 'bleu' in qb else 'rougeL'
  if key not in qb:
    return ''
  return f"{key} {qb[key]:.1f}/{qs[key]:.1f}"


def _cell(row, key, fmt):
  if key is None:
    return _quality(row)
  value = row.get(key)
  if value is None:
    return '-'
  if key == 'gamma' and row.get('paper_gamma'):
    return f'{value}*'
  if key == 'identical_to_baseline' and float(row.get('temperature', 0)) != 0.0:
    return 'n/a'
  return fmt.format(value)


def sorted_rows(rows):
  return sorted(rows, key=lambda r: (r['task'], r['draft'], r['temperature'], r['gamma']))


def table_lines(rows) -> tuple[list[str], list[list[str]]]:
  headers = [h for h, _, _ in COLUMNS]
  body = [[_cell(r, k, f) for _, k, f in COLUMNS] for r in sorted_rows(rows)]
  return headers, body


def markdown(rows) -> str:
  headers, body = table_lines(rows)
  lines = ['| ' + ' | '.join(headers) + ' |', '|' + '---|' * len(headers)]
  lines += ['| ' + ' | '.join(r) + ' |' for r in body]
  return '\n'.join(lines)


def _atomic_write(path: str, text: str):
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    f.write(text)
  os.replace(tmp, path)


def write_tables(spec, rows, out=None):
  """Prints the table in the paper's layout and writes table.csv / table.md next to results.jsonl."""
  out = out or sys.stdout
  if not rows:
    print('no results', file=out)
    return
  headers, body = table_lines(rows)
  title = (f'{spec.name}: target {os.path.basename(os.path.normpath(spec.target))}  '
           '(* = the paper\'s gamma for this row; paper columns from Table 2/3)')
  try:
    from rich.console import Console  # pylint: disable=import-outside-toplevel
    from rich.table import Table  # pylint: disable=import-outside-toplevel
    table = Table(title=title, show_lines=False)
    for h in headers:
      table.add_column(h, justify='left' if h in ('task', 'draft') else 'right')
    for r in body:
      table.add_row(*r)
    Console(file=out, width=250, force_jupyter=False).print(table)
  except ImportError:
    print(title, file=out)
    print(markdown(rows), file=out)
  os.makedirs(spec.output_dir, exist_ok=True)
  _atomic_write(os.path.join(spec.output_dir, 'table.md'), f'# {title}\n\n{markdown(rows)}\n')
  buf = io.StringIO()
  writer = csv.writer(buf)
  writer.writerow(headers)
  writer.writerows(body)
  _atomic_write(os.path.join(spec.output_dir, 'table.csv'), buf.getvalue())
  print(f"\nwrote {os.path.join(spec.output_dir, 'results.jsonl')}, table.csv, table.md",
        file=out)


def _plt():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def plots(spec, rows: list[dict[str, Any]]):
  """speedup_vs_gamma.png (measured solid, predicted dashed) and alpha_per_draft.png."""
  if not rows:
    return
  plt = _plt()
  groups = sorted({(r['task'], r['temperature']) for r in rows})
  fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 3.6), squeeze=False)
  for ax, (task, temp) in zip(axes[0], groups):
    for i, draft in enumerate(sorted({r['draft'] for r in rows})):
      pts = sorted((r['gamma'], r['speedup'], r['pred_improvement']) for r in rows
                   if r['task'] == task and r['temperature'] == temp and r['draft'] == draft)
      if not pts:
        continue
      g, s, p = zip(*pts)
      color = f'C{i}'
      ax.plot(g, s, 'o-', color=color, label=f'{draft} measured')
      ax.plot(g, p, 's--', color=color, alpha=0.6, label=f'{draft} predicted')
    ax.axhline(1.0, color='grey', lw=0.8)
    ax.set_title(f'{task}, temperature {temp:g}')
    ax.set_xlabel('gamma')
    ax.set_ylabel('walltime speedup')
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(spec.output_dir, 'speedup_vs_gamma.png'), dpi=110)
  plt.close(fig)

  drafts = sorted({r['draft'] for r in rows})
  fig, ax = plt.subplots(figsize=(1.5 + 1.2 * len(drafts) * len(groups), 3.4))
  width = 0.8 / max(len(groups), 1)
  for j, (task, temp) in enumerate(groups):
    vals = []
    for draft in drafts:
      a = [r['alpha'] for r in rows if r['draft'] == draft and r['task'] == task
           and r['temperature'] == temp]
      vals.append(float(np.mean(a)) if a else 0.0)
    ax.bar(np.arange(len(drafts)) + j * width, vals, width, label=f'{task} T={temp:g}')
  ax.set_xticks(np.arange(len(drafts)) + width * (len(groups) - 1) / 2)
  ax.set_xticklabels(drafts)
  ax.set_ylabel('alpha')
  ax.set_ylim(0, 1)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(spec.output_dir, 'alpha_per_draft.png'), dpi=110)
  plt.close(fig)


def trace_rows(trace_drafts_IxG, trace_accepted_I, tokens_L):
  """Per iteration: (accepted draft ids, rejected draft id or None, corrected/bonus id or None)."""
  rows, pos = [], 0
  for drafts_G, n in zip(trace_drafts_IxG, trace_accepted_I):
    n = int(n)
    if n < 0 or pos >= len(tokens_L):
      break
    accepted = [int(t) for t in drafts_G[:n]]
    rejected = int(drafts_G[n]) if n < len(drafts_G) else None
    fixed = int(tokens_L[pos + n]) if pos + n < len(tokens_L) else None
    rows.append((accepted, rejected, fixed))
    pos += n + 1
  return rows


def trace_picture(spec, task, label, tokenizer, trace_drafts_IxG, trace_accepted_I, tokens_L, *,
                  gamma, temperature):
  """The paper's Figure 1 for one prompt: accepted drafts green, rejected red, corrected blue."""
  rows = trace_rows(trace_drafts_IxG, trace_accepted_I, tokens_L)
  piece = lambda t: tokenizer.convert_ids_to_tokens(int(t)).replace('\u2581', ' ')
  plt = _plt()
  fig, ax = plt.subplots(figsize=(12, 0.34 * len(rows) + 0.8))
  ax.axis('off')
  committed, y = '', 0
  for accepted, rejected, fixed in rows:
    x = 0.0
    prefix = committed[-40:]
    ax.text(x, -y, prefix, fontsize=8, family='monospace', color='black', va='center')
    x += 0.0062 * len(prefix) + 0.01
    segments = [(piece(t), '#c8f0c8') for t in accepted]
    if rejected is not None:
      segments.append((piece(rejected), '#f6c6c6'))
    if fixed is not None:
      segments.append((piece(fixed), '#c6d8f6'))
    for text, color in segments:
      ax.text(x, -y, text, fontsize=8, family='monospace', va='center',
              bbox=dict(facecolor=color, edgecolor='none', pad=1.5))
      x += 0.0062 * max(len(text), 1) + 0.012
    committed += ''.join(piece(t) for t in accepted) + (piece(fixed) if fixed is not None else '')
    y += 1
  ax.set_xlim(0, 1)
  ax.set_ylim(-y, 1)
  ax.set_title(f'{task}: {label} drafts for {os.path.basename(os.path.normpath(spec.target))}, '
               f'gamma={gamma}, T={temperature:g}: {len(rows)} target calls for {len(tokens_L)} '
               'tokens (green accepted, red rejected, blue corrected/bonus)', fontsize=9)
  fig.tight_layout()
  path = os.path.join(spec.output_dir, f'trace_{task}_{label}.png')
  os.makedirs(spec.output_dir, exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
