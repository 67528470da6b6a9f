"""The shipped feature head's second stage: 2000 more steps from the head bible_head.py trains.

  python -m specjax.finetune --config=configs/finetune/bible_head.py            # stage 1, 3600 steps
  python -m specjax.finetune --config=configs/finetune/bible_head_continue.py   # stage 2
  python -m specjax.finetune --config=configs/finetune/bible_head_continue.py:smoke   # seconds

Stage 1 ends on a cosine schedule at dev alpha 0.750 and was still rising (0.65 at 1200 steps,
0.72 at 2400, each with its own schedule). Stage 2 starts from its export (head.init_from, every
parameter trains) with the same data and losses and a fresh cosine schedule from a third of the
stage-1 peak learning rate (3e-3, 50 warm-up steps): dev alpha 0.749 / 0.754 / 0.758 / 0.761 /
0.762 at 400 / 800 / 1200 / 1600 / 2000 steps, 29 minutes on 2 cores. Its export replaces the
head's weights in the assets, where stage 3 (bible_head_alldata.py) starts from; vocab.json stays
the shipped one (the training verses' reference ids by frequency, which configs/tiny.py's
vocab=2582 cuts). Measured figures: docs/tiny_pair.md.
"""

from configs.finetune import bible_head, common


def get_config(arg=None):
  a = common.parse_arg(arg, smoke=False)
  c = bible_head.get_config('smoke' if a.smoke else None)
  c.name = 'bible_head_continue'
  c.workdir = 'runs/bible_head_continue'
  c.export_dir = 'runs/bible_head_continue/export'  # copied into the assets by hand (tiny_pair.md)
  c.head.init_from = 'specjax/assets/tiny_pair/head'
  c.optim.learning_rate = 3e-3
  c.optim.warmup_steps = 50
  if a.smoke:  # no shipped head fits the smoke head's width: stage 2 alone starts fresh
    c.name, c.workdir = 'bible_head_continue_smoke', 'runs/bible_head_continue_smoke'
    c.export_dir = ''
    c.head.init_from = ''
  else:
    c.steps = 2000
  return c
