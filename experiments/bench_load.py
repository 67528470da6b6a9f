"""One specjax-vs-transformers comparison at several induced machine loads: where the ratio drifts.

  python experiments/bench_load.py [--pair=tiny] [--loads=0,0.5,1,2,3] [--settle_s=60] [--out=F.json]
  python experiments/bench_load.py --smoke          # seconds: loads 0 and 1, no settling (tests)

For each load level L, floor(L) busy-loop processes plus one running the fractional part of the
time (a 100 ms duty cycle) are started, the script waits `settle_s` for the 1-minute load average
to follow, then runs experiments/bench_transformers.py's comparison (transformers greedy and
assisted at 2 and 1 torch threads, specjax autoregressive and speculative; the same prompts,
identical tokens) and stops the loops. Every busy loop also ends by itself after a deadline.

Printed per level: the load average at the start and end of the timings, the CPU other
processes took during them (specjax/runner/machine.py: the machine's busy time minus this
process's own, which counts the busy loops and anything else running), the tokens/s of each
row, and the two ratios with their drift from the first level (0 induced load):

  AR / greedy          specjax autoregressive / the fastest transformers greedy row
  spec / assisted      specjax speculative / the fastest transformers assisted row

The first level (0 extra load) must start on a quiet machine (the load gate), otherwise the
curve has no quiet end; `--allow-loaded` runs it anyway, marked.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position
import bench_transformers  # noqa: E402  pylint: disable=wrong-import-position

COLUMNS = [
    ('extra_load', 'induced load', 'g'),
    ('load1_start', 'load 1-min start', '.2f'), ('load1_end', 'load 1-min end', '.2f'),
    ('others_cores', 'others cores', '.2f'),
    ('tf_greedy_2', 'tf greedy 2 thr tok/s', '.1f'), ('tf_greedy_1', 'tf greedy 1 thr tok/s', '.1f'),
    ('tf_assisted_best', 'tf assisted best tok/s', '.1f'),
    ('ar', 'specjax AR tok/s', '.1f'), ('spec', 'specjax spec tok/s', '.1f'),
    ('ar_vs_greedy', 'AR / greedy', '.2f'), ('ar_drift', 'drift', '+.0%'),
    ('spec_vs_assisted', 'spec / assisted', '.2f'), ('spec_drift', 'drift', '+.0%'),
    ('identical', 'same tokens', ''),
]

# A busy loop with a deadline: duty = fraction of each 100 ms period spent spinning.
_BUSY = """
import sys, time
deadline, duty = time.monotonic() + float(sys.argv[1]), float(sys.argv[2])
while time.monotonic() < deadline:
  t = time.monotonic()
  while time.monotonic() - t < 0.1 * duty:
    pass
  if duty < 1:
    time.sleep(0.1 * (1 - duty))
