"""The benchmark scripts (experiments/bench_*.py, gpu_step.py, profile_step.py) run end to end.

Each script's `--smoke` mode (random tiny models, a couple of prompts, one repeat) runs in this
process, so programs compiled by one script are reused by the next. No timing is asserted: only
that every script finishes, prints its table(s), writes its JSON, and that the decoders agree
(the four-way identical-tokens check of bench_transformers; greedy speculative == autoregressive).

The load gate (specjax/runner/machine.py) is tested with fake load values: a loaded machine is
refused before any work by every script, a quiet one is not, and `--allow-loaded` (implied by
`--smoke`) keeps the figures, marked LOADED in the printed line and the JSON.
"""

import json
import os
import sys
from pathlib import Path

import jax
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


def test_bench_block(tmp_path, capsys):
  """Every lever's step times and block costs; the kernel-p32 lever (a second build of the
  kernel with the former AVX2 tile, traced through cpu_kernels.variant) where it applies."""
  from specjax.models import cpu_kernels
  _, saved, printed = _run('bench_block', tmp_path, capsys, '--levers=xla,kernel,kernel-p32')
  rows = saved['models'][0]['batches'][0]['rows']
  levers = [r['lever'] for r in rows]
  p32 = cpu_kernels.available() and cpu_kernels.panel_width() != 32
  assert levers == ['xla', 'kernel'] + (['kernel-p32'] if p32 else []), (levers, printed)
  for r in rows:
    assert r['lossless'] and r['block_cost']['1'] == 1.0 and r['ms']['2'] > 0, r
  assert [row['tokens'] for row in saved['rows']] == [1, 2]


def test_bench_variant(tmp_path, capsys):
  """Whole decodes with the built kernels and a variant build (the former AVX2 tile), side by
  side: the same tokens at T = 0, both builds timed."""
  from specjax.models import cpu_kernels
  if not cpu_kernels.available():
    pytest.skip(f'CPU kernel unavailable: {cpu_kernels.status()}')
  result, saved, printed = _run('bench_variant', tmp_path, capsys)
  assert [r['build'] for r in saved['rows']] == ['built', 'variant']
  assert saved['same_tokens'] is True and result['same_tokens'] is True
  for r in saved['rows']:
    assert r['ar_ms'] > 0 and r['spec_ms'] > 0 and r['speedup'] > 0, r
  assert saved['rows'][0]['ar_vs_built'] == 1.0 and '-DSPECJAX_PANEL=32' in printed


def test_bench_variant_small_ops(tmp_path, capsys):
  """The same kernels with XLA's gather and argmax around them (the baseline of the row-lookup
  and argmax kernels), speculating with the small T5 draft: the same tokens at T = 0, and the
  variant's programs do keep XLA's argmax (its HLO has no argmax kernel call)."""
  from specjax.models import cpu_kernels
  if not cpu_kernels.available():
    pytest.skip(f'CPU kernel unavailable: {cpu_kernels.status()}')
  _, saved, printed = _run('bench_variant', tmp_path, capsys, '--variant=xla_small_ops',
                           '--draft=draft')
  assert saved['same_tokens'] is True and saved['rows'][1]['flags'] == 'xla_small_ops'
  assert 'variant: xla_small_ops' in printed and '(draft)' in printed
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax import ops  # pylint: disable=import-outside-toplevel
  x = jnp.ones((2, 7))
  assert cpu_kernels.ARGMAX in jax.jit(ops.argmax).lower(x).as_text()
  with cpu_kernels.xla_small_ops():
    assert not cpu_kernels.small_ops('argmax')
    assert cpu_kernels.ARGMAX not in jax.jit(lambda y: ops.argmax(y)).lower(x).as_text()
  assert cpu_kernels.small_ops('argmax')


def test_draft_cost(tmp_path, capsys):
  """A draft's whole proposal per block against c, for a sequential and a parallel smoke head,
  and (--xla_small_ops) each block again with XLA's gather and argmax."""
  from specjax.models import cpu_kernels
  extra = ['--xla_small_ops'] if cpu_kernels.available() else []
  _, saved, printed = _run('draft_cost', tmp_path, capsys, *extra)
  assert [r['draft'] for r in saved['rows']] == ['head', 'head:parallel=1']
  for r in saved['rows']:
    assert r['c'] > 0 and r['block'] > 0 and r['gamma_c'] == pytest.approx(r['gamma'] * r['c'])
    assert (r.get('block_xla', 0) > 0) == bool(extra), r
  assert ("XLA's gather/argmax" in printed) == bool(extra)


