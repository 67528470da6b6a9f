"""The experiment runner end to end on a tiny random pair: table, files, plots, resume after a kill."""

import dataclasses
import json
import os
import statistics
import sys

import numpy as np
import pytest

from specjax import testing
from specjax.data import bible_tokenizer
from specjax.runner import config as config_lib
from specjax.runner import console
from specjax.runner import experiment
from specjax.runner import metrics
from specjax.runner import results as results_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configs import tiny  # pylint: disable=wrong-import-position


@pytest.fixture(scope='module')
def pair_dir(tmp_path_factory):
  """A random target and a noisy copy as draft, with the shipped Bible tokenizer (vocab 4000)."""
  root = tmp_path_factory.mktemp('pair')
  testing.write_random_pair(root, bible_tokenizer())
  return root


def _spec(pair_dir, out_dir, **overrides):
  c = tiny.get_config('smoke')
  c.target = str(pair_dir / 'target')
  c.drafts = (str(pair_dir / 'draft'),)
  c.output_dir = str(out_dir)
  c.temperatures = (0.0,)
  c.gammas = (2, 3)
  c.num_examples = 3
  c.batch_size = 2  # 2 batches, the last padded with a copy: statistics must ignore it
  c.max_new_tokens = 8
  c.compilation_cache = ''
  for k, v in overrides.items():
    c[k] = v
  return config_lib.run_spec(c)


def test_sweep_writes_results_and_resumes_after_a_kill(pair_dir, tmp_path, monkeypatch, capsys):
  spec = _spec(pair_dir, tmp_path / 'out')
  real_run_cell = experiment.run_cell
  calls = []

  def dies_on_second_cell(*args, **kwargs):
    if calls:
      raise KeyboardInterrupt('killed')
    calls.append(args)
    return real_run_cell(*args, **kwargs)

  monkeypatch.setattr(experiment, 'run_cell', dies_on_second_cell)
  with pytest.raises(KeyboardInterrupt):
    experiment.run(spec)
  results = tmp_path / 'out' / 'results.jsonl'
  lines = results.read_text().splitlines()
  assert len(lines) == 1  # the finished cell is on disk, whole
  assert not [f for f in os.listdir(tmp_path / 'out') if f.endswith('.tmp')]

  monkeypatch.setattr(experiment, 'run_cell', real_run_cell)
  rows = experiment.run(spec)
  out = capsys.readouterr().out
  assert 'resuming: 1 of 2 cells' in out
  assert len(results.read_text().splitlines()) == 2 and len(rows) == 2
  assert {r['gamma'] for r in rows} == {2, 3}
  for r in rows:
    assert r['identical_to_baseline']  # greedy: speculative == autoregressive, token for token
    # the same outputs: the per-token speedup is the time ratio
    assert r['baseline_generated_tokens'] == r['generated_tokens'] and r['length_ratio'] == 1.0
    assert r['speedup'] == pytest.approx(r['time_ratio'])
    assert 0.0 <= r['alpha'] <= 1.0 and r['speedup'] > 0 and r['c'] > 0
    assert r['examples'] == 3
    assert r['tokens_per_target_call'] >= 1.0
    assert sum(r['accepted_hist']) > 0
    assert 'bleu' in r['quality_baseline']
  for name in ('table.csv', 'table.md', 'speedup_vs_gamma.png', 'alpha_per_draft.png',
               'trace_bible_en_es_draft.png'):
    assert (tmp_path / 'out' / name).exists(), name
  assert 'tok/call' in out and 'speedup' in out

  # A third run has nothing to do and loads no model.
  monkeypatch.setattr(experiment, 'run_cell', lambda *a, **k: pytest.fail('recomputed a cell'))
  experiment.run(spec)


