"""The benchmark scripts (experiments/bench_*.py, gpu_step.py, profile_step.py) run end to end.

Each script's `--smoke` mode (random tiny models, a couple of prompts, one repeat) runs in this
process, so programs compiled by one script are reused by the next. No timing is asserted: only
that every script finishes, prints its table(s), writes its JSON, and that the decoders agree
(the four-way identical-tokens check of bench_transformers; greedy speculative == autoregressive).
"""

import json
import os
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / 'experiments'


@pytest.fixture(scope='module', autouse=True)
def bench_env(tmp_path_factory):
  """Benchmark models go to a temp dir; experiments/ is importable."""
  old = os.environ.get('SPECJAX_BENCH_CACHE')
  os.environ['SPECJAX_BENCH_CACHE'] = str(tmp_path_factory.mktemp('bench_models'))
  sys.path.insert(0, str(EXPERIMENTS))
  yield
  sys.path.remove(str(EXPERIMENTS))
  if old is None:
    os.environ.pop('SPECJAX_BENCH_CACHE', None)
  else:
    os.environ['SPECJAX_BENCH_CACHE'] = old


def _run(module_name, tmp_path, capsys, *extra):
  module = __import__(module_name)
  out = tmp_path / f'{module_name}.json'
  result = module.main(['--smoke', f'--out={out}', *extra])
  printed = capsys.readouterr().out
  assert out.is_file()
  saved = json.loads(out.read_text())
  assert '|---|' in printed, printed
  return result, saved, printed


def test_bench_transformers(tmp_path, capsys):
  result, saved, printed = _run('bench_transformers', tmp_path, capsys)
  (pair,) = saved['pairs']
  methods = [r['method'] for r in pair['rows']]
  assert any(m.startswith('transformers greedy') for m in methods)
  assert any(m.startswith('transformers assisted') for m in methods)
  assert methods[-2:] == ['specjax autoregressive', 'specjax speculative']
  # The four-way check: transformers greedy / assisted, specjax autoregressive / speculative.
  assert pair['all_identical'], pair['mismatches']
  assert all(r['identical'] for r in pair['rows'])
  assert result['all_identical'] and 'identical tokens in all' in printed


def test_bench_bound(tmp_path, capsys):
  _, saved, printed = _run('bench_bound', tmp_path, capsys)
  (cell,) = saved['cells']
  assert cell['identical_greedy'] is True
  assert cell['predicted'] > 0 and cell['measured'] > 0
  (cost,) = saved['costs']
  assert cost['spec_iter_ms'] > 0 and cost['target_block_ms'] > 0
  assert 'measured / predicted' in printed


def test_bench_batch(tmp_path, capsys):
  _, saved, printed = _run('bench_batch', tmp_path, capsys)
  assert [r['batch'] for r in saved['rows']] == [1, 2]
  assert all(r['identical_greedy'] for r in saved['rows'])
  assert 'speedup at 12 new tokens' in printed


def test_bench_compile(tmp_path, capsys):
  _, saved, printed = _run('bench_compile', tmp_path, capsys)
  assert [s['new_traces'] for s in saved['sweep']][1] == 0  # second pass: nothing retraced
  cold, warm = saved['startups']
  assert warm['cache_files'] >= cold['cache_files'] > 0
  assert 'Persistent compilation cache' in printed


def test_gpu_step_cpu_smoke(tmp_path, capsys):
  _, saved, printed = _run('gpu_step', tmp_path, capsys, '--batches=1,2',
                           '--stages=bandwidth,steps,floor,loop,identity,end2end,end2end_t1')
  assert not saved['errors'], saved['errors']
  assert {r['tokens'] for r in saved['steps'] if r['model'] == 'target'} == {1, 4}
  assert saved['floor'] and saved['loop']['rows']
  assert 'Bandwidth floor' in printed
  # The identity stage on the CPU: greedy speculative == autoregressive, block == step argmax.
  for row in saved['identity']:
    assert row['identical'] and row['block_argmax_flips'] == 0, row
  e2e = saved['end2end_rows']
  assert [(r['batch'], r['temperature']) for r in e2e] == [(1, 0.0), (2, 0.0), (1, 1.0), (2, 1.0)]
  assert all(r['identical'] for r in e2e if r['temperature'] == 0)


def test_profile_step(tmp_path, capsys):
  _, saved, printed = _run('profile_step', tmp_path, capsys)
  assert [p['tokens'] for p in saved['profiles']] == [1, 3]
  for prof in saved['profiles']:
    kinds = {r['kind']: r for r in prof['rows']}
    assert prof['step_us'] > 0
    # Every matmul of the step is seen: 9 per decoder layer, 4 per attention pair, 1 head.
    dots = sum(r['count'] for k, r in kinds.items() if 'dot' in k or 'ynn' in k or 'xnn' in k)
    assert dots >= 9, kinds
  assert 'thunks sum to' in printed
