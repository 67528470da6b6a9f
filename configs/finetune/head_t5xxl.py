"""A feature head for the paper's T5-XXL target on a TPU VM (EnDe by default, CNN/DM with
task=cnndm): the head drafts from the target's hidden states, no encoder of its own.

  python -m specjax.finetune --config=configs/finetune/head_t5xxl.py \
      --config.model.init_from=runs/wmt_ende_v11_xxl/export       # a fine-tuned XXL target
  python -m specjax.finetune --config=configs/finetune/head_t5xxl.py:task=cnndm
  python -m specjax.finetune --config=configs/finetune/head_t5xxl.py:smoke   # offline, tests

Default target google/t5-v1_1-xxl (fine-tune it first with configs/finetune/wmt_ende_v11.py:xxl
and pass the export). The XXL target (bfloat16, 22 GB) is sharded over the mesh's 'model' axis
and frozen; the head (d_model 1024, its own 32128-row output head: ~60M params, c ~ 0.01) trains
on the target's greedy outputs of 100k training sources plus the references, batch 128.
Then: `python -m specjax.run --config=configs/t5xxl_small.py:v11 --config.target=... \
--config.drafts="('head:runs/head_t5xxl_ende/export',)"`.
"""

from configs.finetune import common
from configs.finetune.bible_head import head_section

TASKS = {'ende': (32, 64, 96, 128), 'cnndm': (128, 256, 384, 512)}


def get_config(arg=None):
  a = common.parse_arg(arg, positional='task', task='ende', smoke=False)
  if a.task not in TASKS:
    raise ValueError(f'config argument task={a.task!r} unknown (known: {", ".join(TASKS)})')
  c = common.base_config()
  c.name = f'head_t5xxl_{a.task}'
  c.workdir = f'runs/head_t5xxl_{a.task}'
  c.model.init_from = 'google/t5-v1_1-xxl'
  c.model.param_dtype = 'bfloat16'
  c.model.export_dtype = 'bfloat16'
  c.head = head_section(d_model=1024, num_heads=16, d_kv=64, d_ff=2816)
  c.data.task = a.task
  c.data.tokenizer = ''                # the checkpoint's SentencePiece model
  c.data.source_buckets = TASKS[a.task]
  c.data.target_buckets = (32, 64, 96, 128)
  c.data.long_examples = 'truncate'
  c.data.batch_size = 128
  c.data.train_examples = 100_000
  c.data.eval_examples = 1000
  c.data.bleu_examples = 0
  c.optim.name = 'adafactor'
  c.optim.learning_rate = 1e-3
  c.optim.schedule = 'cosine'
  c.optim.warmup_steps = 500
  c.optim.b1 = 0.0
  c.steps = 20000
  c.log_every = 100
  c.eval_every = 2000
  c.checkpoint_every = 1000
  c.keep_checkpoints = 3
  c.bleu_batch_size = 128
  c.mesh_shape = (1, -1)               # the frozen target's params over the 'model' axis
  if a.smoke:
    common.apply_smoke(c, f'head_t5xxl_{a.task}')
    c.model.init_from = 'specjax/assets/tiny_pair/target'
    c.head = head_section(d_model=16, num_heads=2, d_kv=8, d_ff=32)
    c.data.train_examples = 64
  return c
