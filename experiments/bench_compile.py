"""Compile cost: per gamma, reuse across a sweep, new shapes, and JAX's persistent cache.

  python experiments/bench_compile.py [--gammas=1,3,5,7] [--out=F.json]
  python experiments/bench_compile.py --smoke

Pair: the shipped tiny EN->ES pair (random stand-in of its shapes while it is absent), batch 1.

1. Per program: first call (trace + XLA compile + run) vs the warm call (median of repeats); compile
   = first - warm. One speculative program per gamma (gamma is static: it sets the block shape),
   one autoregressive program. The speculative program is also compiled ahead of time,
   `speculative_program.lower(...).compile()`, for a fresh shape (max_new_tokens + 1), to split
   the cost into tracing + lowering to StableHLO (Python) and XLA compilation.
2. A sweep reusing compiled programs: the cells (gamma x temperature x prompt) run twice in one
   process; the second pass traces nothing (decoding.TRACE_COUNTS unchanged) and costs only run
   time. A prompt padded to a different source length is a new shape: a new compile.
3. Persistent compilation cache (`jax_compilation_cache_dir`): the same child process
   (import, load the pair, first speculative + autoregressive decode) runs twice with one fresh
   cache directory; the second start-up reads the compiled executables from disk instead of
   compiling. Both start-ups are reported, split into import / load / first-call phases.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

T_START = time.perf_counter()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position

PROGRAM_COLUMNS = [
    ('program', 'program', ''), ('first_s', 'first call s', '.2f'), ('warm_ms', 'warm call ms', '.2f'),
    ('compile_s', 'compile s (first - warm)', '.2f'), ('lower_s', 'AOT trace+lower s', '.2f'),
    ('xla_compile_s', 'AOT XLA compile s', '.2f'),
]
SWEEP_COLUMNS = [
    ('pass', 'pass', ''), ('cells', 'cells', 'd'), ('wall_s', 'wall s', '.2f'),
    ('new_traces', 'new traces', 'd'),
]
STARTUP_COLUMNS = [
    ('run', 'run', ''), ('import_s', 'import s', '.2f'), ('load_s', 'load pair s', '.2f'),
    ('first_spec_s', 'first spec call s', '.2f'), ('first_ar_s', 'first AR call s', '.2f'),
    ('startup_s', 'start-up to first results s', '.2f'), ('process_s', 'process wall s', '.2f'),
    ('cache_files', 'cache files', 'd'),
]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  bc.add_defaults(p, pair='tiny', gammas='1,3,5,7', temperatures='0,1', max_new_tokens=48,
                  repeats=5)
  p.add_argument('--n', type=int, default=4, help='prompts per sweep cell')
  p.add_argument('--child', default='', help=argparse.SUPPRESS)  # cache dir: run one start-up
  a = bc.parse_bench_args(p, argv)
  if a.smoke:
    a.pair, a.gammas, a.temperatures, a.max_new_tokens, a.n, a.repeats = 'smoke', '3', '0', 12, 2, 1
  return a


def _decode_fns(target, draft, x, gamma, m, temperature):
  import jax  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop as decoding  # pylint: disable=import-outside-toplevel
  key = jax.random.PRNGKey(0)
  spec = lambda: decoding.speculative_decode(target, draft, x, gamma=gamma, max_new_tokens=m,  # noqa: E731
                                             temperature=temperature, rng=key).tokens
  ar = lambda: decoding.autoregressive_decode(target, x, max_new_tokens=m,  # noqa: E731
                                              temperature=temperature, rng=key).tokens
  return spec, ar


def child(args) -> None:
  """One start-up with the persistent cache at args.child; prints one JSON line."""
  t_import = time.perf_counter()
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update('jax_compilation_cache_dir', args.child)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop as decoding  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  t_load = time.perf_counter()
  target, draft, _, padded, _ = bc.load_bench_pair(args.pair, 1, smoke=args.smoke)
  x = jnp.asarray(padded[:1])
  gamma = int(args.gammas.split(',')[-1])
  spec, ar = _decode_fns(target, draft, x, gamma, args.max_new_tokens, 0.0)
  t_spec = time.perf_counter()
  jax.block_until_ready(spec())
  t_ar = time.perf_counter()
  jax.block_until_ready(ar())
  t_end = time.perf_counter()
  print(json.dumps({
      'import_s': t_load - t_import + (t_import - T_START), 'load_s': t_spec - t_load,
      'first_spec_s': t_ar - t_spec, 'first_ar_s': t_end - t_ar, 'startup_s': t_end - T_START,
  }))


def run_child(args, cache: str) -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), f'--child={cache}', f'--pair={args.pair}',
         f'--gammas={args.gammas}', f'--max_new_tokens={args.max_new_tokens}']
  if args.smoke:
    cmd.append('--smoke')
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get('JAX_PLATFORMS', 'cpu'))
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
  wall = time.perf_counter() - t0
  if proc.returncode != 0:
    raise RuntimeError(f'child failed ({proc.returncode}):\n{proc.stderr[-3000:]}')
  rec = json.loads(proc.stdout.strip().splitlines()[-1])
  rec['process_s'] = wall
  rec['cache_files'] = sum(len(f) for _, _, f in os.walk(cache))
  return rec


def main(argv=None) -> dict:
  args = parse_args(argv)
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  if args.child:
    child(args)
    return {}
  gate = bc.load_gate(args)
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop as decoding  # pylint: disable=import-outside-toplevel
  info = bc.print_machine()
  target, draft, desc, padded, ids = bc.load_bench_pair(args.pair, max(args.n, 1),
                                                        smoke=args.smoke)
  prompts = [jnp.asarray(padded[i:i + 1]) for i in range(len(ids))]
  m = args.max_new_tokens
  gammas = [int(g) for g in args.gammas.split(',')]
  temps = [float(t) for t in args.temperatures.split(',')]
  print(f'pair: {desc}; batch 1, source padded to {padded.shape[1]}, max_new_tokens {m}')

  # 1. compile time per program ---------------------------------------------------------------
  programs = []

  def measure(name, fn, lower=None):
    t = bc.interleave({name: fn}, repeats=args.repeats)[name]
    rec = {'program': name, 'first_s': t['first_s'], 'warm_ms': 1e3 * t['median_s'],
           'compile_s': t['first_s'] - t['median_s']}
    if lower is not None:  # a fresh shape (max_new_tokens + 1), so nothing is cached
      t0 = time.perf_counter()
      lowered = lower()
      t1 = time.perf_counter()
      lowered.compile()
      rec['lower_s'], rec['xla_compile_s'] = t1 - t0, time.perf_counter() - t1
    programs.append(rec)
    print(f"  {name}: first {rec['first_s']:.2f} s, warm {rec['warm_ms']:.1f} ms", flush=True)

  key = jax.random.PRNGKey(0)
  mdraft = decoding.as_draft(draft)
  for g in gammas:
    spec, _ = _decode_fns(target, draft, prompts[0], g, m, 0.0)
    samp = decoding.make_sampling(0.0)
    lower = lambda g=g, samp=samp: decoding.speculative_program.lower(  # noqa: E731
        target, mdraft, prompts[0], key, gamma=g, max_new_tokens=m + 1, sampling=samp,
        eos_id=target.config.eos_token_id)
    measure(f'speculative gamma={g}', spec, lower)
  _, ar = _decode_fns(target, draft, prompts[0], gammas[0], m, 0.0)
  measure('autoregressive', ar)

  # 2. sweep reusing compiled programs --------------------------------------------------------
  cells = [(g, t, i) for t in temps for g in gammas for i in range(len(prompts))]
  sweep = []
  for pass_name in ('first pass', 'second pass (same shapes)'):
    before = sum(decoding.TRACE_COUNTS.values())
    t0 = time.perf_counter()
    for g, t, i in cells:
      spec, ar = _decode_fns(target, draft, prompts[i], g, m, t)
      jax.block_until_ready(spec())
      jax.block_until_ready(ar())
    sweep.append({'pass': pass_name, 'cells': len(cells), 'wall_s': time.perf_counter() - t0,
                  'new_traces': sum(decoding.TRACE_COUNTS.values()) - before})
  # A new source length is a new shape: one more compile per program.
  wider = jnp.pad(prompts[0], ((0, 0), (0, 8)))
  before = sum(decoding.TRACE_COUNTS.values())
  t0 = time.perf_counter()
  spec, _ = _decode_fns(target, draft, wider, gammas[0], m, temps[0])
  jax.block_until_ready(spec())
  sweep.append({'pass': f'one cell, source padded {prompts[0].shape[1]} -> {wider.shape[1]}',
                'cells': 1, 'wall_s': time.perf_counter() - t0,
                'new_traces': sum(decoding.TRACE_COUNTS.values()) - before})

  # 3. persistent compilation cache, two fresh processes -------------------------------------
  startups = []
  with tempfile.TemporaryDirectory(prefix='specjax-jax-cache-') as cache:
    for run in ('cold cache (1st process)', 'warm cache (2nd process)'):
      rec = run_child(args, cache)
      rec['run'] = run
      startups.append(rec)
      print(f"  {run}: start-up {rec['startup_s']:.2f} s", flush=True)

  print('\nCompile time per program (first call vs warm, batch 1)')
  print(bc.markdown_table(programs, PROGRAM_COLUMNS))
  print('\nSweep reusing compiled programs (gamma x temperature x prompt cells, spec + AR each)')
  print(bc.markdown_table(sweep, SWEEP_COLUMNS))
  print('\nPersistent compilation cache: the same start-up twice (import, load, first decodes)')
  print(bc.markdown_table(startups, STARTUP_COLUMNS))
  result = {'machine': info, 'args': vars(args), 'pair': desc, 'programs': programs,
            'sweep': sweep, 'startups': startups, 'load_average_end': bc.load_average()}
  bc.finish_load(gate, result, args.out)
  return result


if __name__ == '__main__':
  main()
