"""Tables (terminal, CSV, Markdown), plots (PNG) and the run's record of a sweep's results.jsonl.

Beside the tables the runner writes record.json: the run as one published record
(specjax.runner.results.make_record: the current rows, the printed table, the command, commit
and host), which `python scripts/record.py OUTPUT_DIR` adds to docs/results/, and prints the
figures recorded there for the closest host beside its own (console.beside_recorded).
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import sys
from typing import Any

import numpy as np

COLUMNS = [
    # header, key, format
    ('task', 'task', '{}'), ('draft', 'draft', '{}'), ('temp', 'temperature', '{:g}'),
    ('gamma', 'gamma', '{}'), ('stop', 'stop', '{}'), ('verify', 'verifier', '{}'),
    ('tree', 'tree', '{}'),
    ('alpha', 'alpha', '{:.2f}'), ('accept', 'acceptance_rate', '{:.2f}'),
    ('tok/call', 'tokens_per_target_call', '{:.2f}'),
    ('proposed/call', 'proposed_per_target_call', '{:.2f}'),
    ('passes/call', 'draft_passes_per_call', '{:.2f}'),
    ('block cost', 'block_cost', '{:.2f}'),
    ('pred (measured lengths, block cost)', 'pred_improvement_measured', '{:.2f}X'),
    ('pred (+ fixed cost per call)', 'pred_improvement_call', '{:.2f}X'),
    ('tok/call pred', 'tokens_per_target_call_pred', '{:.2f}'), ('c', 'c', '{:.3f}'),
    ('pred', 'pred_improvement', '{:.2f}X'), ('speedup', 'speedup', '{:.2f}X'),
    ('base s', 'baseline_s', '{:.3f}'), ('spec s', 'speculative_s', '{:.3f}'),
    ('speedup min-max', 'speedup_range', '{}'), ('compile s', 'speculative_compile_s', '{:.1f}'),
    ('quality base/spec', None, None), ('same', 'identical_to_baseline', '{}'),
    ('paper alpha', 'paper_alpha', '{:.2f}'), ('paper speedup', 'paper_speedup', '{:.1f}X'),
]


def _quality(row):
  qb, qs = row.get('quality_baseline', {}), row.get('quality_speculative', {})
  key = 'bleu' if 'bleu' in qb else 'rougeL'
  if key not in qb:
    return ''
  return f"{key} {qb[key]:.1f}/{qs[key]:.1f}"


def repeat_speedups(row) -> list[float]:
  """Speedup of each timed repeat (baseline and speculative ran side by side), if recorded, per
  generated token as the cell's `speedup` (`length_ratio`: 1 in records from before it)."""
  base, spec = row.get('baseline_times_s') or [], row.get('speculative_times_s') or []
  scale = row.get('length_ratio') or 1.0
  return [b / s * scale for b, s in zip(base, spec) if s > 0]


def _cell(row, key, fmt):
  if key is None:
    return _quality(row)
  if key == 'draft':
    return describe(row.get('draft_path') or row['draft'])
  if key == 'speedup_range':
    each = repeat_speedups(row)
    return f'{min(each):.2f}-{max(each):.2f}X' if each else '-'
  value = row.get(key, RULE_DEFAULTS.get(key))
  if value is None:
    return '-'
  if key == 'gamma' and row.get('paper_gamma'):
    return f'{value}*'
  if key == 'identical_to_baseline' and float(row.get('temperature', 0)) != 0.0:
    return 'n/a'
  return fmt.format(value)


# Rows written before stop rules and verifiers were sweep dimensions ran the paper's rule.
RULE_DEFAULTS = {'stop': 'fixed', 'verifier': 'token'}


def rule(row) -> tuple[str, str]:
  """(stop rule, verifier) of a row."""
  return row.get('stop', 'fixed'), row.get('verifier', 'token')


def sorted_rows(rows):
  return sorted(rows, key=lambda r: (r['task'], r['draft'], r['temperature'], r['gamma'],
                                     *rule(r), r.get('tree', '')))


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


