"""Fine-tunes T5 v1.1 on CNN/DailyMail: the paper's CNNDM targets and drafts (Table 2).

  python -m specjax.finetune --config=configs/finetune/cnndm_v11.py:small       # draft
  python -m specjax.finetune --config=configs/finetune/cnndm_v11.py:base
  python -m specjax.finetune --config=configs/finetune/cnndm_v11.py:large
  python -m specjax.finetune --config=configs/finetune/cnndm_v11.py:xxl         # target
  python -m specjax.finetune --config=configs/finetune/cnndm_v11.py:smoke       # offline, seconds

For a TPU VM with network: google/t5-v1_1-<size> and CNN/DM 3.0.0 come from the Hugging Face hub at
run time (specjax.data.load_task('cnndm', split), which adds the prefix 'summarize: '). Recipe as
T5X fine-tuning: Adafactor, constant learning rate 1e-3, batch 128, articles truncated to 512
tokens, summaries to 128, z-loss 1e-4. Memory and mesh notes as in wmt_ende_v11.py. BLEU at the end
is only a sanity check here (CNN/DM is scored with ROUGE).
"""

from configs.finetune import common

SIZES = common.V11_SIZES


def get_config(arg=None):
  return common.v11_config(arg, name='cnndm_v11', task='cnndm', source_buckets=(128, 256, 384, 512),
                           bleu_examples=100, bleu_batch_size=32)
