"""Training and fine-tuning T5 models with optax, bucketed batches and orbax checkpoints.

  python -m specjax.finetune --config=configs/finetune/bible_target.py
  python -m specjax.finetune --config=configs/finetune/wmt_ende_v11.py:base --config.workdir=runs/x

`train(config)` is the library entry (a ConfigDict or a FinetuneSpec; notebooks call it too); `main`
only parses flags. Re-running the same command resumes from the newest checkpoint in
`workdir/checkpoints` and stops at the same total number of steps.

Flow: the ConfigDict becomes a frozen `FinetuneSpec` (validated in `finetune_spec`, one-line
`ConfigError`s naming the field) -> examples tokenised once (cached in `workdir/cache`; optionally
the targets replaced by a teacher's greedy outputs, i.e. sequence-level distillation) -> a model
from scratch (`init_params`) or from a Hugging Face checkpoint (`load_t5`) -> jit'd train steps
with donated state -> orbax `CheckpointManager` saves (params, opt_state, step and the data
position) -> dev loss every `eval_every` steps, BLEU on a dev subset at the end -> `save_t5`
export (atomic).

The config boundary lives in `specjax.training.spec`, the data pipeline (tokenisation cache,
bucketed resumable batches, greedy decoding for distillation and BLEU) in `specjax.training.data`,
the loop, optimiser, checkpoints and logs in `specjax.training.trainer`; this module holds the
model, the fine-tuning train step and the entry point, which hands a head run to
`specjax.training.head` and an on-policy run's step to `specjax.training.distill`.

Shape legend: B batch, S source length, T target length, V vocab.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.errors import ConfigError
from specjax.models import sharding as sharding_lib
from specjax.models.checkpoints import load_t5, save_t5
from specjax.models.t5 import (Dropout, T5Config, T5Model, init_params, shift_right,
                               teacher_forced_logits)
from specjax.training import distill, trainer
from specjax.training import head as head_training
from specjax.training.data import Batches, Tokenized, bleu, get_tokenizer, tokenize_split
from specjax.training.spec import FinetuneSpec, finetune_spec
from specjax.training.trainer import global_norm

__all__ = ['finetune_spec', 'FinetuneSpec', 'tokenize_split', 'train', 'main']

def build_model(spec: FinetuneSpec, tokenizer, key) -> T5Model:
  dtype = jnp.dtype(spec.model.param_dtype)
  if spec.model.init_from:
    with jax.default_device(jax.local_devices(backend='cpu')[0]):  # the host, then shard
      return load_t5(spec.model.init_from, dtype=dtype)
  config = scratch_config(spec, tokenizer)
  return T5Model(params=init_params(config, key, dtype), config=config)


def scratch_config(spec: FinetuneSpec, tokenizer) -> T5Config:
  c = spec.model.t5
  vocab = spec.model.vocab_size or len(tokenizer)
  if vocab < len(tokenizer):
    raise ConfigError(f'config.model.t5.vocab_size: {vocab} is smaller than the tokenizer '
                      f'({len(tokenizer)} tokens)')
  eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 1
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  return dataclasses.replace(c, vocab_size=vocab, eos_token_id=eos, pad_token_id=pad,
                             decoder_start_token_id=pad)


def loss_fn(params, config: T5Config, batch, label_smoothing=0.0, z_loss=0.0, dropout=None):
  """Teacher-forced token cross-entropy, mean over non-pad label tokens; (loss, (sum, count)).
  `dropout`: a t5.Dropout (training steps only)."""
  labels_BxT = batch['labels']
  logits_BxTxV = teacher_forced_logits(params, config, batch['inputs'],
                                       shift_right(labels_BxT, config), dropout)
  mask_BxT = (labels_BxT != config.pad_token_id).astype(jnp.float32)
  if label_smoothing:
    targets = optax.smooth_labels(jax.nn.one_hot(labels_BxT, logits_BxTxV.shape[-1]),
                                  label_smoothing)
    ce_BxT = optax.softmax_cross_entropy(logits_BxTxV, targets)
  else:
    ce_BxT = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, labels_BxT)
  total_BxT = ce_BxT
  if z_loss:
    total_BxT = ce_BxT + z_loss * jnp.square(jax.nn.logsumexp(logits_BxTxV, axis=-1))
  n = jnp.sum(mask_BxT)
  loss = jnp.sum(total_BxT * mask_BxT) / jnp.maximum(n, 1.0)
  return loss, (jnp.sum(ce_BxT * mask_BxT), n)


def make_steps(spec: FinetuneSpec, config: T5Config, optimizer, state_shardings, batch_sharding):
  """jit'd (train_step(state, batch) -> state, metrics; eval_step(params, batch) -> sums)."""
  o = spec.optim

  rate = spec.model.dropout_rate

  def train_step(state, batch):
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    # Dropout masks from (seed, step): a resumed run draws the masks an uninterrupted one would.
    dropout = (Dropout(jax.random.fold_in(jax.random.PRNGKey(spec.seed + 1), state['step']), rate)
               if rate else None)
    (loss, (ce_sum, n)), grads = grad_fn(state['params'], config, batch, o.label_smoothing,
                                         o.z_loss, dropout)
    updates, opt_state = optimizer.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    metrics = {'loss_sum': ce_sum, 'count': n, 'grad_norm': global_norm(grads)}
    return {'params': params, 'opt_state': opt_state, 'step': state['step'] + 1}, metrics

  def eval_step(params, batch):
    _, (ce_sum, n) = loss_fn(params, config, batch)
    return ce_sum, n

  batch_in = {'inputs': batch_sharding, 'labels': batch_sharding}
  train = jax.jit(train_step, donate_argnums=0, in_shardings=(state_shardings, batch_in),
                  out_shardings=(state_shardings, None))
  evaluate = jax.jit(eval_step, in_shardings=(state_shardings['params'], batch_in))
  return train, evaluate