def test_bench_products(tmp_path, capsys):
  """Products alone with the built kernels and a variant build (the former AVX2 tile): bitwise
  the same products (checked by the script), both builds timed, costs relative to M = 1."""
  from specjax.models import cpu_kernels
  if not cpu_kernels.available():
    pytest.skip(f'CPU kernel unavailable: {cpu_kernels.status()}')
  _, saved, printed = _run('bench_products', tmp_path, capsys)
  assert [(r['shape'], r['rows']) for r in saved['rows']] == [('64x80', 1), ('64x80', 7)]
  for r in saved['rows']:
    assert r['built_ms'] > 0 and r['variant_ms'] > 0 and r['built_vs_variant'] > 0, r
  assert saved['rows'][0]['built_vs_m1'] == 1.0 and '-DSPECJAX_PANEL=32' in printed


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
  # Each pair's table and the run carry their load (start and end, cores, others' CPU).
  for rec in (pair['load'], saved['load']):
    assert rec['cores'] >= 1 and len(rec['load_average_start']) == len(rec['load_average_end']) == 3
    assert printed.count('load: load average (1/5/15 min)') >= 3  # start, the pair, the end


def test_bench_bound(tmp_path, capsys):
  _, saved, printed = _run('bench_bound', tmp_path, capsys)
  (cell,) = saved['cells']
  assert cell['identical_greedy'] is True
  assert cell['predicted'] > 0 and cell['measured'] > 0
  (cost,) = saved['costs']
  assert cost['spec_iter_ms'] > 0 and cost['target_block_ms'] > 0
  assert 'measured / predicted' in printed


def test_bench_batch(tmp_path, capsys, monkeypatch):
  # Run on a (faked) loaded machine: --smoke implies --allow-loaded, so the run finishes and is
  # marked loaded in its line and JSON (one run serves both checks: a smoke run costs ~40 s).
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(machine, 'snapshot', _fake_snapshots(load1=4.0, others=1.0))
  _, saved, printed = _run('bench_batch', tmp_path, capsys)
  assert [r['batch'] for r in saved['rows']] == [1, 2]
  assert all(r['identical_greedy'] for r in saved['rows'])
  assert 'speedup at 12 new tokens' in printed
  assert saved['load']['loaded'] and saved['load']['allowed'] and not saved['load']['refused']
  assert 'LOADED, kept by --allow-loaded' in printed


def _summary_is_last(printed, start):
  lines = printed.strip().splitlines()
  assert lines[-1].startswith(start), lines[-3:]
  assert sum(line.startswith('summary:') for line in lines) == 1
  return lines[-1]


def test_bench_adaptive(tmp_path, capsys):
  _, saved, printed = _run('bench_adaptive', tmp_path, capsys)
  (pair,) = saved['pairs']
  assert [s['temperature'] for s in pair['settings']] == [0.0, 1.0]
  for s in pair['settings']:
    rows = {r['variant']: r for r in s['rows']}
    oracle, gamma = rows['oracle'], s['oracle_gamma']
    assert oracle['bound'] and list(rows)[-2:] == ['oracle', 'AR'] and gamma == 4
    # A fixed gamma is one of the oracle's choices: never below the best fixed one.
    best = max(r['tokens_per_s'] for r in s['rows']
               if r['variant'].startswith('fixed') and r['verifier'] == 'token')
    assert s['oracle_vs_fixed'] >= 1 and oracle['tokens_per_s'] >= best * (1 - 1e-12)
    assert 1 <= s['oracle_tokens_per_call'] <= gamma + 1 and s['oracle_iterations'] > 0
    assert 'oracle_share' in s and 'oracle_share' in rows['alpha']
    # The offline pass reads the logged run right: its alpha (beta over positions whose prefix
    # was accepted) is the loop's own for the same gamma and seeds; at T = 0 its leading ones are
    # the accepted counts.
    assert s['logged_alpha'] == pytest.approx(rows[f'fixed {gamma}']['alpha'], abs=0.01)
    if s['temperature'] == 0:
      assert s['logged_agree'] == 1.0
  line = _summary_is_last(printed, 'summary: adaptive/fixed tok/s T=1 ')
  assert '(goal 1.05); oracle share ' in line and '(goal 0.5; ' in line
  assert "the oracle's own gain: " in line
  assert saved['summary'] == line and '| oracle | 4 | token |' in printed


