"""Defaults of every fine-tuning config, each field documented once, here.

A config file in configs/finetune/ is one training run: `get_config(arg)` returns a ConfigDict,
any field can be overridden on the command line (`--config.steps=500
--config.optim.learning_rate=3e-4`), and `specjax.finetune.finetune_spec` validates it (one-line
errors naming the field) before anything is loaded. `smoke` (an arg of every config) swaps in a
tiny model, the shipped Bible corpus and a few steps, so the tests run every config's code path
offline in seconds.
"""

import ml_collections

from configs.common import parse_arg  # noqa: F401  (re-exported for the configs here)


def t5_v11(d_model, num_layers, num_decoder_layers, num_heads, d_kv, d_ff, vocab_size=0):
  """A T5 v1.1-style architecture (gated-GELU, untied head, unscaled logits) for training from
  scratch; vocab_size 0 = the tokenizer's size."""
  return ml_collections.ConfigDict(dict(
      vocab_size=vocab_size, d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=num_layers,
      num_decoder_layers=num_decoder_layers, num_heads=num_heads,
      relative_attention_num_buckets=32, relative_attention_max_distance=128, gated=True,
      tie_word_embeddings=False, scale_logits=False))


def base_config():
  c = ml_collections.ConfigDict()
  c.name = 'finetune'               # shown in logs and the progress bar
  c.workdir = 'runs/finetune'       # checkpoints/, cache/ (tokenised data), train.log,
                                    # metrics.jsonl, results.json; re-running the same command
                                    # resumes from here
  c.export_dir = ''                 # HF directory written at the end ('' = workdir/export)
  c.seed = 0                        # params init and the data order
  c.steps = 1000                    # total optimiser steps (a resumed run stops at the same total)

  c.model = ml_collections.ConfigDict()
  c.model.init_from = ''            # HF directory or hub id ('google/t5-v1_1-base'); '' = scratch
  c.model.t5 = t5_v11(256, 4, 4, 4, 64, 1024)  # architecture from scratch (unused with init_from)
  c.model.param_dtype = 'float32'   # params and optimiser state during training
  c.model.export_dtype = 'float32'  # safetensors dtype of the export ('bfloat16' halves the size)
  c.model.dropout_rate = 0.0        # T5's dropout while training (embeddings, FFN, sublayer and
                                    # stack outputs); several epochs on a small corpus want ~0.1

  c.data = ml_collections.ConfigDict()
  c.data.task = 'bible_en_es'       # shipped offline corpus, or a specjax.data.load_task name
                                    # ('ende', 'cnndm': Hugging Face datasets at run time, with
                                    # the task's T5 prefix already added)
  c.data.source_field = 'en'        # bible_en_es: record field read as the source ...
  c.data.target_field = 'es'        # ... and as the target
  c.data.prefix = ''                # prepended to every source (on top of load_task's prefix)
  c.data.tokenizer = 'bible'        # 'bible' (shipped SentencePiece), '' = init_from's, or a
                                    # directory / hub id
  c.data.source_buckets = (16, 32, 48, 64)   # padded source lengths; the last is the maximum
  c.data.target_buckets = (16, 32, 48, 64)   # padded target lengths, one per source bucket
  c.data.long_examples = 'drop'     # longer than the last bucket: 'drop' or 'truncate' (keeps EOS)
  c.data.batch_size = 32            # examples per step (divisible by the mesh's data axis)
  c.data.train_examples = 0         # a seeded random subset of N training examples (0 = all)
  c.data.eval_examples = 256        # dev examples for the periodic dev loss
  c.data.bleu_examples = 128        # dev examples decoded greedily for BLEU at the end (0 = skip)
  c.data.distill_from = ''          # teacher checkpoint: train on its greedy outputs instead of the
                                    # references (sequence-level distillation of a draft)
  c.data.cache_dir = ''             # tokenised data (and distilled targets) cache; '' =
                                    # workdir/cache. Runs sharing it decode a teacher once

  c.optim = ml_collections.ConfigDict()
  c.optim.name = 'adafactor'        # 'adafactor' (T5X's: factored second moments, update clipping,
                                    # steps relative to each param's RMS -- suits T5, whose
                                    # attention has no 1/sqrt(d_kv)) or 'adamw'
  c.optim.learning_rate = 1e-3      # peak learning rate (T5X: 1e-3 fine-tuning, 1e-2 from scratch)
  c.optim.schedule = 'constant'     # 'constant' | 'cosine' | 'linear' | 'rsqrt' (after the warmup)
  c.optim.warmup_steps = 0          # linear warmup from 0
  c.optim.end_lr_fraction = 0.1     # cosine / linear: final lr = learning_rate * end_lr_fraction
  c.optim.weight_decay = 0.0        # adamw: decoupled weight decay; adafactor: weight_decay_rate
  c.optim.b1 = 0.0                  # adamw beta1 (use 0.9); adafactor momentum (0 = none, as T5X)
  c.optim.b2 = 0.98                 # adamw beta2 (adafactor uses its own decay_rate 0.8)
  c.optim.clip_norm = 0.0           # global gradient-norm clipping (0 = off; adafactor clips its
                                    # updates itself)
  c.optim.label_smoothing = 0.0
  c.optim.z_loss = 0.0              # T5X's log(Z)^2 auxiliary loss weight (1e-4 there)

  c.log_every = 50                  # train-loss log lines (steps)
  c.eval_every = 500                # dev loss (steps; 0 = only at the end)
  c.checkpoint_every = 500          # orbax save interval (steps); a kill loses at most this many
  c.keep_checkpoints = 2            # newest checkpoints kept
  c.bleu_batch_size = 64            # rows per greedy-decoding batch (BLEU, distillation)
  c.mesh_shape = (-1, 1)            # (data, model) device mesh; (-1, 1) = data parallel
  c.progress = True                 # tqdm bar with loss and steps/s
  c.throttle_s = 0.0                # sleep per step; only tests that interrupt a run set it
  return c


