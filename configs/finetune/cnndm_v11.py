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

SIZES = ('small', 'base', 'large', 'xl', 'xxl')


def get_config(arg=None):
  a = common.parse_arg(arg, size='small', smoke=False)
  if a.size not in SIZES:
    raise ValueError(f'config argument size={a.size!r} unknown (known: {", ".join(SIZES)})')
  c = common.base_config()
  c.name = f'cnndm_v11_{a.size}'
  c.workdir = f'runs/cnndm_v11_{a.size}'
  c.model.init_from = f'google/t5-v1_1-{a.size}'
  c.model.param_dtype = 'bfloat16' if a.size in ('xl', 'xxl') else 'float32'
  c.model.export_dtype = 'bfloat16'
  c.data.task = 'cnndm'  # specjax.data.load_task; it adds the prefix 'summarize: '
  c.data.tokenizer = ''
  c.data.source_buckets = (128, 256, 384, 512)
  c.data.target_buckets = (32, 64, 96, 128)
  c.data.long_examples = 'truncate'
  c.data.batch_size = 128
  c.data.eval_examples = 1000
  c.data.bleu_examples = 100
  c.optim.name = 'adafactor'
  c.optim.learning_rate = 1e-3
  c.optim.schedule = 'constant'
  c.optim.warmup_steps = 0
  c.optim.b1 = 0.0
  c.optim.clip_norm = 0.0
  c.optim.z_loss = 1e-4
  c.steps = 20000
  c.log_every = 100
  c.eval_every = 2000
  c.checkpoint_every = 1000
  c.keep_checkpoints = 3
  c.bleu_batch_size = 32
  c.mesh_shape = (1, -1) if a.size in ('xl', 'xxl') else (-1, 1)
  if a.smoke:
    common.apply_smoke(c, 'cnndm_v11')
    c.optim.clip_norm = 0.0
  return c
