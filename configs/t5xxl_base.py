"""Paper Table 2 rows: T5-XXL target, T5-base draft, WMT EnDe and CNN/DM, temperatures 0 and 1.

  python -m specjax.run --config=configs/t5xxl_base.py
  python -m specjax.run --config=configs/t5xxl_base.py:v11      # T5 v1.1 checkpoints instead
  python -m specjax.run --config=configs/t5xxl_base.py --config.tasks=ende --config.num_examples=20

Defaults to the original multitask T5 checkpoints (t5-11b target, t5-base draft): they were trained on
a mixture that includes WMT EnDe ("translate English to German: ") and CNN/DM ("summarize: "), so they
run both tasks without fine-tuning. The paper used T5 v1.1 XXL fine-tuned per task; for that route
fine-tune with specjax.finetune (configs/finetune/) and pass the resulting directories via
--config.target=... --config.drafts=... . Needs a TPU VM / GPU with network (or a local HF cache);
on a CPU it would take days. Paper gamma for this pair: see the table (marked '*').
"""

from configs import common


def get_config(arg=None):
  return common.t5xxl_config(arg, draft_size='base', smoke_gamma=5)
