"""Parallel blocks for the shipped feature head: one head pass drafts a whole block.

  python -m specjax.finetune --config=configs/finetune/bible_head_parallel.py
  python -m specjax.finetune --config=configs/finetune/bible_head_parallel.py:blocks=medusa
  python -m specjax.finetune --config=configs/finetune/bible_head_parallel.py:smoke   # seconds

The shipped head (specjax/assets/tiny_pair/head) drafts token by token: a block of gamma tokens
costs one window pass and gamma - 1 one-token passes. With parallel blocks the window pass is the
only head pass of a block (draft name 'DIR:parallel=1'); drafts 2 .. gamma come from small
residual MLPs on the head's state (specjax.models.head.parallel_step), a draft cost that hardly
grows with gamma:
- blocks=chain (default, head.parallel_tokens): block k reads the previous state and draft k
  (Hydra-style), so q follows the drafts drawn;
- blocks=medusa: every block reads the window's state alone (Medusa-style per-position heads):
  drafts 2 .. gamma do not see the drafts before them.

What changes from bible_head.py, and why:
- head.init_from = the shipped head, head.freeze_trunk: only the P = 7 parallel blocks train (up
  to gamma = 8); the trunk, and so the sequential mode, stays the shipped head's exactly.
- The loss: KL(p_{j+k-1} || q_k(j)) for each depth k = 2 .. 8 against the target's distribution
  on its own greedy outputs only (the same 16,000 training verses as the shipped head, shared
  through data.cache_dir; no references: the blocks learn the target's continuations), the
  chain fed the training targets as its drafts. Dev alpha per depth: dev_alpha_d<k>.
Its export goes to runs/bible_head_parallel_<blocks>/export; docs/tiny_pair.md has its curve and
what it measures on held-out verses.
"""

from configs.finetune import bible_head, common


def get_config(arg=None):
  a = common.parse_arg(arg, smoke=False, blocks='chain')
  if a.blocks not in ('chain', 'medusa'):
    raise ValueError(f'config argument blocks={a.blocks!r}: chain or medusa')
  c = bible_head.get_config('smoke' if a.smoke else None)
  c.name = f'bible_head_parallel_{a.blocks}'
  c.workdir = f'runs/bible_head_parallel_{a.blocks}'
  c.export_dir = ''
  c.head.parallel_depth = 7
  c.head.parallel_ff = 256
  c.head.parallel_tokens = a.blocks == 'chain'
  c.head.init_from = 'specjax/assets/tiny_pair/head'
  c.head.freeze_trunk = True
  c.head.include_references = False  # the blocks learn the target's own continuations
  if a.smoke:  # no shipped head fits the smoke head's width: the whole head trains
    c.name, c.workdir = f'{c.name}_smoke', f'{c.workdir}_smoke'
    c.head.parallel_depth = 2
    c.head.parallel_ff = 8
    c.head.init_from = ''
    c.head.freeze_trunk = False
  else:
    c.steps = 1200
  return c