@pytest.mark.parametrize('draft', ['model', 'head'])
def test_bench_tree(tmp_path, capsys, draft):
  _, saved, printed = _run('bench_tree', tmp_path, capsys, f'--draft={draft}')
  line = _summary_is_last(printed, 'summary: dynamic/chain tokens per call T=1 budget 4 ')
  assert '(goal 1.15; smoke: dynamic:4,2,2 vs chain 4)' in line
  assert '; static-tree/chain tokens per call T=1 budget 4 ' in line
  assert '(goal 1.15; smoke: tree (2,1) vs chain 4)' in line
  assert 'dynamic/best chain tok/s ' in line and '(goal 1.10; smoke: ' in line
  assert saved['summary'] == line and saved['pairs'][0]['draft'] == draft
  rows = {r['variant']: r for s in saved['pairs'][0]['settings'] for r in s['rows']}
  assert rows['dynamic:4,2,2']['verified'] == 4 and rows['dynamic:4,2,2']['vs_chain'] > 0
  # Greedy: every variant emits the autoregressive tokens (token-identical decoding).
  greedy = next(s for s in saved['pairs'][0]['settings'] if s['temperature'] == 0)
  assert all(r['identical'] for r in greedy['rows'] if r['variant'] != 'AR')
  assert saved['plot'] and os.path.exists(saved['plot'])


def test_tree_step_cost(tmp_path, capsys):
  _, saved, printed = _run('tree_step_cost', tmp_path, capsys, '--temps=1')
  rows = saved['pairs'][0]['settings'][0]['rows']
  assert [r['form'] for r in rows] == ['chain 4', 'tree (2,1)', 'dynamic:4,2,2',
                                       'target 1-token step']
  assert rows[0]['vs_chain'] == 1.0 and all(r['step'] > 0 for r in rows)
  assert '| step / chain step |' in printed


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


def test_gpu_step_pair_stage(tmp_path, capsys):
  """The shipped pair end to end through the runner (configs/tiny.py:smoke), no random model."""
  _, saved, printed = _run('gpu_step', tmp_path, capsys, '--stages=pair')
  assert not saved['errors'], saved['errors']
  rows = saved['pair']['rows']
  assert saved['pair']['config'].endswith('tiny.py:smoke') and 'target_params' not in saved
  assert sorted((r['temperature'], r['gamma']) for r in rows) == [(0.0, 3), (1.0, 3)]
  for r in rows:
    assert r['speedup'] > 0 and 0 < r['alpha'] <= 1 and r['c'] > 0, r
  assert [r['identical_to_baseline'] for r in rows if r['temperature'] == 0] == [True]
  assert 'The shipped pair end to end' in printed and 'pair: best measured speedup' in printed


def test_profile_step(tmp_path, capsys):
  _, saved, printed = _run('profile_step', tmp_path, capsys)
  assert [p['tokens'] for p in saved['profiles']] == [1, 3]
  for prof in saved['profiles']:
    kinds = {r['kind']: r for r in prof['rows']}
    assert prof['step_us'] > 0
    # Every matmul of the step is seen: XLA's dots, or the packed CPU kernels' calls (6 per
    # decoder layer, 2 attention calls, 1 head: specjax.models.cpu_kernels).
    dots = sum(r['count'] for k, r in kinds.items()
               if 'dot' in k or 'ynn' in k or 'xnn' in k or k == 'ffi_call')
    assert dots >= 9, kinds
  assert 'thunks sum to' in printed


# ----------------------------------------------------------------------------- the load gate

SCRIPTS = ['bench_transformers', 'bench_bound', 'bench_batch', 'bench_compile', 'profile_step',
           'gpu_step', 'bench_load', 'bench_variant', 'bench_products']


def _fake_snapshots(load1=0.1, others=0.0, own=1.0, cores=2):
  """A snapshot source: every call is 10 s later; others / own = cores busy meanwhile."""
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  calls = []

  def take():
    t = 10.0 * len(calls)
    calls.append(t)
    return machine.Snapshot(wall_s=t, loadavg=(load1, load1, load1), cores=cores,
                            busy_s=100 + (others + own) * t, steal_s=0.0, own_s=5 + own * t)
  return take


def test_gate_allows_a_quiet_machine():
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  take = _fake_snapshots(load1=0.9, others=0.15)  # just under 0.5 x 2 and 0.1 x 2
  gate = machine.Gate(take=take)
  assert not gate.check_start()['loaded']
  rec = gate.record()
  assert rec['others_cores'] == pytest.approx(0.15) and rec['own_cores'] == pytest.approx(1.0)
  assert not rec['loaded'] and not rec['refused'] and rec['cores'] == 2
  assert '(quiet)' in machine.describe(rec) and 'LOADED' not in machine.describe(rec)