# ----------------------------------------------------------------------------- the run


def _model_for_run(spec: FinetuneSpec, tokenizer, key, resuming: bool):
  """(model or None when a checkpoint will replace its params, config); the architecture is
  fixed by the first run in workdir/model_config.json, so resuming never re-reads `init_from`."""
  saved = Path(spec.workdir) / 'model_config.json'
  if resuming and saved.is_file():
    return None, T5Config.from_hf(json.loads(saved.read_text()))
  model = build_model(spec, tokenizer, key)
  trainer.write_json(saved, model.config.to_hf())
  return model, model.config


def train(cfg) -> dict[str, Any]:
  """Trains (or resumes) the run described by `cfg`; returns the final metrics and export path."""
  spec = finetune_spec(cfg)
  t_start = time.time()
  Path(spec.workdir).mkdir(parents=True, exist_ok=True)
  log = trainer.Log(spec.workdir)
  mngr = trainer.checkpoint_manager(spec)
  try:
    if spec.head is not None:  # a feature head for a frozen target: its own state and export
      return head_training.train(spec, mngr, log, t_start)
    return _train(spec, mngr, log, t_start)
  finally:
    mngr.close()  # waits for a save in flight, also when training failed
    log.close()


def _sharded_state(spec: FinetuneSpec, model, config, key, mngr, batches, log):
  """(train state, optimizer, schedule, state shardings, batch sharding): a new state, or the
  newest checkpoint's (and the data position) when there is one. The shardings come from the
  compiled init (nothing allocated)."""
  mesh = sharding_lib.make_mesh(spec.mesh_shape)
  optimizer, schedule = trainer.make_optimizer(spec.optim, spec.steps)
  abstract_params = jax.eval_shape(
      lambda: model.params if model is not None else
      init_params(config, key, jnp.dtype(spec.model.param_dtype)))
  p_shard = sharding_lib.param_shardings(abstract_params, config, mesh)
  init_fn = jax.jit(lambda p: {'params': p, 'opt_state': optimizer.init(p),
                               'step': jnp.zeros((), jnp.int32)}, in_shardings=(p_shard,))
  state_shardings = init_fn.lower(abstract_params).compile().output_shardings
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          jax.eval_shape(init_fn, abstract_params), state_shardings)
  state = trainer.start(spec, mngr, log, batches, init_fn, abstract,
                        lambda: jax.device_put(model.params, p_shard))
  return (state, optimizer, schedule, state_shardings,
          sharding_lib.batch_sharding(mesh, spec.data.batch_size))


