"""Matrix products alone, the built CPU kernels against a variant build, per number of rows M.

  python experiments/bench_products.py                                  # the former AVX2 tile
  python experiments/bench_products.py --flags='-DSPECJAX_PREFETCH=16384' --rows=1,6,8
  python experiments/bench_products.py --smoke                          # seconds (tests)

For each weight shape (--shapes, K x N) enough distinct random float32 matrices to stream
--megabytes of weights per pass (more than the L3, as a decode step's weights: one matrix
repeated would be served from cache) are packed twice: for the kernels as built and inside
`cpu_kernels.variant(--flags)`. One compiled loop per build and M applies every matrix to an
[M, K] input --loops times; the two builds' loops are timed interleaved in one process
(warm-up apart; `metrics.paired_ratio` of the repeats). Printed per shape and M: ms per matrix
for each build, each build's cost over its own M = 1 product, and the built time over the
variant's. The products are checked bitwise equal between the builds first (every tile computes
each output as the same FMA chain: cpu_kernels.cc). What cpu_kernels.md quotes for products
alone (the tile, the prefetch distance) comes from this script.
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
COLUMNS = [('shape', 'K x N', ''), ('rows', 'M', ''), ('built_ms', 'built ms', '.3f'),
           ('variant_ms', 'variant ms', '.3f'), ('built_vs_m1', 'built / its M=1', '.2f'),
           ('variant_vs_m1', 'variant / its M=1', '.2f'), ('built_vs_variant', 'built / variant',
                                                            '.3f')]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--flags', default=P32_FLAGS, help='extra compiler flags of the variant build')
  p.add_argument('--shapes', default='512x2048,2048x512,512x32128',
                 help="K x N of the weights (t5-small's FFN in and out, its output layer)")
  p.add_argument('--rows', default='1,4,6,7,8', help='M values (1 must be among them)')
  p.add_argument('--megabytes', type=float, default=100.0, help='weights streamed per pass')
  p.add_argument('--loops', type=int, default=4, help='passes per timed call')
  p.add_argument('--repeats', type=int, default=21)
  args = bc.parse_bench_args(p, argv, smoke_help='one small shape, M = 1 and 7, 2 repeats')
  if args.smoke:
    args.shapes, args.rows, args.megabytes, args.loops, args.repeats = '64x80', '1,7', 0.1, 1, 2
  try:
    args.shape_list = [tuple(int(v) for v in s.split('x')) for s in args.shapes.split(',')]
    args.row_list = [int(m) for m in args.rows.split(',')]
  except ValueError:
    p.error(f'--shapes / --rows: expected e.g. 512x2048,2048x512 and 1,4,8, got {args.shapes!r} '
            f'and {args.rows!r}')
  if 1 not in args.row_list or min(args.row_list) < 1:
    p.error('--rows must include 1 and be positive (costs are relative to the 1-row product)')
  return args


def product_loop(ws, m: int, k: int, loops: int):
  """A compiled loop applying every packed weight in turn, `loops` times, to an [m, k] input;
  each product feeds the next input, so none is skipped or overlapped."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.models import cpu_kernels  # pylint: disable=import-outside-toplevel

  def body_fn(_, x_MxK):
    for w in ws:
      x_MxK = x_MxK + cpu_kernels.matmul(x_MxK, w)[:, :1] * 1e-9
    return x_MxK

  fn = jax.jit(lambda x_MxK: jax.lax.fori_loop(0, loops, body_fn, x_MxK))
  x = jnp.asarray(jax.random.normal(jax.random.PRNGKey(m), (m, k)), jnp.float32)
  fn(x).block_until_ready()  # compiled here, inside the build's context
  return lambda: fn(x).block_until_ready()


def run_shape(k: int, n: int, args) -> list[dict]:
  """Rows of the table for one weight shape."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from specjax.models import cpu_kernels  # pylint: disable=import-outside-toplevel
  from specjax.runner import metrics  # pylint: disable=import-outside-toplevel
  copies = max(1, int(args.megabytes * 1e6 // (k * n * 4)))
  ws = [jax.random.normal(jax.random.PRNGKey(i), (k, n)) for i in range(copies)]
  x = jax.random.normal(jax.random.PRNGKey(99), (max(args.row_list), k))
  fns, products = {}, {}
  for build, context in (('built', contextlib.nullcontext()),
                         ('variant', cpu_kernels.variant(args.flags, 'products'))):
    with context:
      packed = [cpu_kernels.pack(w) for w in ws]
      for m in args.row_list:
        fns[(build, m)] = product_loop(packed, m, k, args.loops)
        # A fresh function per build: jax.jit(cpu_kernels.matmul) would reuse the built trace
        # inside the variant (same shapes), and the check would compare the built kernel twice.
        products[(build, m)] = np.asarray(
            jax.jit(lambda a, b: cpu_kernels.matmul(a, b))(x[:m], packed[0]))
  for m in args.row_list:
    if not np.array_equal(products[('built', m)], products[('variant', m)]):
      raise SystemExit(f'bench_products: the builds differ at K x N = {k}x{n}, M = {m}')
  timing = metrics.time_interleaved(fns, repeats=args.repeats)
  per = copies * args.loops
  rows = []
  for m in args.row_list:
    b, v = timing[('built', m)], timing[('variant', m)]
    rows.append({'shape': f'{k}x{n}', 'rows': m, 'copies': copies,
                 'built_ms': b.median_s / per * 1e3, 'variant_ms': v.median_s / per * 1e3,
                 'built_vs_m1': metrics.paired_ratio(b, timing[('built', 1)]),
                 'variant_vs_m1': metrics.paired_ratio(v, timing[('variant', 1)]),
                 'built_vs_variant': metrics.paired_ratio(b, v)})
  return rows


def main(argv=None) -> dict:
  args = parse_args(argv)
  gate = bc.load_gate(args)
  from specjax.models import cpu_kernels  # pylint: disable=import-outside-toplevel
  if not cpu_kernels.available():
    raise SystemExit(f'bench_products: the CPU kernels are unavailable ({cpu_kernels.status()})')
  info = bc.print_machine()
  rows = [r for k, n in args.shape_list for r in run_shape(k, n, args)]
  print(f'\nfloat32 products, {args.megabytes:g} MB of weights per pass, variant flags: '
        f'{args.flags}; kernels: {cpu_kernels.status()}, panel {cpu_kernels.panel_width()}; '
        'bitwise the same products in both builds')
  print(bc.markdown_table(rows, COLUMNS))
  result = {'machine': info, 'args': {k: v for k, v in vars(args).items()
                                      if k not in ('shape_list', 'row_list')}, 'rows': rows}
  bc.finish_load(gate, result, args.out)
  return result


if __name__ == '__main__':
  main()
