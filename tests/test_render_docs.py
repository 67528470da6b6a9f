"""Figures as data: every marked region of README.md and docs/*.md is what its records render to
(scripts/render_docs.py --check, run here so that CI runs it), and a number edited by hand fails."""

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'scripts'))
import render_docs  # noqa: E402  pylint: disable=wrong-import-position

from specjax.runner import results  # noqa: E402  pylint: disable=wrong-import-position


def _copy_tree(tmp_path) -> Path:
  root = tmp_path / 'tree'
  (root / 'docs').mkdir(parents=True)
  shutil.copy(ROOT / 'README.md', root / 'README.md')
  for page in (ROOT / 'docs').glob('*.md'):
    shutil.copy(page, root / 'docs' / page.name)
  shutil.copytree(ROOT / 'docs' / 'results', root / 'docs' / 'results')
  return root


def test_docs_match_their_records(capsys):
  assert render_docs.main(['--check']) == 0, capsys.readouterr().out


def test_a_number_edited_by_hand_fails_the_check(tmp_path, capsys):
  root = _copy_tree(tmp_path)
  assert render_docs.main(['--check', f'--root={root}']) == 0  # the unedited copy passes
  page = root / 'docs' / 'performance.md'
  text = page.read_text()
  start = text.index('<!-- fig:gpu-steps -->')
  region = text[start:text.index('<!-- /fig:gpu-steps -->')]
  first_row = next(line for line in region.splitlines() if line.startswith('| NVIDIA'))
  cells = first_row.split(' | ')
  cells[2] = f'{float(cells[2]) - 0.5:.2f}'  # the 1-token step, "improved" by hand
  page.write_text(text.replace(first_row, ' | '.join(cells), 1))
  capsys.readouterr()
  assert render_docs.main(['--check', f'--root={root}']) == 1
  captured = capsys.readouterr()
  assert 'docs/performance.md' in captured.err and first_row.split(' | ')[2] in captured.out
  # Rendering (what the maintainer runs) puts the recorded figure back.
  assert render_docs.main([f'--root={root}']) == 0
  assert render_docs.main(['--check', f'--root={root}']) == 0


def test_unknown_or_unbalanced_regions_are_errors():
  with pytest.raises(SystemExit, match='unknown figure'):
    render_docs.render_text('<!-- fig:nope -->x<!-- /fig:nope -->', [])
  with pytest.raises(SystemExit, match='unbalanced'):
    render_docs.render_text('<!-- fig:trees -->x', [])


def test_a_region_without_a_record_names_its_command():
  text = render_docs.render_text('a\n<!-- fig:trees -->\nold\n<!-- /fig:trees -->\nb', [])
  assert 'Not measured on a recorded host yet' in text and '--only=bench_tree' in text
  inline = render_docs.render_text('cost <!-- fig:model-table -->x<!-- /fig:model-table -->', [])
  assert inline.startswith('cost <!-- fig:model-table -->| checkpoint')  # inline stays inline


def _host(cpu, cores, l3, bw, **extra):
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  host = {'cpu_model': cpu, 'cores': cores, 'cores_usable': cores, 'l3_bytes': l3,
          'mem_bw_gbs': bw, 'accelerator': None, 'device_count': 1, 'isa': ['avx2'],
          'versions': {'jax': '0.10.2'}, 'platform': 'cpu', 'commit': 'abc', 'dirty': False,
          **extra}
  host['host_id'] = machine.host_id(host)
  return host


def _run_rows(speedup, block_cost):
  return [{'task': 'bible_en_es', 'draft': d, 'draft_path': d, 'temperature': t, 'gamma': g,
           'alpha': 0.6, 'tokens_per_target_call': 2.0, 'c': 0.05, 'block_cost': block_cost,
           'speedup': speedup + 0.1 * g, 'pred_improvement': 1.5,
           'pred_improvement_measured': 1.3, 'identical_to_baseline': True}
          for d in ('draft', 'head') for t in (0.0, 1.0) for g in (3, 5)]


def test_host_dependent_figures_show_one_row_per_host(tmp_path):
  from specjax.runner import console  # pylint: disable=import-outside-toplevel
  fast = _host('Fast CPU', 8, 64 << 20, 80.0)
  slow = _host('Slow CPU', 2, 32 << 20, 20.0)
  for host, speedup in ((fast, 1.5), (slow, 0.9), (slow, 1.0)):  # slow: two runs, newest shown
    rec = results.make_record('run.tiny', {'rows': _run_rows(speedup, 1.4), 'table_text': 'x'},
                              host=host)
    results.append_record(rec, tmp_path)
  records = results.load_records(tmp_path)
  assert len(list(tmp_path.glob('run.tiny/*.jsonl'))) == 2 and len(records) == 3
  table = render_docs.render_run_hosts(records)
  rows = [line for line in table.splitlines() if line.startswith('| ') and 'CPU' in line]
  assert len(rows) == 2 and any('Fast CPU, 8 cores' in r for r in rows)
  # Best over gamma (at 5: speedup + 0.5); the slow host's older run (0.9 + 0.5) is not shown.
  assert '2.00X' in table and '1.50X' in table and '1.40X' not in table
  # The default run's summary: the closest recorded host beside this run.
  mine = results.make_record('run.tiny', {'rows': _run_rows(1.2, 1.5)},
                             host=_host('Slow CPU', 2, 32 << 20, 25.0))
  text = console.beside_recorded(mine, records_dir=tmp_path)
  assert 'recorded on this host' in text and max(map(len, text.splitlines())) <= 100 and '1.70X (gamma 5)' in text
  assert '1.50X (gamma 5)' in text and '1.50 (gamma 3)' in text
  other = results.make_record('run.tiny', {'rows': _run_rows(1.2, 1.5)},
                              host=_host('Other CPU', 8, 64 << 20, 70.0))
  assert 'closest recorded host' in console.beside_recorded(other, records_dir=tmp_path)
  assert '  Fast CPU, 8 cores' in console.beside_recorded(other, records_dir=tmp_path)
  assert 'no published record' in console.beside_recorded(
      dict(mine, benchmark='run.other'), records_dir=tmp_path)


