"""Whole decodes with the built CPU kernels against a second build with other settings, side by side.

  python experiments/bench_variant.py                    # the former AVX2 tile (32-column panels)
  python experiments/bench_variant.py --flags='-DSPECJAX_ATTENTION_SERIAL=262144'
  python experiments/bench_variant.py --variant=xla_small_ops [--draft=draft]   # XLA's gather and
                                                                  # argmax instead of the kernels'
  python experiments/bench_variant.py --smoke            # seconds: the random smoke pair (tests)

The first --n test verses of the shipped pair are decoded (--max_new_tokens, temperature --T)
autoregressively and speculatively with the feature head at --gamma, each program compiled once
with the kernels as built and once inside `cpu_kernels.variant(--flags)` (the same source
compiled with the extra flags, registered as its own XLA targets), and the four programs timed
interleaved in one process (warm-up apart; `metrics.paired_ratio` of the repeats). Printed per
build: the median time of each decode, the speedup (autoregressive over speculative), and the
variant's time over the built one's; at T = 0 whether all four gave the same tokens (the kernels'
settings change no product: cpu_kernels.cc). `--variant=xla_small_ops` compiles the second pair
of programs inside `cpu_kernels.xla_small_ops()` instead: the same kernels, but XLA's gather for
the embedding rows of a block and XLA's argmax (the decode path before the row-lookup and argmax
kernels); `--draft=draft` speculates with the pair's small T5 draft instead of the head. What
cpu_kernels.md quotes for the tile, the attention threshold and the small operations comes from
this script.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position

P32_FLAGS = '-DSPECJAX_PANEL=32 -DSPECJAX_ROWS=2 -DSPECJAX_PAIR_ROWS=0'
COLUMNS = [('build', 'build', ''), ('ar_ms', 'autoregressive ms', '.1f'),
           ('spec_ms', 'speculative ms', '.1f'), ('speedup', 'speedup', '.3f'),
           ('ar_vs_built', 'AR time / built', '.3f'), ('spec_vs_built', 'spec time / built', '.3f')]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--flags', default=P32_FLAGS, help='extra compiler flags of the variant build')
  p.add_argument('--variant', default='build', choices=('build', 'xla_small_ops'),
                 help="'build': the kernels rebuilt with --flags; 'xla_small_ops': XLA's gather "
                      'and argmax around the same kernels')
  p.add_argument('--draft', default='head', choices=('head', 'draft'),
                 help="the feature head or the pair's small T5 draft")
  p.add_argument('--n', type=int, default=8, help='test verses, one decode call each')
  p.add_argument('--gamma', type=int, default=3)
  p.add_argument('--T', type=float, default=0.0, help='temperature')
  p.add_argument('--max_new_tokens', type=int, default=40)
  p.add_argument('--repeats', type=int, default=15)
  args = bc.parse_bench_args(p, argv, smoke_help='the random smoke pair, 2 verses, 2 repeats')
  if args.smoke:
    args.n, args.repeats, args.max_new_tokens = 2, 2, 8
  return args


def compile_build(base, bp_draft, pair, xs, key, args, context):
  """(autoregressive, speculative) callables for the base model packed and traced in `context`."""
  import jax  # pylint: disable=import-outside-toplevel
  from specjax.decoding import autoregressive, chain  # pylint: disable=import-outside-toplevel
  from specjax.decoding.loop import as_draft, make_sampling  # pylint: disable=import-outside-toplevel
  sampling = make_sampling(args.T)
  eos = base.config.eos_token_id
  jax.clear_caches()  # nothing traced with the other build's targets is reused
  with context:
    target = base.pack()
    draft = (bp_draft.unpack() if bp_draft.packed is not None else bp_draft).pack()
    head = as_draft(bc.head_draft(pair, target)[0] if args.draft == 'head' else draft)
    spec = chain.speculative_program.lower(
        target, head, xs[0], key, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
        sampling=sampling, eos_id=eos).compile()
    ar = autoregressive.autoregressive_program.lower(
        target, xs[0], key, max_new_tokens=args.max_new_tokens, sampling=sampling,
        eos_id=eos).compile()
  return ((lambda: [ar(target, x, key).tokens for x in xs]),
          (lambda: [spec(target, head, x, key).tokens for x in xs]))


def main(argv=None) -> dict:
  args = parse_args(argv)
  gate = bc.load_gate(args)
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from specjax.decoding import engine  # pylint: disable=import-outside-toplevel
  from specjax.models import cpu_kernels  # pylint: disable=import-outside-toplevel
  from specjax.runner import metrics  # pylint: disable=import-outside-toplevel
  if not cpu_kernels.available():
    raise SystemExit(f'bench_variant: the CPU kernels are unavailable here ({cpu_kernels.status()})')
  info = bc.print_machine()
  pair = 'smoke' if args.smoke else 'tiny'
  bp = bc.load_bench_pair(pair, args.n, smoke=args.smoke)
  base = bp.target.unpack() if bp.target.packed is not None else bp.target
  xs = [jnp.asarray(bp.padded_NxS[i:i + 1]) for i in range(args.n)]
  key = engine.as_key(0)
  fns = {}
  second = (cpu_kernels.xla_small_ops() if args.variant == 'xla_small_ops' else
            cpu_kernels.variant(args.flags, 'bench'))
  flags = 'xla_small_ops' if args.variant == 'xla_small_ops' else args.flags
  for build, context in (('built', contextlib.nullcontext()), ('variant', second)):
    fns[(build, 'ar')], fns[(build, 'spec')] = compile_build(base, bp.draft, pair, xs, key, args,
                                                             context)
  outs = {k: np.concatenate([np.asarray(o) for o in f()]) for k, f in fns.items()}
  same = (all(np.array_equal(outs[('built', 'ar')], o) for o in outs.values())
          if args.T == 0 else None)
  timing = metrics.time_interleaved(fns, repeats=args.repeats)
  rows = []
  for build in ('built', 'variant'):
    rows.append({'build': build, 'flags': '' if build == 'built' else flags,
                 'ar_ms': timing[(build, 'ar')].median_s * 1e3,
                 'spec_ms': timing[(build, 'spec')].median_s * 1e3,
                 'speedup': metrics.paired_ratio(timing[(build, 'ar')], timing[(build, 'spec')]),
                 'ar_vs_built': metrics.paired_ratio(timing[(build, 'ar')], timing[('built', 'ar')]),
                 'spec_vs_built': metrics.paired_ratio(timing[(build, 'spec')],
                                                       timing[('built', 'spec')])})
  print(f'\n{bp.description}: {args.n} verses, T={args.T:g}, gamma {args.gamma} ({args.draft}), '
        f'{args.max_new_tokens} new tokens; variant: {flags}; kernels: '
        f'{cpu_kernels.status()}, panel {cpu_kernels.panel_width()}')
  print(bc.markdown_table(rows, COLUMNS))
  if same is not None:
    print(f'same tokens in all four programs: {same}')
  result = {'machine': info, 'args': vars(args), 'rows': rows, 'same_tokens': same}
  bc.finish_load(gate, result, args.out)
  return result


if __name__ == '__main__':
  main()