@functools.lru_cache(maxsize=None)
def describe(model: str) -> str:
  """What a target or draft is, for titles: 'T5 7.0M' for a local checkpoint directory (its
  name too unless it is just 'target'/'draft'), the hub id or the n-gram draft's name otherwise."""
  path = os.path.expanduser(model)
  from specjax.runner import drafts  # pylint: disable=import-outside-toplevel
  if drafts.is_head_dir(path):  # a feature head: its own size (it reads the target's embedding)
    from specjax.models import head as head_lib  # pylint: disable=import-outside-toplevel
    try:
      path, options = drafts.head_spec(path)
      with open(os.path.join(path, 'head_config.json'), encoding='utf-8') as f:
        config = head_lib.HeadConfig(**json.load(f))
    except (OSError, ValueError, TypeError):
      return os.path.basename(os.path.normpath(path))
    vd = min(options.get('vocab', config.vocab_size), config.vocab_size)
    n = head_lib.param_count(config) - config.d_model * (config.vocab_size - vd)
    # Short enough that the compact table keeps its pred (call) column at 100 characters.
    kept = f', {vd}/{config.vocab_size} ids' if vd < config.vocab_size else ''
    mode = ', parallel' if options.get('parallel') else ''
    stored = f" {options['weights']}" if 'weights' in options else ''
    return f'feature head {n / 1e6:.1f}M{stored}{kept}{mode}'
  if not os.path.isfile(os.path.join(path, 'config.json')):
    return model
  from specjax.models import checkpoints  # pylint: disable=import-outside-toplevel
  from specjax.models.t5 import param_count  # pylint: disable=import-outside-toplevel
  try:
    n = param_count(checkpoints.read_config(path))
  except (OSError, ValueError):
    return os.path.basename(os.path.normpath(path))
  size = f'{n / 1e9:.1f}B' if n >= 1e9 else f'{n / 1e6:.1f}M' if n >= 1e5 else f'{n / 1e3:.0f}K'
  name = os.path.basename(os.path.normpath(path))
  return f'T5 {size}' if name in ('target', 'draft') else f'{name} (T5 {size})'


def _device(rows) -> str:
  kinds = sorted({str(r.get('device', '?')) for r in rows})
  return ', '.join('CPU' if k == 'cpu' else k for k in kinds)


def pair_title(spec, rows) -> str:
  """'tiny: T5 7.0M target / T5 1.6M draft', the drafts named by what they are."""
  drafts = list(dict.fromkeys(r.get('draft_path') or r['draft'] for r in sorted_rows(rows)))
  names = ', '.join(describe(d) for d in drafts) or '-'
  return (f"{spec.name}: {describe(spec.target)} target / {names} "
          f"draft{'s' if len(drafts) > 1 else ''}")


def _setting(rows) -> str:
  batch = sorted({r.get('batch_size', '?') for r in rows})
  return f"batch {', '.join(map(str, batch))}, {_device(rows)}"


def write_tables(spec, rows, out=None):
  """Prints the compact table (terminal width) and writes every column to table.csv / table.md."""
  from specjax.runner import console  # pylint: disable=import-outside-toplevel
  out = out or sys.stdout
  if not rows:
    print('no results', file=out)
    return
  rows = sorted_rows(rows)
  title = f'{pair_title(spec, rows)}; {_setting(rows)}'
  print(console.results_table(rows, title, describe=describe), file=out)
  legend = ("\n\n\\* = the paper's gamma for this row; paper columns from its Tables 2 and 3"
            if any(r.get('paper_gamma') for r in rows) else '')
  os.makedirs(spec.output_dir, exist_ok=True)
  _atomic_write(os.path.join(spec.output_dir, 'table.md'),
                f'# {title}\n\n{markdown(rows)}{legend}\n')
  headers, body = table_lines(rows)
  buf = io.StringIO()
  writer = csv.writer(buf)
  writer.writerow(headers)
  writer.writerows(body)
  _atomic_write(os.path.join(spec.output_dir, 'table.csv'), buf.getvalue())
  record = run_record(spec, rows, console.results_table(rows, title, describe=describe,
                                                         width=100))
  _atomic_write(os.path.join(spec.output_dir, 'record.json'),
                json.dumps(record, indent=1, sort_keys=True) + '\n')
  print(f"\nwrote {os.path.join(spec.output_dir, 'results.jsonl')}, table.csv, table.md "
        '(every column), record.json', file=out)
  beside = console.beside_recorded(record, describe=describe)
  if beside:
    print(f'\n{beside}', file=out)


