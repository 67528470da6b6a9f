"""The shipped pair's design and evaluation scripts (experiments/pair_shapes.py, pair_eval.py,
head_vocab.py) run in their --smoke modes: tables printed, JSON written, nothing left behind."""

import json
import sys
import tempfile
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / 'experiments'
sys.path.insert(0, str(EXPERIMENTS))


def _run(name, tmp_path, capsys):
  module = __import__(name)
  out = tmp_path / f'{name}.json'
  result = module.main(['--smoke', f'--out={out}'])
  printed = capsys.readouterr().out
  assert '|---|' in printed and out.is_file()
  return result, json.loads(out.read_text()), printed


def test_pair_shapes_smoke(tmp_path, capsys):
  result, saved, printed = _run('pair_shapes', tmp_path, capsys)
  roles = [r['role'] for r in saved['rows']]
  assert roles == ['target', 'draft'] and 'c vs smoke-target' in printed
  target, draft = saved['rows']
  assert target['ms_1'] > 0 and target['x_3'] > 0 and 0 < draft['c_smoke-target']
  assert target['step_mb'] > draft['step_mb'] and 'load' in saved


def test_pair_eval_smoke(tmp_path, capsys):
  before = set(Path(tempfile.gettempdir()).glob('pair_eval_*'))
  result, saved, printed = _run('pair_eval', tmp_path, capsys)
  rows = {r['draft']: r for r in saved['rows']}
  assert set(rows) == {'target', 'draft', 'head'} and rows['head']['kind'] == 'feature head'
  for name in ('draft', 'head'):
    assert rows[name]['same'] and 0 <= rows[name]['alpha_t1'] <= 1
    assert rows[name]['tpc_t0'] >= 1
    assert len(rows[name]['by_pos_t1']) == result['args']['gamma']
  assert __import__('pair_eval').by_position([2, 1, 1]) == [0.5, 0.5]  # m = 0 twice, 1 once, 2 once
  assert set(Path(tempfile.gettempdir()).glob('pair_eval_*')) == before  # cleaned up


def test_head_vocab_smoke(tmp_path, capsys):
  before = set(Path(tempfile.gettempdir()).glob('head_vocab_*'))
  _, saved, printed = _run('head_vocab', tmp_path, capsys)
  rows = {r['vocab']: r for r in saved['rows']}
  assert set(rows) == {100, 4000} and 'CPU cores' in printed and 'load average' in printed
  for r in rows.values():
    assert r['same'] and 0 <= r['alpha_t1'] <= 1 and r['cost'] > 0 and r['tpc_t0'] >= 1
  assert rows[100]['coverage'] < rows[4000]['coverage'] == 1.0
  assert set(Path(tempfile.gettempdir()).glob('head_vocab_*')) == before  # cleaned up