def test_sampled_cell_speedup_is_per_generated_token(pair_dir, tmp_path, monkeypatch):
  # At T > 0 the two decodes sample outputs of different lengths: the speedup is the time ratio
  # times the length ratio (tokens per second). The tiny random pair never stops early, so the
  # speculative decode is made to report one token fewer in its first row.
  from specjax.decoding import loop  # pylint: disable=import-outside-toplevel
  real = loop.speculative_decode

  def shorter(*args, **kwargs):
    out = real(*args, **kwargs)
    lengths = np.array(out.lengths)
    lengths[0] -= 1
    return dataclasses.replace(out, lengths=lengths)

  monkeypatch.setattr(loop, 'speculative_decode', shorter)
  r = experiment.run(_spec(pair_dir, tmp_path, gammas=(2,), temperatures=(1.0,), plots=False))[0]
  assert r['baseline_generated_tokens'] == 3 * 8 and r['generated_tokens'] == 3 * 8 - 2
  assert r['length_ratio'] == pytest.approx(22 / 24)
  assert r['speedup'] == pytest.approx(r['time_ratio'] * 22 / 24)


def test_call_cost_programs_time_the_prediction_terms(pair_dir):
  """The pieces run (greedy, the pair's draft at gamma 2), and `costs` turns a session's
  timings into the terms: checked on made-up timings against the formulas by hand."""
  import jax  # pylint: disable=import-outside-toplevel
  import specjax  # pylint: disable=import-outside-toplevel
  target = specjax.load_t5(str(pair_dir / 'target'))
  draft = specjax.load_t5(str(pair_dir / 'draft'))
  batches = [np.full((1, 6), 5, np.int32), np.full((1, 6), 7, np.int32)]
  fns, costs = metrics.call_cost_programs(
      target, draft, batches, gamma=2, max_new_tokens=9, rng=jax.random.PRNGKey(0),
      sampling=dict(temperature=0.0), spec_kw={}, steps=4)
  assert set(fns) == {'base_1', 'base_n', 'spec_1', 'spec_n', 'step', 'block', 'propose'}
  for f in fns.values():
    jax.block_until_ready(f())
  sec = dict(step=0.4, block=0.6, propose=0.2, base_1=2 * 0.5, base_n=2 * 4.5, spec_1=2 * 0.8,
             spec_n=2 * 2.0)  # per 2 calls; one step is 0.1 s
  t = costs({k: metrics.Timing(0.0, v, (v,)) for k, v in sec.items()})
  from specjax.decoding import loop  # pylint: disable=import-outside-toplevel

  def iterations(n):  # per call, as the pieces' speculative decodes made them
    key = jax.random.PRNGKey(0)
    outs = [loop.speculative_decode(target, draft, b, gamma=2, max_new_tokens=n, eos_id=-1,
                                    temperature=0.0, rng=jax.random.fold_in(key, i))
            for i, b in enumerate(batches)]
    return sum(int(np.max(o.stats.iterations)) for o in outs) / 2
  it_1, it_n = iterations(1), iterations(9)
  assert it_n > it_1 >= 1
  assert t['step_s'] == pytest.approx(0.1)
  assert t['block_cost'] == pytest.approx(1.5) and t['proposal'] == pytest.approx(0.5)
  assert t['base_per_token'] == pytest.approx((45 - 5) / 8)  # per call: 45 - 5 steps, 8 tokens
  assert t['fixed_base'] == pytest.approx(5 - 5.0)
  assert t['per_iteration'] == pytest.approx((20 - 8) / (it_n - it_1))
  assert t['fixed_spec'] == pytest.approx(8 - it_1 * t['per_iteration'])
  assert t['overhead'] == pytest.approx(t['per_iteration'] - 0.5 - 1.5)


def test_padding_rows_do_not_enter_statistics(pair_dir, tmp_path):
  # 3 prompts in batches of 2 vs the same 3 prompts in one batch of 3: identical alpha and counts.
  a = experiment.run(_spec(pair_dir, tmp_path / 'a', gammas=(2,), plots=False))[0]
  b = experiment.run(_spec(pair_dir, tmp_path / 'b', gammas=(2,), plots=False, batch_size=3))[0]
  for key in ('alpha', 'tokens_per_target_call', 'accepted_hist', 'generated_tokens'):
    assert a[key] == b[key], key


def test_results_lines_are_json(pair_dir, tmp_path):
  rf = results_lib.ResultsFile(str(tmp_path / 'r' / 'results.jsonl'))
  rf.append({'task': 't', 'draft': 'd', 'temperature': 0.0, 'gamma': 1})
  rf.append({'task': 't', 'draft': 'd', 'temperature': 1.0, 'gamma': 1})
  assert [json.loads(l)['temperature'] for l in open(rf.path)] == [0.0, 1.0]
  assert rf.done_keys() == {('t', 'd', 0.0, 1), ('t', 'd', 1.0, 1)}