def tiny_model():
  """The smoke-test architecture: trains in seconds, same code path."""
  return t5_v11(d_model=32, num_layers=1, num_decoder_layers=1, num_heads=2, d_kv=16, d_ff=64)


def apply_smoke(c, name):
  """Shrinks a config to a seconds-long offline run: tiny model from scratch, the Bible corpus,
  few steps, frequent checkpoints."""
  c.name = f'{name}_smoke'
  c.workdir = f'runs/{name}_smoke'
  c.export_dir = ''
  c.steps = 40
  c.model.init_from = ''
  c.model.t5 = tiny_model()
  c.model.param_dtype = 'float32'
  c.model.export_dtype = 'float32'
  c.data.task = 'bible_en_es'
  c.data.source_field, c.data.target_field = 'en', 'es'
  c.data.tokenizer = 'bible'
  c.data.source_buckets = (64,)
  c.data.target_buckets = (64,)
  c.data.long_examples = 'drop'
  c.data.batch_size = 8
  c.data.train_examples = 400
  c.data.eval_examples = 16
  c.data.bleu_examples = 8
  c.data.distill_from = ''
  c.optim.warmup_steps = 5
  c.log_every = 10
  c.eval_every = 20
  c.checkpoint_every = 10
  c.keep_checkpoints = 2
  c.bleu_batch_size = 8
  c.mesh_shape = (-1, 1)
  return c


V11_SIZES = ('small', 'base', 'large', 'xl', 'xxl')


def v11_config(arg, *, name: str, task: str, source_buckets, bleu_examples: int,
               bleu_batch_size: int):
  """The paper's route (Table 2): fine-tune google/t5-v1_1-<size> on a hub task with T5X's recipe
  -- Adafactor, constant learning rate 1e-3, batch 128, z-loss 1e-4, 20k steps; xl/xxl in
  bfloat16 with params sharded over the mesh's 'model' axis. `arg`: a size, and/or 'smoke'."""
  a = parse_arg(arg, positional='size', size='small', smoke=False)
  if a.size not in V11_SIZES:
    raise ValueError(f'config argument size={a.size!r} unknown (known: {", ".join(V11_SIZES)})')
  big = a.size in ('xl', 'xxl')
  c = base_config()
  c.name = f'{name}_{a.size}'
  c.workdir = f'runs/{name}_{a.size}'
  c.model.init_from = f'google/t5-v1_1-{a.size}'
  c.model.param_dtype = 'bfloat16' if big else 'float32'
  c.model.export_dtype = 'bfloat16'
  c.data.task = task                # specjax.data.load_task adds the task's T5 prefix
  c.data.tokenizer = ''             # the checkpoint's SentencePiece model
  c.data.source_buckets = tuple(source_buckets)
  c.data.target_buckets = (32, 64, 96, 128)
  c.data.long_examples = 'truncate'
  c.data.batch_size = 128
  c.data.eval_examples = 1000
  c.data.bleu_examples = bleu_examples
  c.optim.name = 'adafactor'
  c.optim.learning_rate = 1e-3
  c.optim.schedule = 'constant'
  c.optim.warmup_steps = 0
  c.optim.b1 = 0.0
  c.optim.clip_norm = 0.0           # Adafactor clips its updates itself
  c.optim.z_loss = 1e-4
  c.steps = 20000
  c.log_every = 100
  c.eval_every = 2000
  c.checkpoint_every = 1000
  c.keep_checkpoints = 3
  c.bleu_batch_size = bleu_batch_size
  c.mesh_shape = (1, -1) if big else (-1, 1)
  if a.smoke:
    apply_smoke(c, name)
    c.optim.clip_norm = 0.0
  return c