# The spec fields a record keeps (what was run; the rest is in each row's settings).
RECORD_FIELDS = ('name', 'target', 'drafts', 'tasks', 'temperatures', 'gammas', 'num_examples',
                 'max_source_len', 'max_new_tokens', 'batch_size', 'repeats', 'dtype',
                 'matmul_precision', 'block_cost')


def run_command() -> str:
  """The command line of this process when it is `python -m specjax.run`, else ''."""
  import shlex  # pylint: disable=import-outside-toplevel
  if os.path.basename(sys.argv[0]) == 'run.py' and 'specjax' in sys.argv[0]:
    return shlex.join(['python', '-m', 'specjax.run', *sys.argv[1:]])
  return ''


def run_record(spec, rows, table_text: str = '') -> dict[str, Any]:
  """The run as a published record ('run.<config name>'): the current rows (without their
  settings), the printed table, the spec's fields, the host (bandwidth not probed here:
  scripts/record.py probes it when it publishes the record on the same host)."""
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  from specjax.runner import results  # pylint: disable=import-outside-toplevel
  host = machine.host_record(probe_bandwidth=False)
  kept = [{k: v for k, v in r.items() if k != 'settings'} for r in sorted_rows(rows)]
  args = {f: getattr(spec, f) for f in RECORD_FIELDS if hasattr(spec, f)}
  return results.make_record(
      f'run.{spec.name}', {'rows': kept, 'table_text': table_text, 'args': args,
                          'load': {'load_average_end': host['load_average']}},
      command=run_command(), host=host)


def _plt():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def _draft_names(rows):
  """draft label -> what it is ('T5 1.6M', 't5-small', 'bigram'), in table order."""
  return {r['draft']: describe(r.get('draft_path') or r['draft']) for r in sorted_rows(rows)}


def plots(spec, rows: list[dict[str, Any]]):
  """speedup_vs_gamma.png (measured solid with the spread over repeats, predicted dashed; one
  panel per task and temperature, shared y axis) and alpha_per_draft.png (values on the bars)."""
  if not rows:
    return
  os.makedirs(spec.output_dir, exist_ok=True)
  plt = _plt()
  names = _draft_names(rows)
  title = f'{pair_title(spec, rows)}; {_setting(rows)}'
  if len({rule(r) for r in rows}) > 1:
    tokens_vs_passes(spec, rows, title)
    rows = [r for r in rows if rule(r) == ('fixed', 'token')] or rows  # the paper's curves
  gammas = sorted({int(r['gamma']) for r in rows})
  groups = sorted({(r['task'], r['temperature']) for r in rows})
  fig, axes = plt.subplots(1, len(groups), figsize=(1.0 + 4.2 * len(groups), 3.8), squeeze=False,
                           sharey=True)
  for ax, (task, temp) in zip(axes[0], groups):
    for i, (draft, name) in enumerate(names.items()):
      cells = sorted((r for r in rows if r['task'] == task and r['temperature'] == temp
                      and r['draft'] == draft), key=lambda r: r['gamma'])
      if not cells:
        continue
      g = [r['gamma'] for r in cells]
      measured = np.array([r['speedup'] for r in cells])
      each = [repeat_speedups(r) or [r['speedup']] for r in cells]
      spread = np.array([[m - min(e) for m, e in zip(measured, each)],
                         [max(e) - m for m, e in zip(measured, each)]]).clip(min=0)
      color = f'C{i}'
      ax.errorbar(g, measured, yerr=spread, fmt='o-', color=color, capsize=3,
                  label=f'{name} measured (median, min-max of repeats)')
      ax.plot(g, [r['pred_improvement'] for r in cells], 's--', color=color, alpha=0.6,
              label=f'{name} predicted (Theorem 3.8)')
    ax.axhline(1.0, color='grey', lw=0.8)
    ax.set_xticks(gammas)
    ax.set_title(f'{task}, temperature {temp:g}', fontsize=9)
    ax.set_xlabel('gamma (drafts per iteration)')
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel('walltime speedup over autoregressive')
  axes[0][0].set_ylim(bottom=0)
  axes[0][-1].legend(fontsize=7)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(os.path.join(spec.output_dir, 'speedup_vs_gamma.png'), dpi=110)
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(2.5 + 1.4 * len(names) * len(groups), 3.6))
  width = 0.8 / max(len(groups), 1)
  for j, (task, temp) in enumerate(groups):
    vals = []
    for draft in names:
      a = [r['alpha'] for r in rows if r['draft'] == draft and r['task'] == task
           and r['temperature'] == temp]
      vals.append(float(np.mean(a)) if a else np.nan)
    bars = ax.bar(np.arange(len(names)) + j * width, vals, width, label=f'{task} T={temp:g}')
    ax.bar_label(bars, fmt='%.2f', fontsize=8, padding=2)
  ax.set_xticks(np.arange(len(names)) + width * (len(groups) - 1) / 2)
  ax.set_xticklabels(list(names.values()))
  ax.set_ylabel('alpha (mean over gamma)')
  ax.set_ylim(0, 1.1)
  ax.legend(fontsize=7, loc='upper right')
  ax.set_title(f'acceptance rate alpha per draft\n{title}', fontsize=9)
  fig.tight_layout()
  fig.savefig(os.path.join(spec.output_dir, 'alpha_per_draft.png'), dpi=110)
  plt.close(fig)


