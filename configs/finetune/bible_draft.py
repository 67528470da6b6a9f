"""The shipped draft of the tiny EN->ES pair (specjax/assets/tiny_pair/draft).

  python -m specjax.finetune --config=configs/finetune/bible_target.py     # first: the target
  python -m specjax.finetune --config=configs/finetune/bible_draft.py
  python -m specjax.finetune --config=configs/finetune/bible_draft.py:smoke    # seconds, tests
  python -m specjax.finetune --config=configs/finetune/bible_draft.py:references  # no distillation

Same tokenizer and vocabulary as the target, one narrow decoder layer (far cheaper per decode step),
trained by sequence-level distillation: the targets are the shipped target's greedy translations of
the training sources (decoded once, cached in runs/bible_cache, where the feature head's training
finds them), which raises the acceptance rate alpha. The shipped draft is this one after on-policy
distillation (configs/finetune/bible_draft_onpolicy.py:tvd, exported to
runs/bible_draft_onpolicy_tvd/export and copied over this export).
Measured figures: docs/tiny_pair.md.
"""

from configs.finetune import common


def get_config(arg=None):
  a = common.parse_arg(arg, smoke=False, references=False)
  c = common.base_config()
  c.name = 'bible_draft'
  c.workdir = 'runs/bible_draft'
  c.export_dir = 'specjax/assets/tiny_pair/draft'
  c.model.t5 = common.t5_v11(d_model=128, num_layers=2, num_decoder_layers=1, num_heads=2,
                             d_kv=64, d_ff=256)
  c.model.export_dtype = 'bfloat16'
  c.data.distill_from = '' if a.references else 'specjax/assets/tiny_pair/target'
  c.data.source_buckets = (24, 32, 48, 64)
  c.data.target_buckets = (24, 32, 48, 64)
  c.data.batch_size = 32
  c.data.cache_dir = 'runs/bible_cache'  # the head (bible_head.py) reuses this decode
  c.data.train_examples = 16000  # distilled: a random 16k of the ~28k verses (decoding them all
                                 # with the target would take longer than training the draft)
  c.data.eval_examples = 512
  c.data.bleu_examples = 200
  c.optim.name = 'adafactor'  # as the target (see bible_target.py)
  c.optim.learning_rate = 1e-2
  c.optim.schedule = 'cosine'
  c.optim.warmup_steps = 50
  c.optim.end_lr_fraction = 0.1
  c.optim.b1 = 0.0
  c.optim.clip_norm = 0.0
  c.steps = 1500
  c.log_every = 50
  c.eval_every = 500
  c.checkpoint_every = 250
  c.bleu_batch_size = 256  # rows per greedy batch when distilling (and for BLEU)
  if a.smoke:
    common.apply_smoke(c, 'bible_draft')
  return c