"""


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--pair', default='tiny', help='tiny | t5-small')
  p.add_argument('--loads', default='0,0.5,1,2,3', help='induced loads (busy processes)')
  p.add_argument('--settle_s', type=float, default=60.0,
                 help='seconds between starting the busy loops and the timings')
  p.add_argument('--n', type=int, default=8)
  p.add_argument('--max_new_tokens', type=int, default=48)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--gamma', default='tiny=5,t5-small=3')
  p.add_argument('--torch_threads', default='1',
                 help="torch thread counts (0 = all cores); 1 by default: transformers' fastest "
                      'setting on the tiny pair even when quiet, and at 2 threads its OpenMP '
                      'workers collapse under load (a level would take minutes)')
  p.add_argument('--max_busy_s', type=float, default=900.0, help='busy loops end by themselves')
  a = bc.parse_bench_args(p, argv)
  if a.smoke:
    a.pair, a.loads, a.settle_s, a.n, a.max_new_tokens, a.repeats = 'smoke', '0,1', 0.0, 2, 12, 1
    a.gamma, a.torch_threads = '3', '1'
  return a


def start_busy(load: float, max_s: float) -> list[subprocess.Popen]:
  """floor(load) full busy loops and one at the fractional duty cycle."""
  duties = [1.0] * int(math.floor(load))
  if load - math.floor(load) > 1e-6:
    duties.append(load - math.floor(load))
  return [subprocess.Popen([sys.executable, '-c', _BUSY, str(max_s), str(d)])
          for d in duties]


def stop_busy(procs: list[subprocess.Popen]) -> None:
  for p in procs:
    p.terminate()
  for p in procs:
    try:
      p.wait(timeout=10)
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


def summarize(extra: float, rec: dict, load: dict) -> dict:
  rows = {r['method']: r for r in rec['rows']}
  best = lambda prefix: max(r['tokens_per_s'] for k, r in rows.items() if k.startswith(prefix))  # noqa: E731
  tf_g, tf_a = best('transformers greedy'), best('transformers assisted')
  ar, spec = rows['specjax autoregressive']['tokens_per_s'], rows['specjax speculative']['tokens_per_s']
  by_threads = {k.split('[')[1].split()[0]: r['tokens_per_s'] for k, r in rows.items()
                if k.startswith('transformers greedy')}
  return {
      'extra_load': extra, 'load1_start': load['load_average_start'][0],
      'load1_end': load['load_average_end'][0], 'others_cores': load['others_cores'],
      'tf_greedy_2': by_threads.get('2'), 'tf_greedy_1': by_threads.get('1'),
      'tf_assisted_best': tf_a, 'ar': ar, 'spec': spec,
      'ar_vs_greedy': ar / tf_g, 'spec_vs_assisted': spec / tf_a,
      'identical': rec['all_identical'], 'load': load,
  }


def main(argv=None) -> dict:
  args = parse_args(argv)
  gate = bc.load_gate(args)
  bc.set_threads(None)
  import torch  # pylint: disable=import-outside-toplevel,unused-import
  import transformers  # pylint: disable=import-outside-toplevel,unused-import
  info = bc.print_machine()
  pair_args = argparse.Namespace(gamma=args.gamma, n=args.n, max_new_tokens=args.max_new_tokens,
                                 repeats=args.repeats, torch_threads=args.torch_threads)
  levels = [float(x) for x in args.loads.split(',')]
  result = {'machine': info, 'args': vars(args), 'levels': []}
  quiet = None
  for extra in levels:
    procs = start_busy(extra, args.max_busy_s)
    try:
      if procs and args.settle_s:
        print(f'\n-- induced load {extra:g}: {len(procs)} busy process(es), settling '
              f'{args.settle_s:.0f} s', flush=True)
        time.sleep(args.settle_s)
      since = gate.mark()
      rec = bench_transformers.run_pair(args.pair, pair_args, log=lambda *_: None)
      load, line = bc.table_load(gate, since)
    finally:
      stop_busy(procs)
    row = summarize(extra, rec, load)
    if quiet is None:
      quiet = row
    row['ar_drift'] = row['ar_vs_greedy'] / quiet['ar_vs_greedy'] - 1
    row['spec_drift'] = row['spec_vs_assisted'] / quiet['spec_vs_assisted'] - 1
    result['levels'].append(dict(row, rows=rec['rows']))
    print(f"induced {extra:g}: AR/greedy {row['ar_vs_greedy']:.2f} ({row['ar_drift']:+.0%}), "
          f"spec/assisted {row['spec_vs_assisted']:.2f} ({row['spec_drift']:+.0%}); {line}",
          flush=True)
    bc.write_json(args.out, result)
  print(f'\nRatio vs machine load ({args.pair} pair, batch 1, greedy; drift = change from the '
        f'first level)')
  print(bc.markdown_table(result['levels'], COLUMNS))
  # The gate's verdict is the first level's: the others are loaded on purpose.
  first = result['levels'][0]['load']
  result['load'] = first
  bc.write_json(args.out, result)
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  machine.finish(first)
  return result


if __name__ == '__main__':
  main()
