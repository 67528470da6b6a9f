"""The shipped target of the tiny EN->ES pair (specjax/assets/tiny_pair/target).

  python -m specjax.finetune --config=configs/finetune/bible_target.py
  python -m specjax.finetune --config=configs/finetune/bible_target.py:smoke   # seconds, tests

A T5 v1.1-style model (gated-GELU, untied head) trained from scratch on the shipped KJV ->
Reina-Valera 1909 corpus with its 4000-token SentencePiece vocabulary, sized to train in ~20 minutes
on 2 shared CPU cores (7.0M params; 2 encoder + 4 decoder layers, so one decode step costs ~6x the
draft's). Then train the draft (configs/finetune/bible_draft.py) on this model's greedy outputs.
Measured figures: docs/tiny_pair.md.
"""

from configs.finetune import common


def get_config(arg=None):
  a = common.parse_arg(arg, smoke=False)
  c = common.base_config()
  c.name = 'bible_target'
  c.workdir = 'runs/bible_target'
  c.export_dir = 'specjax/assets/tiny_pair/target'
  c.model.t5 = common.t5_v11(d_model=256, num_layers=2, num_decoder_layers=4, num_heads=4,
                             d_kv=64, d_ff=512)
  c.model.export_dtype = 'bfloat16'
  c.data.source_buckets = (24, 32, 48, 64)
  c.data.target_buckets = (24, 32, 48, 64)
  c.data.batch_size = 24
  c.data.eval_examples = 256
  c.data.bleu_examples = 200
  # T5X's optimiser: Adafactor's updates are relative to each parameter's RMS. T5 has no
  # 1/sqrt(d_kv) in attention (it is folded into the q init), so AdamW's absolute steps at a useful
  # learning rate move q/k by ~25% a step and training stalls (tried: lr 2e-3 plateaus at 4.6).
  c.optim.name = 'adafactor'
  c.optim.learning_rate = 1e-2
  c.optim.schedule = 'cosine'
  c.optim.warmup_steps = 50
  c.optim.end_lr_fraction = 0.1
  c.optim.b1 = 0.0
  c.optim.clip_norm = 0.0
  c.steps = 800
  c.log_every = 25
  c.eval_every = 200
  c.checkpoint_every = 100
  if a.smoke:
    common.apply_smoke(c, 'bible_target')
  return c
