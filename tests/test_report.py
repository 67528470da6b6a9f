"""What the runner shows: the compact terminal table, the files, the plots and the trace rows."""

import os
import subprocess
import sys
import types

import pytest

from specjax import data
from specjax.runner import console
from specjax.runner import report


def _row(temperature=0.0, gamma=3, **extra):
  row = {
      'task': 'bible_en_es', 'draft': 'draft', 'draft_path': str(data.TINY_PAIR_DIR / 'draft'),
      'temperature': temperature, 'gamma': gamma, 'alpha': 0.69, 'acceptance_rate': 0.5,
      'tokens_per_target_call': 2.49, 'tokens_per_target_call_pred': 2.46, 'c': 0.094,
      'pred_improvement': 1.92, 'speedup': 0.89, 'baseline_s': 0.54, 'speculative_s': 0.608,
      'speculative_compile_s': 4.3, 'quality_baseline': {'bleu': 8.5},
      'quality_speculative': {'bleu': 8.5}, 'identical_to_baseline': True, 'paper_gamma': False,
      'paper_alpha': None, 'paper_speedup': None, 'batch_size': 1, 'device': 'cpu',
      'baseline_times_s': [0.5, 0.54, 0.6], 'speculative_times_s': [0.6, 0.608, 0.55],
  }
  row.update(extra)
  return row


def _spec(tmp_path, **kw):
  return types.SimpleNamespace(
      name='tiny', target=str(data.TINY_PAIR_DIR / 'target'),
      drafts=(str(data.TINY_PAIR_DIR / 'draft'),), output_dir=str(tmp_path),
      draft_label=lambda d: d if d in ('unigram', 'bigram') else os.path.basename(d), **kw)


ROWS = [_row(t, g) for t in (0.0, 1.0) for g in (2, 3, 5)]


def test_models_are_named_by_what_they_are():
  assert report.describe(str(data.TINY_PAIR_DIR / 'target')) == 'T5 24.3M'
  assert report.describe(str(data.TINY_PAIR_DIR / 'draft')) == 'T5 1.6M'
  assert report.describe('t5-small') == 't5-small' and report.describe('bigram') == 'bigram'


def test_terminal_table_keeps_only_informative_columns(tmp_path, capsys, monkeypatch):
  monkeypatch.setenv('COLUMNS', '100')  # the width an untty'd run falls back to; CI may set less
  report.write_tables(_spec(tmp_path), ROWS)
  out = capsys.readouterr().out
  lines = out.splitlines()
  assert lines[0].startswith('tiny: T5 24.3M target / T5 1.6M draft; batch 1, CPU')
  assert 'task bible_en_es' in lines[0] and 'c 0.094' in lines[0]  # one value: in the title
  header = lines[1].split()
  assert 'paper' not in lines[1] and 'task' not in header and 'draft' not in header
  assert '*' not in out  # nothing to explain, no legend
  assert 'tok/call' in lines[1] and 'speedup' in lines[1] and 'BLEU' in lines[1]
  assert max(len(line) for line in lines[:8]) <= 100
  # The files keep every column, the draft named by its size.
  md = (tmp_path / 'table.md').read_text()
  assert 'paper alpha' in md and '| T5 1.6M |' in md and '0.83-1.09X' in md
  assert (tmp_path / 'table.csv').read_text().count('\n') == len(ROWS) + 1


def test_terminal_table_shows_paper_columns_and_legend_when_they_carry_values():
  rows = [_row(0.0, 3, paper_gamma=True, paper_speedup=3.4, paper_alpha=0.75),
          _row(0.0, 5, draft='t5-small', draft_path='t5-small')]
  text = console.results_table(rows, 'title', describe=report.describe, width=200)
  assert 'paper alpha' in text and 'paper speedup' in text and '3.4X' in text
  assert ' 3*' in text and "* = the paper's gamma" in text
  assert 'T5 1.6M' in text and 't5-small' in text  # two drafts: a draft column


def test_terminal_table_fits_a_narrow_terminal():
  text = console.results_table(ROWS, 'title', width=72)
  lines = text.splitlines()
  assert all(len(line) <= 72 for line in lines[1:-1]), text
  assert lines[-1].startswith('left out for the terminal width:') and 'table.md' in lines[-1]
  assert 'alpha' in lines[1] and 'speedup' in lines[1]  # the key columns stay