def test_every_region_renders_from_fake_records(tmp_path):
  """Each renderer accepts the record its benchmark writes (shapes as in the smoke tests)."""
  host = _host('Some CPU', 2, 32 << 20, 30.0)
  figures = {
      'bench_block': {'rows': [{'tokens': k, 'step_ms': 2.0 + k * 0.1, 'floor_ms': 1.5}
                               for k in (1, 2, 4, 8)]},
      'bench_transformers': {'pairs': [{'pair': 'tiny', 'gamma': 5, 'rows': [
          {'method': 'specjax speculative', 'tokens_per_s': 300.0, 'vs_tf_greedy': 3.0,
           'vs_tf_assisted': 5.0, 'identical': True}]}]},
      'bench_batch': {'refill_rows': [
          {'temperature': 0.0, 'batch': 8, 'mode': 'AR lockstep', 'tok_s': 100.0, 'row_util': 1.0},
          {'temperature': 0.0, 'batch': 8, 'mode': 'spec g=5 lockstep', 'tok_s': 150.0,
           'row_util': 0.5},
          {'temperature': 0.0, 'batch': 8, 'mode': 'spec g=3 refill', 'tok_s': 200.0,
           'row_util': 0.9},
          {'temperature': 0.0, 'batch': 8, 'mode': 'spec auto refill', 'tok_s': 210.0,
           'row_util': 0.95, 'best_fixed': 'spec g=3 refill'}]},
      'bench_adaptive': {'pairs': [{'pair': 'tiny', 'settings': [
          {'batch': 1, 'temperature': 1.0, 'c': 0.05, 'best_fixed': 'fixed 3',
           'best_rule': 'alpha', 'rule_vs_fixed': 1.02, 'block_ratio_min': 1.05,
           'oracle_vs_fixed': 1.08, 'oracle_share': 0.25, 'oracle_token_rule': 'alpha',
           'rows': [{'variant': 'fixed 3', 'tokens_per_s': 100.0}]}]}]},
      'bench_tree': {'pairs': [{'pair': 'tiny', 'settings': [{'temperature': 1.0, 'rows': [
          {'variant': 'tree (2,1)', 'verified': 3, 'tokens_per_call': 2.2, 'vs_chain': 1.1,
           'se': 0.02, 'vs_ar': 1.3}, {'variant': 'AR', 'verified': 0}]}]}]},
      'tree_step_cost': {'pairs': [{'pair': 'tiny', 'settings': [{'temperature': 1.0, 'rows': [
          {'form': 'chain 8', 'propose': 1.0, 'score': 2.0, 'verify': 0.2, 'step': 3.5,
           'vs_chain': 1.0, 'vs_target': 2.5},
          {'form': 'target 1-token step', 'step': 1.4, 'vs_target': 1.0}]}]}]},
      'pair_eval': {'rows': [{'draft': 'target', 'kind': 'T5', 'params_m': 24.3, 'bleu': 13.0},
                             {'draft': 'draft', 'kind': 'T5', 'params_m': 1.6, 'bleu': 7.0,
                              'alpha_t0': 0.5, 'tpc_t0': 2.0, 'alpha_t1': 0.5, 'tpc_t1': 2.0,
                              'same': True}]},
  }
  args = {'bench_batch': {'refill': True}, 'pair_eval': {'bleu_n': 200, 'alpha_n': 64,
                                                          'gamma': 5}}
  for bench, fig in figures.items():
    rec = results.make_record(bench, dict(fig, args=args.get(bench, {})), host=host)
    results.append_record(rec, tmp_path)
  records = results.load_records(tmp_path) + results.load_records(ROOT / 'docs' / 'results')
  for name, figure in render_docs.FIGURES.items():
    text = figure.render(records)
    if name.startswith('run-'):
      continue  # no run.tiny record here (test_host_dependent_figures_show_one_row_per_host)
    assert 'Not measured' not in text and '|---|' in text, (name, text)
    if name == 'adaptive':  # the oracle beside the best rule, and the best token rule's share
      assert '| 1.080X | 0.25 (alpha) |' in text, text


def test_records_carry_no_machine_paths():
  for path in (ROOT / 'docs' / 'results').glob('*/*.jsonl'):
    for line in path.read_text().splitlines():
      text = json.dumps(json.loads(line))
      assert '/root/' not in text and '/home/' not in text and '/tmp/' not in text, path
