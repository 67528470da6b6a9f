"""Parallel blocks for the shipped feature head: one head pass drafts a whole block.

  python -m specjax.finetune --config=configs/finetune/bible_head_parallel.py
  python -m specjax.finetune --config=configs/finetune/bible_head_parallel.py:smoke   # seconds

The shipped head (specjax/assets/tiny_pair/head) drafts token by token: a block of gamma tokens
costs one window pass and gamma - 1 one-token passes. With parallel blocks (Medusa-style
per-position heads on the head's state, specjax.models.head.parallel_states) the window pass
alone gives q for all gamma tokens (draft name 'DIR:parallel=1'): tokens 2 .. gamma are drafted
without seeing the tokens before them, so they are accepted less often, for a draft cost that no
longer grows with gamma.

What changes from bible_head.py, and why:
- head.init_from = the shipped head, head.freeze_trunk: only the P = 7 parallel blocks train (up
  to gamma = 8); the trunk, and so the sequential mode, stays the shipped head's exactly.
- The loss: KL(p_{j+k-1} || q_k(j)) for each depth k = 2 .. 8 against the target's distribution
  on its own greedy outputs only (the same 16,000 training verses as the shipped head, shared
  through data.cache_dir; no references: the blocks learn the target's continuations). Dev alpha per depth is logged as dev_alpha_d<k>.
Its export goes to runs/bible_head_parallel/export; docs/tiny_pair.md has its curve and what it
measures on held-out verses.
"""

from configs.finetune import bible_head, common


def get_config(arg=None):
  a = common.parse_arg(arg, smoke=False)
  c = bible_head.get_config('smoke' if a.smoke else None)
  c.name = 'bible_head_parallel'
  c.workdir = 'runs/bible_head_parallel'
  c.export_dir = ''
  c.head.parallel_depth = 7
  c.head.parallel_ff = 256
  c.head.init_from = 'specjax/assets/tiny_pair/head'
  c.head.freeze_trunk = True
  c.head.include_references = False  # the blocks learn the target's own continuations
  if a.smoke:  # no shipped head fits the smoke head's width: the whole head trains
    c.name, c.workdir = 'bible_head_parallel_smoke', 'runs/bible_head_parallel_smoke'
    c.head.parallel_depth = 2
    c.head.parallel_ff = 8
    c.head.init_from = ''
    c.head.freeze_trunk = False
  else:
    c.steps = 1200
  return c
