"""Fine-tunes T5 v1.1 on WMT EN->DE: the paper's EnDe targets and drafts (Table 2).

  python -m specjax.finetune --config=configs/finetune/wmt_ende_v11.py:small     # draft
  python -m specjax.finetune --config=configs/finetune/wmt_ende_v11.py:base
  python -m specjax.finetune --config=configs/finetune/wmt_ende_v11.py:large
  python -m specjax.finetune --config=configs/finetune/wmt_ende_v11.py:xxl       # target
  python -m specjax.finetune --config=configs/finetune/wmt_ende_v11.py:smoke     # offline, seconds

Then pass the exports to the experiment: `python -m specjax.run --config=configs/t5xxl_small.py:v11
--config.target=runs/wmt_ende_v11_xxl/export --config.drafts=runs/wmt_ende_v11_small/export`.

For a TPU VM with network: the v1.1 checkpoints google/t5-v1_1-<size> and WMT14 de-en come from the
Hugging Face hub at run time (specjax.data.load_task('ende', split), which adds T5's prefix
'translate English to German: '). Recipe as T5X fine-tuning: Adafactor, constant learning rate 1e-3,
no dropout (dropout_rate 0), batch 128, 128 source / 128 target tokens (longer ones truncated),
z-loss 1e-4. One host: small/base/large train data parallel on a v4-8 / v5e-8 in float32; xl and
xxl shard the params over the mesh's 'model' axis (mesh_shape (1, -1)) with bfloat16 params (xxl:
~22 GB of params plus as much for gradients; Adafactor's factored statistics are small), so xxl
wants 128 GB+ of accelerator memory in total. Single host only.
"""

from configs.finetune import common

SIZES = common.V11_SIZES


def get_config(arg=None):
  return common.v11_config(arg, name='wmt_ende_v11', task='ende', source_buckets=(32, 64, 96, 128),
                           bleu_examples=500, bleu_batch_size=64)