def test_changed_settings_recompute_and_unchanged_reruns_resume(pair_dir, tmp_path, monkeypatch,
                                                                capsys):
  """A stored cell is reused only under the settings it was computed with; tables show only cells
  of the current settings; going back to old settings resumes the old rows."""
  data = tmp_path / 'verses.jsonl'
  data.write_text('{"source": "In the beginning", "reference": "En el principio"}\n'
                  '{"source": "And God said", "reference": "Y dijo Dios"}\n')
  base = dict(gammas=(2,), plots=False, num_examples=2, max_new_tokens=4, repeats=1)
  calls = []
  real_run_cell = experiment.run_cell

  def counting(*args, **kwargs):
    calls.append(args[1:3])
    return real_run_cell(*args, **kwargs)

  monkeypatch.setattr(experiment, 'run_cell', counting)
  monkeypatch.setattr(experiment.metrics, 'measure_c', lambda *a, **k: 0.1)
  monkeypatch.setattr(experiment.metrics, 'measure_block_cost', lambda *a, **k: 1.5)

  def run(**changes):
    calls.clear()
    rows = experiment.run(_spec(pair_dir, tmp_path / 'out', **{**base, **changes}))
    return rows, len(calls), capsys.readouterr().out

  rows, n, _ = run()
  assert n == 1 and rows[0]['examples'] == 2
  rows, n, out = run()
  assert n == 0 and 'resuming: 1 of 1 cells' in out  # unchanged: resumes
  for change, field in ((dict(num_examples=3), 'num_examples'),
                        (dict(max_new_tokens=6), 'max_new_tokens'),
                        (dict(mesh_shape=(1, 1)), 'mesh_shape'),
                        (dict(local_data=str(data)), 'local_data'),
                        (dict(block_cost=True), 'block_cost')):
    rows, n, out = run(**change)
    assert n == 1, change  # recomputed, not resumed
    assert f'settings changed since stored results ({field}' in out or f', {field}' in out, out
    assert len(rows) == 1 and rows[0]['settings'][field] == (
        results_lib.path_identity(str(data), hash_contents=True) if field == 'local_data'
        else list(change[field]) if field == 'mesh_shape' else change[field])
  assert rows[0]['examples'] == 2 and rows[0]['max_new_tokens'] == 4
  table = (tmp_path / 'out' / 'table.csv').read_text()
  assert len([l for l in table.splitlines() if l.strip()]) == 2  # header + the current cell only
  # The data file edited in place (same path): its content hash changes, so it recomputes.
  data.write_text('{"source": "Let there be light", "reference": "Sea la luz"}\n'
                  '{"source": "And God said", "reference": "Y dijo Dios"}\n')
  _, n, _ = run(local_data=str(data))
  assert n == 1
  _, n, out = run(num_examples=3)  # settings seen before: their row is resumed
  assert n == 0 and 'resuming: 1 of 1 cells' in out
  assert len((tmp_path / 'out' / 'results.jsonl').read_text().splitlines()) == 7