def test_gate_judges_a_later_table_by_other_processes_only():
  """A table measured mid-run: the 1-min load average holds the run's own earlier work; only
  other processes' CPU time can mark it loaded (control: the run's start still checks the load)."""
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  gate = machine.Gate(take=_fake_snapshots(load1=1.8, others=0.05), allow_loaded=True)
  assert gate.check_start()['loaded']  # the control: a loaded start is loaded
  assert gate.record()['loaded']
  assert not gate.record(gate.mark())['loaded']
  busy = machine.Gate(take=_fake_snapshots(load1=1.8, others=0.5), allow_loaded=True)
  assert busy.record(busy.mark())['loaded']


def test_gate_refuses_a_loaded_start(capsys):
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  gate = machine.Gate(take=_fake_snapshots(load1=1.1))
  with pytest.raises(machine.LoadedMachine) as e:
    gate.check_start()
  assert e.value.code == 3 and '1-min load average 1.10' in str(e.value)
  # SystemExit(3) prints nothing itself: the reason must reach stderr before the exit.
  assert '1-min load average 1.10' in capsys.readouterr().err


def test_gate_waits_for_a_quiet_machine():
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  loads = iter([3.0, 2.0, 0.5, 0.5])
  take = lambda: machine.Snapshot(wall_s=0.0, loadavg=(next(loads),) * 3, cores=2,  # noqa: E731
                                  busy_s=None, steal_s=None, own_s=0.0)
  gate = machine.Gate(take=take)
  waits = []
  gate.wait_quiet(60, poll_s=0, log=waits.append)
  assert len(waits) == 2 and not gate.check_start()['loaded']
  gate = machine.Gate(take=lambda: machine.Snapshot(0.0, (3.0,) * 3, 2, None, None, 0.0))
  gate.wait_quiet(0, log=waits.append)  # no time to wait: still loaded, refused
  with pytest.raises(machine.LoadedMachine):
    gate.check_start()


def test_gate_refuses_others_during_the_run():
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  gate = machine.Gate(take=_fake_snapshots(load1=0.2, others=0.25))
  gate.check_start()
  rec = gate.record()
  assert rec['loaded'] and rec['refused'] and 'other processes used 0.25 cores' in rec['reasons'][0]
  with pytest.raises(machine.LoadedMachine):
    machine.finish(rec, log=lambda *_: None)


def test_gate_marks_allowed_loaded_figures(tmp_path, capsys):
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  import bench_common as bc  # pylint: disable=import-outside-toplevel
  gate = machine.Gate(take=_fake_snapshots(load1=3.0, others=1.5), allow_loaded=True)
  assert gate.check_start()['loaded']  # kept, not refused
  result = {'rows': []}
  rec = bc.finish_load(gate, result, tmp_path / 'r.json')
  saved = json.loads((tmp_path / 'r.json').read_text())['load']
  assert rec['loaded'] and rec['allowed'] and not rec['refused']
  assert saved['loaded'] and saved['load_average_start'] == [3.0, 3.0, 3.0] and len(saved['reasons']) == 2
  assert 'LOADED, kept by --allow-loaded' in capsys.readouterr().out


def test_finish_load_refuses_but_keeps_the_json(tmp_path):
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  import bench_common as bc  # pylint: disable=import-outside-toplevel
  gate = machine.Gate(take=_fake_snapshots(load1=0.2, others=0.5))
  with pytest.raises(machine.LoadedMachine):
    bc.finish_load(gate, {}, tmp_path / 'r.json', log=lambda *_: None)
  saved = json.loads((tmp_path / 'r.json').read_text())['load']
  assert saved['refused'] and saved['others_cores'] == pytest.approx(0.5)


@pytest.mark.parametrize('script', SCRIPTS)
def test_every_script_refuses_a_loaded_machine(script, monkeypatch, tmp_path):
  """Refused before any work (no model is built: this takes milliseconds); --allow-loaded passes
  the start check."""
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  module = __import__(script)
  monkeypatch.setattr(machine, 'snapshot', _fake_snapshots(load1=4.0))
  with pytest.raises(machine.LoadedMachine):
    module.main([f'--out={tmp_path / "x.json"}'])
  assert not (tmp_path / 'x.json').exists()
  args = module.parse_args(['--allow-loaded'])
  assert args.allow_loaded
  gate = __import__('bench_common').load_gate(args, log=lambda *_: None)
  assert gate.check_start()['loaded'] and gate.allow_loaded


def test_bench_load_smoke(tmp_path, capsys):
  _, saved, printed = _run('bench_load', tmp_path, capsys)
  levels = saved['levels']
  assert [lv['extra_load'] for lv in levels] == [0.0, 1.0]
  assert all(lv['identical'] for lv in levels)
  # One busy loop ran during the second level's timings: the others' CPU shows it.
  assert levels[1]['others_cores'] > 0.2, levels[1]['load']
  assert 'Ratio vs machine load' in printed and saved['load'] == levels[0]['load']
