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
no dropout (specjax has none), batch 128, 128 source / 128 target tokens (longer ones truncated),
z-loss 1e-4. One host: small/base/large train data parallel on a v4-8 / v5e-8 in float32; xl and
xxl shard the params over the mesh's 'model' axis (mesh_shape (1, -1)) with bfloat16 params (xxl:
~22 GB of params plus as much for gradients; Adafactor's factored statistics are small), so xxl
wants 128 GB+ of accelerator memory in total. Single host only.
"""

from configs.finetune import common

SIZES = ('small', 'base', 'large', 'xl', 'xxl')


def get_config(arg=None):
  a = common.parse_arg(arg, size='small', smoke=False)
  if a.size not in SIZES:
    raise ValueError(f'config argument size={a.size!r} unknown (known: {", ".join(SIZES)})')
  c = common.base_config()
  c.name = f'wmt_ende_v11_{a.size}'
  c.workdir = f'runs/wmt_ende_v11_{a.size}'
  c.model.init_from = f'google/t5-v1_1-{a.size}'
  c.model.param_dtype = 'bfloat16' if a.size in ('xl', 'xxl') else 'float32'
  c.model.export_dtype = 'bfloat16'
  c.data.task = 'ende'  # specjax.data.load_task; it adds the prefix 'translate English to German: '
  c.data.tokenizer = ''  # the checkpoint's SentencePiece model
  c.data.source_buckets = (32, 64, 96, 128)
  c.data.target_buckets = (32, 64, 96, 128)
  c.data.long_examples = 'truncate'
  c.data.batch_size = 128
  c.data.eval_examples = 1000
  c.data.bleu_examples = 500
  c.optim.name = 'adafactor'
  c.optim.learning_rate = 1e-3
  c.optim.schedule = 'constant'
  c.optim.warmup_steps = 0
  c.optim.b1 = 0.0
  c.optim.clip_norm = 0.0  # Adafactor clips its updates itself
  c.optim.z_loss = 1e-4
  c.steps = 20000
  c.log_every = 100
  c.eval_every = 2000
  c.checkpoint_every = 1000
  c.keep_checkpoints = 3
  c.bleu_batch_size = 64
  c.mesh_shape = (1, -1) if a.size in ('xl', 'xxl') else (-1, 1)
  if a.smoke:
    common.apply_smoke(c, 'wmt_ende_v11')
    c.optim.clip_norm = 0.0
  return c