def _steps(spec: FinetuneSpec, config, tokenizer, optimizer, shardings, dev_eval, log):
  """(train_step, dev_metrics): fine-tuning's, or on-policy distillation's (distill.py)."""
  n_eval = spec.data.eval_examples
  if spec.onpolicy is not None:  # the same state and export, another step (and dev metric)
    train_step, eval_step = distill.make_steps(spec, config, optimizer, *shardings, log)
    own = tokenize_split(spec, tokenizer, 'dev', n_eval, spec.onpolicy.teacher, log)
    dev_own = Batches(Tokenized(own.sources[:n_eval], own.targets[:n_eval], []), spec.data, 0,
                      train=False)
    return train_step, distill.dev_metrics_fn(eval_step, dev_own, spec.data.batch_size)
  train_step, eval_step = make_steps(spec, config, optimizer, *shardings)

  def dev_metrics(params) -> dict[str, float]:
    sums = jax.device_get([eval_step(params, b)
                           for b in dev_eval.eval_batches(spec.data.batch_size)])
    return {'dev_loss': float(sum(s for s, _ in sums) / max(sum(n for _, n in sums), 1.0))}
  return train_step, dev_metrics


def _train(spec: FinetuneSpec, mngr, log, t_start) -> dict[str, Any]:
  tokenizer = get_tokenizer(spec)
  key = jax.random.PRNGKey(spec.seed)
  model, config = _model_for_run(spec, tokenizer, key, resuming=mngr.latest_step() is not None)
  if config.vocab_size < len(tokenizer):
    raise ConfigError(f'config.data.tokenizer: {len(tokenizer)} tokens do not fit the model '
                      f'vocabulary ({config.vocab_size})')
  train_data = tokenize_split(spec, tokenizer, 'train', spec.data.train_examples,
                              spec.data.distill_from, log)
  dev_data = tokenize_split(spec, tokenizer, 'dev',
                            max(spec.data.eval_examples, spec.data.bleu_examples))
  batches = Batches(train_data, spec.data, spec.seed)
  n_eval = spec.data.eval_examples
  dev_eval = Batches(Tokenized(dev_data.sources[:n_eval], dev_data.targets[:n_eval], []),
                     spec.data, 0, train=False)
  log(f'{spec.name}: {len(batches.kept)}/{len(train_data.sources)} training examples fit the '
      f'buckets {list(zip(spec.data.source_buckets, spec.data.target_buckets))}; '
      f'{batches.batches_per_epoch} batches of {spec.data.batch_size} per epoch')
  state, optimizer, schedule, *shardings = _sharded_state(spec, model, config, key, mngr,
                                                          batches, log)
  del model
  trainer.write_json(Path(spec.workdir) / 'config.json',
                     json.loads(json.dumps(dataclasses.asdict(spec), default=str)))
  train_step, dev_metrics = _steps(spec, config, tokenizer, optimizer, shardings, dev_eval, log)
  state, results = trainer.run_loop(spec, mngr, log, state, train_step, batches, schedule,
                                    dev_metrics if n_eval else None)
  results['train_wall_s'] = time.time() - t_start
  return _export(spec, T5Model(params=state['params'], config=config), tokenizer, dev_data,
                 results, log, t_start)


def _export(spec: FinetuneSpec, model: T5Model, tokenizer, dev_data, results, log, t_start):
  """Dev BLEU, the Hugging Face export and results.json; returns the results."""
  if spec.data.bleu_examples:
    results['dev_bleu'], hyps = bleu(model, tokenizer, dev_data, spec.data,
                                     spec.data.bleu_examples, spec.bleu_batch_size, spec.progress)
    log(f'dev BLEU {results["dev_bleu"]:.2f} on {min(spec.data.bleu_examples, len(hyps))} '
        f'examples; e.g. {hyps[0]!r}')
  export = Path(spec.export_dir or Path(spec.workdir) / 'export')
  dtype = jnp.dtype(spec.model.export_dtype)
  host = jax.tree.map(lambda x: np.asarray(jax.device_get(x)).astype(dtype), model.params)
  save_t5(T5Model(params=host, config=model.config), export, tokenizer)
  return trainer.finish(spec, export, results, log, t_start)


# ----------------------------------------------------------------------------- entry point


def main(config) -> None:
  """Trains from a config (a ConfigDict of configs/finetune/*.py): `python -m specjax.finetune`."""
  from absl import logging  # pylint: disable=import-outside-toplevel
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  try:
    train(config)
  except ConfigError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
