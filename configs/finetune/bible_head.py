"""A feature head for the shipped target (specjax/assets/tiny_pair/head): drafts from the target's
own hidden states, no encoder of its own (specjax.models.head, EAGLE's recipe for T5).

  python -m specjax.finetune --config=configs/finetune/bible_head.py
  python -m specjax.finetune --config=configs/finetune/bible_head.py:smoke   # seconds, tests

Frozen target: the shipped one. Data: its greedy translations of 16,000 training verses (the
same decode as the draft's distillation, shared through data.cache_dir) plus the references.
Loss: smooth-L1 onto the next target feature + KL(p_target || q_head), two passes (the second
reads the first's predicted features). Measured figures: docs/tiny_pair.md.
"""

import ml_collections

from configs.finetune import common


def head_section(d_model=192, num_heads=3, d_kv=64, d_ff=512):
  return ml_collections.ConfigDict(dict(
      d_model=d_model, num_heads=num_heads, d_kv=d_kv, d_ff=d_ff, feature_weight=1.0,
      distribution_weight=1.0, feature_noise=0.05, unroll=2, include_references=True,
      feature_taps=(), unroll_decay=1.0, parallel_depth=0, parallel_ff=256,
      parallel_tokens=False, init_from='', freeze_trunk=False))


def get_config(arg=None):
  a = common.parse_arg(arg, smoke=False)
  c = common.base_config()
  c.name = 'bible_head'
  c.workdir = 'runs/bible_head'
  c.export_dir = 'specjax/assets/tiny_pair/head'
  c.model.init_from = 'specjax/assets/tiny_pair/target'   # the frozen target the head reads
  c.model.export_dtype = 'bfloat16'
  c.head = head_section()
  c.data.source_buckets = (24, 32, 48, 64)
  c.data.target_buckets = (24, 32, 48, 64)
  c.data.batch_size = 32
  c.data.train_examples = 16000       # target outputs (as the draft's distillation)
  c.data.cache_dir = 'runs/bible_cache'
  c.data.eval_examples = 256
  c.data.bleu_examples = 0
  c.optim.name = 'adafactor'
  c.optim.learning_rate = 1e-2
  c.optim.schedule = 'cosine'
  c.optim.warmup_steps = 100
  c.optim.end_lr_fraction = 0.1
  c.optim.b1 = 0.0
  c.optim.clip_norm = 0.0
  c.steps = 3600   # dev alpha 0.65 with 1200 steps, 0.72 with 2400, 0.75 with 3600
  c.log_every = 50
  c.eval_every = 400
  c.checkpoint_every = 400
  c.bleu_batch_size = 256
  if a.smoke:
    common.apply_smoke(c, 'bible_head')
    c.model.init_from = 'specjax/assets/tiny_pair/target'
    c.head = head_section(d_model=16, num_heads=2, d_kv=8, d_ff=32)
    c.data.train_examples = 64
    c.data.bleu_examples = 0
  return c