def tokens_vs_passes(spec, rows, title):
  """tokens_vs_passes.png: tokens per target call against draft passes per token, one point per
  (draft, gamma, stop rule, verifier); one panel per task and temperature. Points up and to the
  left are better: more tokens per target call for fewer draft passes per token."""
  plt = _plt()
  groups = sorted({(r['task'], r['temperature']) for r in rows})
  rules = sorted({rule(r) for r in rows})
  markers = 'os^vDP*X<>'
  fig, axes = plt.subplots(1, len(groups), figsize=(1.0 + 4.6 * len(groups), 4.0), squeeze=False)
  for ax, (task, temp) in zip(axes[0], groups):
    for i, (stop, verifier) in enumerate(rules):
      cells = sorted((r for r in rows if (r['task'], r['temperature']) == (task, temp)
                      and rule(r) == (stop, verifier) and r.get('draft_passes_per_call') is not None),
                     key=lambda r: (r['draft'], r['gamma']))
      if not cells:
        continue
      x = [r['draft_passes_per_call'] / max(r['tokens_per_target_call'], 1e-9) for r in cells]
      y = [r['tokens_per_target_call'] for r in cells]
      ax.plot(x, y, markers[i % len(markers)], color=f'C{i}', label=f'{stop}, {verifier}')
      for xi, yi, r in zip(x, y, cells):
        ax.annotate(str(r['gamma']), (xi, yi), fontsize=6, xytext=(2, 2),
                    textcoords='offset points')
    ax.set_title(f'{task}, temperature {temp:g} (labels: gamma)', fontsize=9)
    ax.set_xlabel('draft passes per token')
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel('tokens per target call')
  axes[0][-1].legend(fontsize=7)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(os.path.join(spec.output_dir, 'tokens_vs_passes.png'), dpi=110)
  plt.close(fig)


def trace_rows(trace_drafts_IxG, trace_accepted_I, tokens_L):
  """Per iteration: (accepted draft ids, rejected draft id or None, corrected/bonus id or None).

  The committed tokens decide what is shown: once the row ends inside a block (EOS accepted, or
  max_new_tokens reached) nothing after its last token is drawn, neither a rejected draft nor a
  corrected token.
  """
  rows, pos = [], 0
  for drafts_G, n in zip(trace_drafts_IxG, trace_accepted_I):
    n = int(n)
    left = len(tokens_L) - pos
    if n < 0 or left <= 0:
      break
    if n >= left:  # the row ended among the accepted drafts
      rows.append(([int(t) for t in tokens_L[pos:]], None, None))
      break
    accepted = [int(t) for t in tokens_L[pos:pos + n]]
    rejected = int(drafts_G[n]) if n < len(drafts_G) else None
    rows.append((accepted, rejected, int(tokens_L[pos + n])))
    pos += n + 1
  return rows


