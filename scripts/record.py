"""Publish a run's output as a record under docs/results/ (the data the docs are rendered from).

  python scripts/record.py results/tiny                       # a runner output dir (record.json)
  python scripts/record.py results/bench/pair_eval.json       # a benchmark's --out JSON
  python scripts/record.py OUT.json --benchmark=gpu_step --command='python experiments/...'

Appends one JSON line to docs/results/<benchmark>/<host id>.jsonl (specjax/runner/results.py
describes the record), so a run on another host adds its own file. Benchmark scripts that take
`--record` publish themselves; this script is for the runner (`python -m specjax.run` writes
record.json beside its tables) and for scripts without the flag (experiments/pair_eval.py).

The host: the record's own (`host`, measured by the run); a JSON written before host records
existed is described from its `machine` block; a JSON with neither is stamped with this host,
measured now. A record of this host whose memory bandwidth was not probed (the runner's) gets it
probed here, before it is published.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))


def legacy_host(info: dict) -> dict:
  """A host record from the `machine` block benchmark JSONs carried before host records (what
  it lacks stays None: caches, ISA flags, commit)."""
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  accelerator = info.get('device') if info.get('jax_backend') not in (None, 'cpu') else None
  host = {
      'cpu_model': info.get('cpu_model'), 'cores': info.get('cpu_count'),
      'cores_usable': info.get('cpu_count'), 'l2_bytes': None, 'l3_bytes': None, 'isa': [],
      'mem_bytes': None, 'platform': info.get('jax_backend'), 'device_kind': info.get('device'),
      'device_count': len(info.get('devices') or [None]), 'accelerator': accelerator,
      'versions': {k: info[k] for k in ('python', 'jax', 'jaxlib', 'flax', 'numpy',
                                        'transformers', 'torch') if k in info},
      'xla_flags': None, 'os': info.get('platform'), 'commit': None, 'dirty': None,
      'load_average': info.get('load_average_start'), 'created': info.get('time'),
      'probe_bytes': None, 'mem_bw_gbs': None,
  }
  host['host_id'] = machine.host_id(host)
  return host


def to_record(result: dict, benchmark: str, command: str = '') -> dict:
  """A published record of `result` (a record already, a runner's record.json or a benchmark's
  JSON)."""
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  from specjax.runner import results  # pylint: disable=import-outside-toplevel
  if 'schema' in result and 'figures' in result:  # already a record
    record = dict(result)
  else:
    host = result.get('host')
    if host is None and 'machine' in result:
      host = legacy_host(result['machine'])
    elif host is None:
      host = machine.host_record()
      host['measured_at_publish'] = True
    record = results.make_record(benchmark, result, command=command, host=host,
                                 smoke=bool(result.get('args', {}).get('smoke')))
  if command:
    record['command'] = command
  host = record['host']
  if host.get('mem_bw_gbs') is None and host.get('cpu_model') is not None:
    here = machine.host_record(probe_bandwidth=False)
    if here['host_id'] == record['host_id']:
      host['probe_bytes'] = here['probe_bytes']
      host['mem_bw_gbs'] = machine.bandwidth_probe(here['probe_bytes'])
      host['mem_bw_probed_at_publish'] = True
  return record


def main(argv=None) -> int:
  from specjax.runner import results  # pylint: disable=import-outside-toplevel
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('path', help="a runner output directory (its record.json) or a run's JSON")
  p.add_argument('--benchmark', default='',
                 help="the record's name (default: the record's own, else the JSON file's stem)")
  p.add_argument('--command', default='', help='the command that produced it (default: recorded)')
  p.add_argument('--dir', default=str(results.RECORDS_DIR), help='records directory')
  a = p.parse_args(argv)
  path = Path(a.path)
  if path.is_dir():
    path = path / 'record.json'
  if not path.is_file():
    print(f'record.py: no such file: {path}', file=sys.stderr)
    return 2
  result = json.loads(path.read_text(encoding='utf-8'))
  benchmark = a.benchmark or result.get('benchmark') or path.stem
  record = to_record(result, benchmark, a.command)
  record['benchmark'] = benchmark
  if record.get('smoke') and Path(a.dir).resolve() == results.RECORDS_DIR.resolve():
    print('record.py: a smoke run publishes no figures (give --dir elsewhere)', file=sys.stderr)
    return 2
  written = results.append_record(record, a.dir)
  print(f'appended {benchmark} ({record["host_id"]}) to {os.path.relpath(written)}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
