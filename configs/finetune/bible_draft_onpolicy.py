"""On-policy distillation of the shipped draft (DistillSpec): the draft samples its own
continuations and learns the target's distribution on them.

  python -m specjax.finetune --config=configs/finetune/bible_draft_onpolicy.py:tvd
  python -m specjax.finetune --config=configs/finetune/bible_draft_onpolicy.py:fkl
  python -m specjax.finetune --config=configs/finetune/bible_draft_onpolicy.py:smoke  # tests

Starts from the sequence-level distilled draft (configs/finetune/bible_draft.py) and fine-tunes
it for a few hundred steps on its own T = 1 samples of training sources, minimising the total
variation (tvd: 1 - alpha per position) or the forward KL (fkl) to the frozen shipped target.
Exports to runs/bible_draft_onpolicy_<divergence>/export; the tvd export is the shipped draft
(copy its model.safetensors and config.json to specjax/assets/tiny_pair/draft; init_from then
names the distilled draft it started from, so rerun bible_draft.py first to reproduce). Alpha
before and after: docs/tiny_pair.md.
"""

import ml_collections

from configs.finetune import common


def get_config(arg=None):
  a = common.parse_arg(arg, positional='divergence', divergence='tvd', smoke=False)
  if a.divergence not in ('tvd', 'fkl'):
    raise ValueError(f'config argument divergence={a.divergence!r} unknown (known: tvd, fkl)')
  c = common.base_config()
  c.name = f'bible_draft_onpolicy_{a.divergence}'
  c.workdir = f'runs/bible_draft_onpolicy_{a.divergence}'
  c.export_dir = ''
  c.model.init_from = 'specjax/assets/tiny_pair/draft'
  c.model.export_dtype = 'bfloat16'
  c.onpolicy = ml_collections.ConfigDict(dict(
      teacher='specjax/assets/tiny_pair/target', divergence=a.divergence, temperature=1.0,
      max_new_tokens=64))
  c.data.source_buckets = (24, 32, 48, 64)
  c.data.target_buckets = (24, 32, 48, 64)
  c.data.batch_size = 32
  c.data.cache_dir = 'runs/bible_cache'
  c.data.eval_examples = 256
  c.data.bleu_examples = 200
  c.optim.name = 'adafactor'
  c.optim.learning_rate = 3e-3
  c.optim.schedule = 'cosine'
  c.optim.warmup_steps = 20
  c.optim.end_lr_fraction = 0.1
  c.optim.b1 = 0.0
  c.optim.clip_norm = 0.0
  c.steps = 400
  c.log_every = 25
  c.eval_every = 200
  c.checkpoint_every = 100
  c.bleu_batch_size = 256
  if a.smoke:
    common.apply_smoke(c, f'bible_draft_onpolicy_{a.divergence}')
    c.model.init_from = 'specjax/assets/tiny_pair/draft'
    c.onpolicy.max_new_tokens = 16
    c.data.train_examples = 64
    c.data.bleu_examples = 0
  return c