_CHAR_IN = 0.0667   # width of one 8-pt monospace character, inches
_PREFIX_CHARS = 56  # committed text shown before each row's drafts


def trace_picture(spec, task, label, tokenizer, trace_drafts_IxG, trace_accepted_I, tokens_L, *,
                  gamma, temperature):
  """The paper's Figure 1 for one prompt: accepted drafts green, rejected red, corrected blue.

  Laid out on a character grid (x in monospace characters), so the committed text ends exactly
  where each row's drafts begin and the figure is as wide as its longest row.
  """
  from matplotlib.patches import Patch  # pylint: disable=import-outside-toplevel
  rows = trace_rows(trace_drafts_IxG, trace_accepted_I, tokens_L)
  piece = lambda t: tokenizer.convert_ids_to_tokens(int(t)).replace('\u2581', ' ')
  lines, committed = [], ''
  for accepted, rejected, fixed in rows:
    segments = [(piece(t), '#c8f0c8') for t in accepted]
    if rejected is not None:
      segments.append((piece(rejected), '#f6c6c6'))
    if fixed is not None:
      segments.append((piece(fixed), '#c6d8f6'))
    lines.append((committed[-_PREFIX_CHARS:], segments))
    committed += ''.join(piece(t) for t in accepted) + (piece(fixed) if fixed is not None else '')
  prefix_w = max([len(p) for p, _ in lines] + [1])
  chars = prefix_w + 1 + max([sum(len(t) + 1 for t, _ in seg) for _, seg in lines] + [10])
  # Inches: margins, title and legend bands, one band per row; x is in characters throughout.
  margin, top, bottom, row_h = 0.25, 0.6, 0.4, 0.26
  width = max(7.5, chars * _CHAR_IN + 2 * margin)
  height = top + bottom + row_h * max(len(lines), 1)
  plt = _plt()
  fig = plt.figure(figsize=(width, height))
  ax = fig.add_axes([margin / width, bottom / height, 1 - 2 * margin / width,
                     1 - (top + bottom) / height])
  ax.axis('off')
  text = dict(fontsize=8, family='monospace', va='center')
  x0 = ((width - 2 * margin) / _CHAR_IN - chars) / 2  # centred when narrower than the figure
  for y, (prefix, segments) in enumerate(lines):
    ax.text(x0 + prefix_w, -y, prefix, ha='right', color='#555555', **text)
    x = x0 + prefix_w + 1
    for token, color in segments:
      shown = token.lstrip(' ') or token
      x += len(token) - len(shown)  # a word's leading space is a gap, not part of the box
      ax.text(x, -y, shown, ha='left', bbox=dict(facecolor=color, edgecolor='none', pad=1.2),
              **text)
      x += len(shown) + 1
  ax.set_xlim(0, (width - 2 * margin) / _CHAR_IN)
  ax.set_ylim(-len(lines) + 0.5, 0.5)
  draft = describe(next((d for d in spec.drafts if spec.draft_label(d) == label), label))
  ax.set_title(f'{task}, first prompt: {draft} draft proposing for the {describe(spec.target)} '
               f'target (gamma={gamma}, T={temperature:g})\n{len(rows)} target calls for '
               f'{len(tokens_L)} tokens; one row per target call', fontsize=9)
  ax.legend(handles=[Patch(color='#c8f0c8', label='accepted draft'),
                     Patch(color='#f6c6c6', label='rejected draft'),
                     Patch(color='#c6d8f6', label='corrected / bonus (target)')],
            loc='upper center', bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8, frameon=False)
  path = os.path.join(spec.output_dir, f'trace_{task}_{label}.png')
  os.makedirs(spec.output_dir, exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
