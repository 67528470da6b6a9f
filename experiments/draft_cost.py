"""What drafting one block costs, per draft and gamma, in the target's 1-token steps.

  python experiments/draft_cost.py [--drafts='draft;head:vocab=2582;head:vocab=2582,parallel=1']
  python experiments/draft_cost.py --xla_small_ops  # also each block with XLA's gather/argmax
  python experiments/draft_cost.py --smoke          # seconds: the random smoke pair (tests)

For every draft (a T5 checkpoint or a feature-head directory with its options; bare names are
read under specjax/assets/tiny_pair; drafts separated by ';') and every --gammas entry: the
draft's whole `propose` for one block -- every pass it makes -- timed inside one compiled loop
against the target's 1-token step, interleaved (metrics.measure_proposal_cost; batch 1, the
first test verse, cache --cache_len), beside c (one 1-token draft pass, metrics.measure_c) and
gamma * c, the block's price in the paper's cost model. A sequential head pays a window pass and
gamma - 1 one-token passes; a parallel head (':parallel=1') one window pass for the block.
`--xla_small_ops` measures each block a second time traced inside `cpu_kernels.xla_small_ops()`
(XLA's gather and argmax instead of the row-lookup and argmax kernels), right after the first.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position

COLUMNS = [('draft', 'draft', ''), ('gamma', 'gamma', ''), ('c', 'c (1 pass)', '.3f'),
           ('gamma_c', 'gamma * c', '.3f'), ('block', 'block (measured)', '.3f')]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--drafts', default='draft;head:vocab=2582;head:vocab=2582,parallel=1')
  p.add_argument('--gammas', default='3,5,7')
  p.add_argument('--cache_len', type=int, default=48)
  p.add_argument('--repeats', type=int, default=15)
  p.add_argument('--rounds', type=int, default=3)
  p.add_argument('--xla_small_ops', action='store_true',
                 help="also each block with XLA's gather and argmax (cpu_kernels.xla_small_ops)")
  args = bc.parse_bench_args(p, argv, smoke_help='the random smoke pair and heads, 2 repeats')
  if args.smoke:
    args.repeats, args.rounds, args.gammas = 2, 1, '2'
  return args


def load_draft(name: str, target, root: str):
  """A T5 draft or a feature head (with its options) by name, as pair_eval reads them."""
  import specjax  # pylint: disable=import-outside-toplevel
  from specjax.runner import drafts as drafts_lib  # pylint: disable=import-outside-toplevel
  path = name if os.path.isdir(os.path.expanduser(name.split(':')[0])) else os.path.join(root,
                                                                                          name)
  if drafts_lib.is_head_dir(path):
    return drafts_lib.head_draft(target, path)
  return specjax.load_t5(path, quantize='lossless')  # as the runner loads a draft


def smoke_root(directory: str, target) -> None:
  """A random draft-width head with parallel blocks in `directory`/head (the smoke pair's)."""
  import jax  # pylint: disable=import-outside-toplevel
  from specjax.models import head as head_lib  # pylint: disable=import-outside-toplevel
  hc = head_lib.HeadConfig.for_target(target.config, d_model=16, num_heads=2, d_kv=8, d_ff=32,
                                      parallel_depth=2, parallel_ff=8)
  head_lib.save_head(head_lib.init_head_params(hc, jax.random.PRNGKey(0)), hc,
                     os.path.join(directory, 'head'))


def main(argv=None) -> dict:
  args = parse_args(argv)
  gate = bc.load_gate(args)
  import tempfile  # pylint: disable=import-outside-toplevel
  from specjax import data  # pylint: disable=import-outside-toplevel
  from specjax.models import cpu_kernels  # pylint: disable=import-outside-toplevel
  from specjax.runner import metrics  # pylint: disable=import-outside-toplevel
  info = bc.print_machine()
  pair = 'smoke' if args.smoke else 'tiny'
  bp = bc.load_bench_pair(pair, 1, smoke=args.smoke)
  target, batch = bp.target, bp.padded_NxS[:1]
  gammas = [int(g) for g in args.gammas.split(',')]
  rows = []
  with tempfile.TemporaryDirectory(prefix='draft_cost_') as tmp:
    root = str(data.TINY_PAIR_DIR)
    if args.smoke:
      root = tmp
      smoke_root(tmp, target)
      args.drafts = 'head;head:parallel=1'
    for name in filter(None, (n.strip() for n in args.drafts.split(';'))):
      draft = load_draft(name, target, root)
      c = metrics.measure_c(target, draft, batch, args.cache_len, repeats=args.repeats,
                            rounds=args.rounds)
      for gamma in gammas:
        cost = metrics.measure_proposal_cost(target, draft, batch, args.cache_len, gamma,
                                             repeats=args.repeats, rounds=args.rounds)
        rows.append({'draft': name, 'gamma': gamma, 'c': c, 'gamma_c': gamma * c,
                     'block': cost})
        if args.xla_small_ops:
          with cpu_kernels.xla_small_ops():
            rows[-1]['block_xla'] = metrics.measure_proposal_cost(
                target, draft, batch, args.cache_len, gamma, repeats=args.repeats,
                rounds=args.rounds)
        print(rows[-1], flush=True)
  print(f'\n{bp.description}: batch 1, cache {args.cache_len}; costs in 1-token target steps, '
        f'medians of {args.rounds} rounds of {args.repeats} interleaved repeats')
  columns = COLUMNS + ([('block_xla', "block, XLA's gather/argmax", '.3f')]
                       if args.xla_small_ops else [])
  print(bc.markdown_table(rows, columns))
  result = {'machine': info, 'args': vars(args), 'rows': rows}
  bc.finish_load(gate, result, args.out)
  return result


if __name__ == '__main__':
  main()
