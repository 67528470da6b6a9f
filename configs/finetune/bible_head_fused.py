"""A feature head with EAGLE-3's multi-layer fusion and a deeper training-time test, for the
shipped target, trained on the target's own outputs for every training verse.

  python -m specjax.finetune --config=configs/finetune/bible_head_fused.py
  python -m specjax.finetune --config=configs/finetune/bible_head_fused.py:smoke   # seconds

What changes from bible_head.py (the shipped head's recipe), and why:
- feature_taps=(0, 1): the head reads the outputs of the target's decoder layers 0 and 1 beside
  its final state (low, middle, high: EAGLE-3's fusion; the target has 3 decoder layers). The
  taps come out of the verification pass the target makes anyway (T5Model.decode_features).
- unroll=3, unroll_decay=0.8: three passes per step, pass k on the features pass k - 1
  predicted, weighted 0.8^(k-1) (EAGLE-3's training-time test): a γ = 5 proposal feeds the head
  its own features from the second token on.
- train_examples=0: the target's greedy translations of all the training verses (on-policy data,
  the same cache as bible_head.py when that runs with train_examples=0), plus the references.
Its export goes to runs/bible_head_fused/export; docs/tiny_pair.md compares it with the shipped
head on held-out verses (experiments/pair_eval.py --drafts=head,<export>).
"""

from configs.finetune import bible_head, common


def get_config(arg=None):
  a = common.parse_arg(arg, smoke=False)
  c = bible_head.get_config('smoke' if a.smoke else None)
  c.name = 'bible_head_fused'
  c.workdir = 'runs/bible_head_fused'
  c.export_dir = ''
  c.head.feature_taps = (0, 1)
  c.head.unroll = 3
  c.head.unroll_decay = 0.8
  if a.smoke:
    c.name, c.workdir = 'bible_head_fused_smoke', 'runs/bible_head_fused_smoke'
  else:
    c.data.train_examples = 0
  return c
