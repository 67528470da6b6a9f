"""Where a decoder step's time goes: per-thunk profile of a compiled loop of decoder steps.

  python experiments/profile_step.py [--model=target|draft] [--tokens=1,6] [--dtype=float32]
  python experiments/profile_step.py --smoke                  # tests: a few steps

The model runs `--steps` decoder steps of K tokens per row inside one compiled `fori_loop` (the
cache carried, the argmax fed back: `specjax.runner.metrics.step_loop`), under
`jax.profiler.trace(..., create_perfetto_trace=True)`. XLA records one event per executed thunk
(on XLA:CPU: each dot, each fusion, each copy); the events are summed per kind (the thunk name
without its numeric suffix) and divided by the number of steps, so the table says what one step
costs, op kind by op kind: the matmuls against the layout copies, the cache writes and the rest.
The thunk sum is the device time of the step; a profiler adds a little to each thunk, so compare
kinds within a table rather than with untraced timings.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position

COLUMNS = [
    ('kind', 'thunk kind', ''), ('count', 'per step', '.1f'), ('us', 'us / step', '.1f'),
    ('share', 'share', '.1%'),
]
_SKIP = ('ThunkExecutor', 'PjitFunction', 'CommonPjRt', '$')
_CONTAINERS = ('while', 'conditional', 'call')  # thunks that hold other thunks: not summed


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--model', default='target', choices=('target', 'draft'))
  p.add_argument('--tokens', default='1,6', help='tokens per row of the profiled steps')
  p.add_argument('--batch', type=int, default=1)
  p.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'))
  p.add_argument('--src_len', type=int, default=64)
  p.add_argument('--cache_len', type=int, default=56)
  p.add_argument('--steps', type=int, default=64, help='decoder steps per compiled loop')
  p.add_argument('--calls', type=int, default=5, help='profiled calls of the loop')
  p.add_argument('--top', type=int, default=12, help='thunk kinds listed')
  a = bc.parse_bench_args(p, argv)
  if a.smoke:
    a.steps, a.calls, a.tokens = 4, 1, '1,3'
  return a


def thunk_profile(fn, calls: int) -> dict[str, list[float]]:
  """{thunk name: [count, total microseconds]} over `calls` profiled calls of fn."""
  import jax  # pylint: disable=import-outside-toplevel
  jax.block_until_ready(fn())  # compiled and warm before tracing
  with tempfile.TemporaryDirectory() as d:
    jax.profiler.start_trace(d, create_perfetto_trace=True)
    try:
      for _ in range(calls):
        jax.block_until_ready(fn())
    finally:
      jax.profiler.stop_trace()
    paths = glob.glob(os.path.join(d, '**', '*.json.gz'), recursive=True)
    if not paths:
      raise RuntimeError('the profiler wrote no perfetto trace')
    with gzip.open(paths[0]) as f:
      events = json.load(f)['traceEvents']
  agg = collections.defaultdict(lambda: [0, 0.0])
  for e in events:
    if e.get('ph') == 'X' and not e['name'].startswith(_SKIP) and 'stop_trace' not in e['name']:
      agg[e['name']][0] += 1
      agg[e['name']][1] += float(e.get('dur', 0.0))
  return agg


def by_kind(agg, steps: int) -> list[dict]:
  """Per-step rows per thunk kind ('dot.12' and 'dot.40' are both 'dot'), largest first."""
  kinds = collections.defaultdict(lambda: [0, 0.0])
  for name, (n, us) in agg.items():
    kind = re.sub(r'\.\d+$', '', name)
    if kind in _CONTAINERS:
      continue
    kinds[kind][0] += n
    kinds[kind][1] += us
  total = sum(us for _, us in kinds.values()) or 1.0
  rows = [{'kind': k, 'count': n / steps, 'us': us / steps, 'share': us / total}
          for k, (n, us) in kinds.items()]
  return sorted(rows, key=lambda r: -r['us'])


def main(argv=None) -> dict:
  args = parse_args(argv)
  gate = bc.load_gate(args)
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.runner.metrics import step_loop  # pylint: disable=import-outside-toplevel
  info = bc.print_machine()
  dirs = bc.tiny_pair_dirs()
  if dirs is None:
    raise SystemExit('profile_step: the shipped tiny pair (specjax/assets/tiny_pair) is missing')
  dtype = jnp.bfloat16 if args.dtype == 'bfloat16' else jnp.float32
  target, draft = bc.load_pair_jax(*dirs, dtype=dtype)
  model = target if args.model == 'target' else draft
  ids = jnp.full((args.batch, args.src_len), 7, jnp.int32)
  res = {'machine': info, 'args': vars(args), 'profiles': []}
  for k in [int(x) for x in args.tokens.split(',')]:
    cache_len = max(args.cache_len, args.cache_len // 2 + k + 1)
    cache = jax.jit(model.init_cache, static_argnums=1)(ids, cache_len)
    toks = jnp.full((args.batch, k), 5, jnp.int32)
    lengths = jnp.full((args.batch,), cache_len // 2, jnp.int32)
    t0 = time.perf_counter()
    agg = thunk_profile(lambda: step_loop(model, cache, toks, lengths, steps=args.steps),
                        args.calls)
    rows = by_kind(agg, args.steps * args.calls)
    total_us = sum(r['us'] for r in rows)
    res['profiles'].append({'tokens': k, 'step_us': total_us, 'rows': rows,
                            'wall_s': time.perf_counter() - t0})
    print(f'\n{args.model} ({args.dtype}), batch {args.batch}, {k} token(s) per row: thunks sum '
          f'to {total_us:.0f} us per step ({args.steps} steps x {args.calls} calls)')
    print(bc.markdown_table(rows[:args.top], COLUMNS))
  bc.finish_load(gate, res, args.out)
  return res


if __name__ == '__main__':
  main()