def test_a_feature_head_is_a_draft_of_the_sweep(pair_dir, tmp_path, monkeypatch):
  """A head directory in config.drafts: built for the target, labelled by its directory name,
  its c measured from its own step (not 0), greedy output token-identical. With block_cost the
  target's block cost is measured once per gamma (not per draft) and predicts beside Thm 3.8."""
  import jax  # pylint: disable=import-outside-toplevel
  import specjax  # pylint: disable=import-outside-toplevel
  from specjax.models import head as head_lib  # pylint: disable=import-outside-toplevel
  target = specjax.load_t5(str(pair_dir / 'target'))
  hc = head_lib.HeadConfig.for_target(target.config, d_model=16, num_heads=2, d_kv=8, d_ff=32)
  head_lib.save_head(head_lib.init_head_params(hc, jax.random.PRNGKey(0)), hc,
                     tmp_path / 'head')
  measured, sessions = [], []
  monkeypatch.setattr(metrics, 'measure_block_cost',
                      lambda target, batch, cache_len, g: measured.append(g) or 1.6)
  terms = dict(fixed_base=3.0, base_per_token=0.9, fixed_spec=4.0, per_iteration=2.0,
               block_cost=1.5, proposal=0.2, overhead=0.3, step_s=1e-3)

  def programs(target, draft, batches, *, gamma, max_new_tokens, rng, sampling, spec_kw):
    sessions.append((gamma, max_new_tokens, sampling['temperature'], spec_kw['verifier']))

    def costs(timings):  # the pieces were timed in the cell's session
      assert set(timings) == {'piece'} and timings['piece'].times_s
      return terms
    return {'piece': lambda: np.zeros(())}, costs
  monkeypatch.setattr(metrics, 'call_cost_programs', programs)
  spec = _spec(pair_dir, tmp_path / 'out', gammas=(2,), block_cost=True,
               drafts=(str(pair_dir / 'draft'), str(tmp_path / 'head')))
  rows = experiment.run(spec)
  assert sorted(r['draft'] for r in rows) == ['draft', 'head']
  head_row = next(r for r in rows if r['draft'] == 'head')
  assert head_row['identical_to_baseline'] and head_row['c'] > 0
  assert measured == [2]
  for r in rows:
    assert r['block_cost'] == 1.6 and r['pred_improvement_measured'] == pytest.approx(
        metrics.predicted_speedup(r['tokens_per_target_call'], r['draft_passes_per_call'],
                                  r['c'], 1.6))
    # The per-call prediction from the terms timed in the cell's own session.
    assert r['iteration_overhead'] == 0.3 and r['call_costs'] == terms
    assert r['pred_improvement_call'] == pytest.approx(metrics.predicted_sequence_speedup(
        r['generated_tokens'] / r['examples'], r['tokens_per_target_call'],
        r['draft_passes_per_call'], 0.2 / 2, 1.5, fixed_base=3.0, fixed_spec=4.0,
        base_per_token=0.9, overhead=0.3))
  # One session per cell, at the cell's gamma, temperature and verifier.
  assert sessions == [(2, spec.max_new_tokens, 0.0, 'token')] * 2
  table = console.results_table(rows, 'sweep', width=400)
  assert 'pred (block)' in table and 'pred (call)' in table
  assert '| block cost |' in (tmp_path / 'out' / 'table.md').read_text()
  broken = tmp_path / 'broken'
  broken.mkdir()
  (broken / 'head_config.json').write_text('{"vocab_size": 4000}')
  with pytest.raises(config_lib.ConfigError, match=r'drafts\[1\]'):
    _spec(pair_dir, tmp_path / 'out2', drafts=(str(pair_dir / 'draft'), str(broken)))


def test_interleaved_timing_warms_up_with_the_cheaper_call_and_times_the_real_one():
  calls = []
  fns = {'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')}
  timings = metrics.time_interleaved(fns, repeats=2, warmups={'a': lambda: calls.append('wa')})
  assert calls == ['wa', 'b', 'a', 'b', 'a', 'b']  # a's warm-up replaced, b's is b itself
  assert all(len(t.times_s) == 2 for t in timings.values())


def test_paired_ratio_cancels_a_drift_that_a_ratio_of_medians_does_not():
  # A 1.5x speedup; the host turns twice as fast between the third baseline repeat and its
  # partner, so every pair but that one reads 1.5x, while the baseline's median falls in the slow
  # phase and the speculative one's in the fast one.
  base = [6.0, 6.0, 6.0, 3.0, 3.0]
  spec = [4.0, 4.0, 2.0, 2.0, 2.0]
  timing = lambda ts: metrics.Timing(0.0, statistics.median(ts), tuple(ts))  # noqa: E731
  assert metrics.paired_ratio(timing(base), timing(spec)) == pytest.approx(1.5)
  # Control: the ratio of the medians reads the same repeats as a 3x speedup.
  assert timing(base).median_s / timing(spec).median_s == pytest.approx(3.0)
  assert metrics.paired_ratio(timing(base), timing(base)) == pytest.approx(1.0)
