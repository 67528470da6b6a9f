"""Host records and published records: what a benchmark or the runner stamps on its figures
(specjax/runner/machine.py, results.py), and how a run becomes a record (experiments/bench_common.py
--record, scripts/record.py)."""

import json
import sys
from pathlib import Path

import pytest

from specjax.runner import machine
from specjax.runner import results

ROOT = Path(__file__).resolve().parents[1]


def test_host_record_describes_the_machine():
  rec = machine.host_record()
  for key in ('cpu_model', 'cores', 'cores_usable', 'l3_bytes', 'isa', 'mem_bytes', 'platform',
              'device_kind', 'versions', 'xla_flags', 'commit', 'dirty', 'load_average',
              'created', 'host_id'):
    assert key in rec, key
  assert rec['cores'] >= 1 and rec['versions']['jax'] and rec['created'].endswith('Z')
  assert rec['mem_bw_gbs'] > 0.1 and rec['probe_bytes'] >= 96 << 20
  # A 61.7 MB step at the measured bandwidth: the floor a step cannot beat.
  floor = machine.bandwidth_floor_ms(61.7e6, rec)
  assert floor == pytest.approx(61.7e6 / (rec['mem_bw_gbs'] * 1e9) * 1e3)
  assert machine.bandwidth_floor_ms(1e6, dict(rec, mem_bw_gbs=None)) is None
  text = json.dumps(rec)
  assert str(ROOT) not in text  # no path of the machine
  assert machine.describe_host(rec).startswith(rec['cpu_model'])


def test_host_id_names_the_hardware_not_the_run():
  a = {'cpu_model': 'AMD EPYC 9R14 96-Core Processor', 'cores': 2, 'cores_usable': 2,
       'l3_bytes': 32 << 20, 'accelerator': None, 'device_count': 1, 'load_average': [0, 0, 0]}
  assert machine.host_id(a) == machine.host_id(dict(a, load_average=[3, 3, 3], created='x'))
  assert machine.host_id(a) != machine.host_id(dict(a, l3_bytes=64 << 20))
  assert machine.host_id(a).startswith('amd-epyc-9r14-96-2c-')
  gpu = dict(a, accelerator='NVIDIA H200', cores=16, cores_usable=16)
  assert machine.host_id(gpu).startswith('nvidia-h200-16c-')


def test_scrub_takes_the_machine_paths_out():
  assert results.scrub({'out': '--out=/root/x/y.json', 'model': str(ROOT / 'specjax' / 'x'),
                        'url': 'https://host/a/b', 'n': 3}) == {
                            'out': '--out=y.json', 'model': 'specjax/x', 'url': 'https://host/a/b',
                            'n': 3}


def _host(name, l3, bw):
  h = {'cpu_model': name, 'cores': 2, 'cores_usable': 2, 'l3_bytes': l3, 'mem_bw_gbs': bw,
       'accelerator': None, 'device_count': 1, 'commit': 'c0ffee', 'dirty': False}
  return dict(h, host_id=machine.host_id(h))


def test_records_are_kept_per_benchmark_and_host(tmp_path):
  a, b = _host('A', 32 << 20, 40.0), _host('B', 32 << 20, 20.0)
  for host, value in ((a, 1), (b, 2), (a, 3)):
    results.append_record(results.make_record('bench_x', {'v': value, 'load': {'l': 1}},
                                              host=host), tmp_path)
  assert sorted(p.name for p in (tmp_path / 'bench_x').iterdir()) == sorted(
      [f"{a['host_id']}.jsonl", f"{b['host_id']}.jsonl"])
  newest = results.latest_per_host(results.load_records(tmp_path), 'bench_x')
  assert {h: r['figures']['v'] for h, r in newest.items()} == {a['host_id']: 3, b['host_id']: 2}
  rec = newest[a['host_id']]
  assert rec['load'] == {'l': 1} and rec['commit'] == 'c0ffee' and rec['schema'] == 1
  near = results.closest_host(_host('A', 32 << 20, 25.0), newest.values())
  assert near['host_id'] == a['host_id']  # same CPU first, bandwidth only breaks ties
  near = results.closest_host(_host('C', 32 << 20, 22.0), newest.values())
  assert near['host_id'] == b['host_id']


def test_a_benchmark_run_publishes_its_record(tmp_path, monkeypatch):
  sys.path.insert(0, str(ROOT / 'experiments'))
  import argparse  # pylint: disable=import-outside-toplevel
  import bench_common as bc  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(bc, '_RUN', {})
  p = argparse.ArgumentParser()
  args = bc.parse_bench_args(p, ['--smoke', f'--record={tmp_path}', f'--out={tmp_path}/x.json'])
  assert args.record == str(tmp_path)
  gate = machine.Gate(allow_loaded=True)
  result = {'args': vars(args), 'rows': [{'tokens_per_s': 10.0}]}
  bc.finish_load(gate, result, args.out, log=lambda *_: None)
  (path,) = (tmp_path / 'test_records').glob('*.jsonl')
  (rec,) = [json.loads(line) for line in path.read_text().splitlines()]
  assert rec['figures'] == {'rows': [{'tokens_per_s': 10.0}]} and rec['smoke']
  assert rec['command'].startswith('python tests/test_records.py --smoke --record=')
  assert rec['load']['cores'] >= 1 and rec['host']['mem_bw_gbs'] is None  # smoke: no probe
  saved = json.loads(Path(args.out).read_text())
  assert saved['host']['host_id'] == rec['host_id'] and saved['command'] == rec['command']
  with pytest.raises(SystemExit):  # a smoke run never writes into docs/results
    bc.parse_bench_args(argparse.ArgumentParser(), ['--smoke', '--record'])


def test_record_script_publishes_runner_output_and_old_jsons(tmp_path):
  sys.path.insert(0, str(ROOT / 'scripts'))
  import record  # pylint: disable=import-outside-toplevel
  old = {'machine': {'cpu_count': 16, 'cpu_model': 'Xeon', 'device': 'NVIDIA H200',
                     'jax_backend': 'gpu', 'jax': '0.11.2', 'time': '2026-11-30T01:27:16',
                     'devices': ['cuda:0']}, 'args': {'out': '/root/out/g.json'}, 'steps': [1]}
  (tmp_path / 'g.json').write_text(json.dumps(old))
  assert record.main([str(tmp_path / 'g.json'), '--benchmark=gpu_step', '--command=python x.py',
                      f'--dir={tmp_path / "rec"}']) == 0
  (rec,) = results.load_records(tmp_path / 'rec', 'gpu_step')
  assert rec['host']['accelerator'] == 'NVIDIA H200' and rec['host_id'].startswith('nvidia-h200')
  assert rec['args'] == {'out': 'g.json'} and rec['figures'] == {'steps': [1]}
  # A runner's output directory: its record.json, this host's bandwidth probed on publishing.
  run = results.make_record('run.tiny', {'rows': []}, host=machine.host_record(
      probe_bandwidth=False))
  (tmp_path / 'out').mkdir()
  (tmp_path / 'out' / 'record.json').write_text(json.dumps(run))
  assert record.main([str(tmp_path / 'out'), f'--dir={tmp_path / "rec"}']) == 0
  (rec,) = results.load_records(tmp_path / 'rec', 'run.tiny')
  assert rec['host']['mem_bw_gbs'] > 0 and rec['host']['mem_bw_probed_at_publish']
