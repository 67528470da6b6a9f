"""Paper Table 2 rows: T5-XXL target, T5-small draft, WMT EnDe and CNN/DM, temperatures 0 and 1.

  python -m specjax.run --config=configs/t5xxl_small.py
  python -m specjax.run --config=configs/t5xxl_small.py:v11      # T5 v1.1 checkpoints instead
  python -m specjax.run --config=configs/t5xxl_small.py --config.tasks=ende --config.num_examples=20

Defaults to the original multitask T5 checkpoints (t5-11b target, t5-small draft): they were trained on
a mixture that includes WMT EnDe ("translate English to German: ") and CNN/DM ("summarize: "), so they
run both tasks without fine-tuning. The paper used T5 v1.1 XXL fine-tuned per task; for that route
fine-tune with specjax.finetune (configs/finetune/) and pass the resulting directories via
--config.target=... --config.drafts=... . Needs a TPU VM / GPU with network (or a local HF cache);
on a CPU it would take days. Paper gamma for this pair: see the table (marked '*').
"""

from configs import common


def get_config(arg=None):
  a = common.parse_arg(arg, v11=False, smoke=False)
  c = common.base_config()
  c.name = 't5xxl_small'
  c.target = 'google/t5-v1_1-xxl' if a.v11 else 't5-11b'
  c.drafts = ('google/t5-v1_1-small' if a.v11 else 't5-small',)
  c.tasks = ('ende', 'cnndm')
  c.temperatures = (0.0, 1.0)
  c.gammas = (1, 2, 3, 5, 7, 10)
  c.num_examples = 100
  c.max_source_len = 512
  c.max_new_tokens = 128
  c.output_dir = 'results/t5xxl_small'
  c.mesh_shape = ()
  if a.smoke:
    c.gammas = (5,)
    c.num_examples = 2
    c.max_new_tokens = 16
    c.repeats = 1
  return c