def test_plots_with_and_without_per_repeat_times(tmp_path):
  report.plots(_spec(tmp_path), ROWS)
  old = [{k: v for k, v in r.items() if not k.endswith('_times_s')} for r in ROWS]
  report.plots(_spec(tmp_path / 'old'), old)
  for d in (tmp_path, tmp_path / 'old'):
    for name in ('speedup_vs_gamma.png', 'alpha_per_draft.png'):
      assert (d / name).stat().st_size > 10_000, (d, name)
  assert report.repeat_speedups(ROWS[0]) == pytest.approx([0.5 / 0.6, 0.54 / 0.608, 0.6 / 0.55])
  assert report.repeat_speedups(old[0]) == []
  longer = dict(ROWS[0], length_ratio=1.25)  # per generated token, as the cell's speedup
  assert report.repeat_speedups(longer) == pytest.approx(
      [1.25 * 0.5 / 0.6, 1.25 * 0.54 / 0.608, 1.25 * 0.6 / 0.55])


def test_trace_rows_stop_at_the_end_of_the_output():
  eos = 1
  drafts = [[5, 6, 7], [8, eos, 9], [0, 0, 0]]
  # Iteration 1: 2 accepted, 7 rejected, 4 corrected. Iteration 2: 8 and EOS accepted, the row
  # ends: no rejected draft and no corrected token after the EOS.
  rows = report.trace_rows(drafts, [2, 3, -1], [5, 6, 4, 8, eos])
  assert rows == [([5, 6], 7, 4), ([8, eos], None, None)]
  # All accepted: a bonus token, no rejected one; max_new_tokens cuts the second block.
  assert report.trace_rows([[5, 6], [7, 8]], [2, 2], [5, 6, 3, 7]) == [([5, 6], None, 3), ([7], None, None)]


def test_trace_picture_is_as_wide_as_its_rows(tmp_path):
  tok = data.bible_tokenizer()
  ids = tok('Y dijo Dios: Sea la luz; y fué la luz. Y vió Dios que la luz era buena.').input_ids
  g = 4
  drafts = [ids[i:i + g] + [0] * (g - len(ids[i:i + g])) for i in range(0, len(ids), 2)]
  accepted = [1] * len(drafts)  # one draft accepted, the next rejected, one corrected
  path = report.trace_picture(_spec(tmp_path), 'bible_en_es', 'draft', tok, drafts, accepted, ids,
                              gamma=g, temperature=0.0)
  import matplotlib.image
  height, width = matplotlib.image.imread(path).shape[:2]
  assert width >= 7.5 * 110 - 2 and height > 0.26 * 110 * len(ids) // 2


def test_quiet_silences_start_up_chatter():
  code = '\n'.join([
      'import logging, sys',
      'logging.basicConfig(level=logging.INFO)  # what absl does',
      'if sys.argv[1] == "quiet":',
      '  from specjax.runner import console; console.quiet()',
      'sys.modules["torch"] = None  # as on a machine without PyTorch',
      'import transformers, jax',
      'jax.devices()',
  ])
  env = {**os.environ, 'JAX_PLATFORMS': '', 'TRANSFORMERS_NO_ADVISORY_WARNINGS': ''}
  env.pop('TRANSFORMERS_NO_ADVISORY_WARNINGS')
  run = lambda mode: subprocess.run([sys.executable, '-c', code, mode], env=env, text=True,
                                    capture_output=True, timeout=300)
  loud, quiet = run('loud'), run('quiet')
  assert loud.returncode == 0 and quiet.returncode == 0, quiet.stderr
  assert 'PyTorch was not found' in loud.stderr and 'libtpu' in loud.stderr  # the control
  assert quiet.stderr.strip() == '', quiet.stderr


def test_the_run_writes_its_record_and_compares_with_the_records(tmp_path, capsys, monkeypatch):
  import json  # pylint: disable=import-outside-toplevel
  from specjax.runner import results  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(results, 'RECORDS_DIR', tmp_path / 'records')
  (tmp_path / 'records').mkdir()
  report.write_tables(_spec(tmp_path / 'out'), ROWS)
  out = capsys.readouterr().out
  assert 'no published record of this configuration' in out
  record = json.loads((tmp_path / 'out' / 'record.json').read_text())
  assert record['benchmark'] == 'run.tiny' and record['host']['cpu_model']
  assert len(record['figures']['rows']) == len(ROWS) and 'settings' not in record['figures']['rows'][0]
  assert record['figures']['table_text'].startswith('tiny: T5 24.3M target')
  assert str(data.TINY_PAIR_DIR) not in json.dumps(record)  # paths inside the repo: relative
  # Published, it is what the next run compares with.
  results.append_record(record, tmp_path / 'records')
  report.write_tables(_spec(tmp_path / 'out'), ROWS)
  out = capsys.readouterr().out
  assert 'recorded on this host' in out and 'this run' in out and 'block cost' in out
