"""A memory-bound target for the default EN->ES pair: the shipped target's recipe, widened so
that one CPU decode step must stream its weights from DRAM (prepared; not yet trained).

  python -m specjax.finetune --config=configs/finetune/bible_target_membound.py
  python -m specjax.finetune --config=configs/finetune/bible_target_membound.py:smoke  # tests

Why: the shipped target (7.0M params, 28 MB in float32) fits this CPU's 32 MiB L3, so verifying
gamma + 1 tokens costs 2-3 one-token steps and the default run shows no speedup
(docs/performance.md section 2). This shape, d_model 512, 2 encoder + 3 decoder layers, d_ff
1536 (gated-GELU), 8 heads: 24.3M params, of which the decoder and head are 15.4M (61.7 MB in
float32, past the L3; one of the candidates `experiments/pair_shapes.py` times). Trained
for 4000 steps of 32 verses (4.5 epochs of the 28,365 verses that fit 64 tokens) with dropout
0.1; it exports over the shipped target, after which the draft is distilled from it again
(configs/finetune/bible_draft.py). On 2 quiet CPU cores a step takes ~2 s (0.51 steps/s
measured once every bucket is compiled), so the 4000 steps need ~2.2 hours of both cores, and the
draft's distillation ~1 hour more: train it on an accelerator where one is available, and resume
with the same command when interrupted (orbax checkpoints every 200 steps).
"""

from configs.finetune import bible_target
from configs.finetune import common


def get_config(arg=None):
  a = common.parse_arg(arg, smoke=False)
  c = bible_target.get_config()
  c.name = 'bible_target_membound'
  c.workdir = 'runs/bible_target_membound'
  c.model.t5 = common.t5_v11(d_model=512, num_layers=2, num_decoder_layers=3, num_heads=8,
                             d_kv=64, d_ff=1536)
  c.model.dropout_rate = 0.1
  c.data.batch_size = 32
  c.optim.warmup_steps = 200
  c.steps = 4000
  c.log_every = 50
  c.eval_every = 500
  c.checkpoint_every = 200
  if a.smoke:
    common.apply_smoke(c, 'bible_target_membound')
  return c
