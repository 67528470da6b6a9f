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
bucketed resumable batches, greedy decoding for distillation and BLEU) in `specjax.training.data`;
this module holds the model, the optimiser, the train step, checkpoints and the loop.

Shape legend: B batch, S source length, T target length, V vocab.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.models import sharding as sharding_lib
from specjax.models.checkpoints import load_t5, save_t5
from specjax.errors import ConfigError
from specjax.training.data import (Batches, Tokenized, bleu, get_tokenizer,
                                   progress_bar, tokenize_split)
from specjax.training.spec import FinetuneSpec, OptimSpec, finetune_spec
from specjax.models.t5 import (Dropout, T5Config, T5Model, init_params, shift_right,
                               teacher_forced_logits)

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


def make_schedule(o: OptimSpec, steps: int):
  lr, warm = o.learning_rate, o.warmup_steps
  if o.schedule == 'constant':
    main = optax.constant_schedule(lr)
  elif o.schedule == 'cosine':
    main = optax.cosine_decay_schedule(lr, max(steps - warm, 1), alpha=o.end_lr_fraction)
  elif o.schedule == 'linear':
    main = optax.linear_schedule(lr, lr * o.end_lr_fraction, max(steps - warm, 1))
  else:  # rsqrt (T5X pre-training): lr * sqrt(warmup / step) after the warmup
    w = max(warm, 1)
    return lambda step: lr * jnp.minimum(1.0, (step + 1) / w) * jax.lax.rsqrt(
        jnp.maximum(step + 1.0, w) / w)
  if warm == 0:
    return main
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warm), main], [warm])


def make_optimizer(o: OptimSpec, steps: int):
  schedule = make_schedule(o, steps)
  if o.name == 'adafactor':  # as T5X: factored second moments, update clipping, param-scaled lr
    opt = optax.adafactor(learning_rate=schedule, momentum=o.b1 or None,
                          weight_decay_rate=o.weight_decay or None)
  else:
    opt = optax.adamw(schedule, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay)
  if o.clip_norm > 0:
    opt = optax.chain(optax.clip_by_global_norm(o.clip_norm), opt)
  return opt, schedule


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


def global_norm(tree):
  """sqrt of the sum of squares of every leaf, in float32 (the logged gradient norm)."""
  return jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(tree)))


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


# ----------------------------------------------------------------------------- checkpoints


def checkpoint_manager(spec: FinetuneSpec):
  import orbax.checkpoint as ocp
  options = ocp.CheckpointManagerOptions(save_interval_steps=spec.checkpoint_every,
                                         max_to_keep=spec.keep_checkpoints, create=True)
  return ocp.CheckpointManager(os.path.abspath(os.path.join(spec.workdir, 'checkpoints')),
                               options=options, item_names=('state', 'data'))


def _save(mngr, step: int, state, data_state, force=False) -> bool:
  import orbax.checkpoint as ocp
  return mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                 data=ocp.args.JsonSave(data_state)), force=force)


def restore_checkpoint(mngr, step: int, abstract_state):
  import orbax.checkpoint as ocp
  out = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                                   data=ocp.args.JsonRestore()))
  return out['state'], out['data']


# ----------------------------------------------------------------------------- the loop


class _Log:
  """Lines to stdout (above the progress bar) and to workdir/train.log."""

  def __init__(self, workdir: str):
    self.file = open(os.path.join(workdir, 'train.log'), 'a', buffering=1)

  def __call__(self, msg: str):
    from tqdm import tqdm
    tqdm.write(msg, file=sys.stdout)
    sys.stdout.flush()
    self.file.write(f'{time.strftime("%H:%M:%S")} {msg}\n')

  def close(self):
    self.file.close()


def write_json(path: Path, obj):
  tmp = path.with_name(path.name + f'.tmp{os.getpid()}')
  tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
  os.replace(tmp, path)


def _model_for_run(spec: FinetuneSpec, tokenizer, key, resuming: bool):
  """(model or None when a checkpoint will replace its params, config); the architecture is
  fixed by the first run in workdir/model_config.json, so resuming never re-reads `init_from`."""
  saved = Path(spec.workdir) / 'model_config.json'
  if resuming and saved.is_file():
    return None, T5Config.from_hf(json.loads(saved.read_text()))
  model = build_model(spec, tokenizer, key)
  write_json(saved, model.config.to_hf())
  return model, model.config


def run_loop(spec: FinetuneSpec, mngr, log, state, train_step, batches, schedule,
             dev_metrics=None) -> tuple[Any, dict[str, Any]]:
  """The step loop every objective shares (fine-tuning, feature heads, on-policy distillation).

  train_step(state, batch) -> (state, metrics): metrics hold `count` and `<name>_sum` entries
  (logged as means over count: `loss_sum` as `train_loss`, others as `train_<name>`) and
  optionally `grad_norm`. dev_metrics(params) -> {name: float}, every eval_every steps and at the
  end. Checkpoints every checkpoint_every steps (params, opt_state, step and the data position
  `batches.state()`), and once more at the end. Returns (state, {'name', 'steps', dev metrics}).
  """
  workdir = Path(spec.workdir)
  step = int(state['step'])
  bar = progress_bar(spec.steps, spec.name, spec.progress, initial=step)
  window, t_window = [], time.time()
  with open(workdir / 'metrics.jsonl', 'a', buffering=1) as metrics_file:
    while step < spec.steps:
      state, metrics = train_step(state, next(batches))
      step += 1
      window.append(metrics)
      if spec.throttle_s:
        time.sleep(spec.throttle_s)
      bar.update(1)
      if step % spec.log_every == 0 or step == spec.steps:
        m = jax.device_get(window)
        count = max(float(sum(x['count'] for x in m)), 1.0)
        means = {k[:-4]: float(sum(x[k] for x in m)) / count for k in m[0] if k.endswith('_sum')}
        rate = len(window) / max(time.time() - t_window, 1e-9)
        loss = means.pop('loss')
        bar.set_postfix(loss=f'{loss:.3f}', steps_s=f'{rate:.2f}')
        extra = ''.join(f' {k} {v:.4f}' for k, v in means.items())
        grad = f' grad_norm {float(m[-1]["grad_norm"]):.2f}' if 'grad_norm' in m[-1] else ''
        log(f'step {step} loss {loss:.4f}{extra} lr {float(schedule(step)):.2e}{grad} '
            f'{rate:.2f} steps/s')
        metrics_file.write(json.dumps({'step': step, 'train_loss': loss, 'steps_per_s': rate,
                                       **{f'train_{k}': v for k, v in means.items()}}) + '\n')
        window, t_window = [], time.time()
      if dev_metrics and spec.eval_every and step % spec.eval_every == 0 and step < spec.steps:
        dev = dev_metrics(state['params'])
        log(f'step {step} ' + ' '.join(f'{k} {v:.4f}' for k, v in dev.items()))
        metrics_file.write(json.dumps({'step': step, **dev}) + '\n')
      if step % spec.checkpoint_every == 0 and _save(mngr, step, state, batches.state()):
        log(f'step {step} checkpoint saving')
    bar.close()
    if mngr.latest_step() != step:
      _save(mngr, step, state, batches.state(), force=True)
    mngr.wait_until_finished()
    results: dict[str, Any] = {'name': spec.name, 'steps': step}
    if dev_metrics:
      dev = dev_metrics(state['params'])
      results.update(dev)
      log(f'step {step} final ' + ' '.join(f'{k} {v:.4f}' for k, v in dev.items()))
      metrics_file.write(json.dumps({'step': step, **dev}) + '\n')
  return state, results


def train(cfg) -> dict[str, Any]:
  """Trains (or resumes) the run described by `cfg`; returns the final metrics and export path."""
  spec = finetune_spec(cfg)
  t_start = time.time()
  Path(spec.workdir).mkdir(parents=True, exist_ok=True)
  log = _Log(spec.workdir)
  mngr = checkpoint_manager(spec)
  try:
    if spec.head is not None:  # a feature head for a frozen target: its own state and export
      from specjax.training import head as head_training  # pylint: disable=import-outside-toplevel
      return head_training.train(spec, mngr, log, t_start)
    return _train(spec, mngr, log, t_start)
  finally:
    mngr.close()  # waits for a save in flight, also when training failed
    log.close()


def _train(spec: FinetuneSpec, mngr, log, t_start) -> dict[str, Any]:
  workdir = Path(spec.workdir)
  tokenizer = get_tokenizer(spec)
  key = jax.random.PRNGKey(spec.seed)
  latest = mngr.latest_step()
  model, config = _model_for_run(spec, tokenizer, key, resuming=latest is not None)
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

  # Shardings of the whole train state, from the compiled init (nothing allocated).
  mesh = sharding_lib.make_mesh(spec.mesh_shape)
  optimizer, schedule = make_optimizer(spec.optim, spec.steps)
  abstract_params = jax.eval_shape(
      lambda: model.params if model is not None else
      init_params(config, key, jnp.dtype(spec.model.param_dtype)))
  p_shard = sharding_lib.param_shardings(abstract_params, config, mesh)
  init_fn = jax.jit(lambda p: {'params': p, 'opt_state': optimizer.init(p),
                               'step': jnp.zeros((), jnp.int32)}, in_shardings=(p_shard,))
  state_shardings = init_fn.lower(abstract_params).compile().output_shardings
  batch_sharding = sharding_lib.batch_sharding(mesh, spec.data.batch_size)

  if latest is not None:
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            jax.eval_shape(init_fn, abstract_params), state_shardings)
    state, data_state = restore_checkpoint(mngr, latest, abstract)
    batches.restore(data_state)
    log(f'resumed from checkpoint step {int(state["step"])} (epoch {batches.epoch}, '
        f'batch {batches.position})')
  else:
    state = init_fn(jax.device_put(model.params, p_shard))
    log(f'{spec.name}: new run, {sum(x.size for x in jax.tree.leaves(state["params"])):,} params')
  del model
  write_json(workdir / 'config.json',
              json.loads(json.dumps(dataclasses.asdict(spec), default=str)))
  if spec.onpolicy is not None:  # the same state and export, another step (and dev metric)
    from specjax.training import distill  # pylint: disable=import-outside-toplevel
    train_step, eval_step = distill.make_steps(spec, config, optimizer, state_shardings,
                                               batch_sharding, log)
    own = tokenize_split(spec, tokenizer, 'dev', n_eval, spec.onpolicy.teacher, log)
    dev_own = Batches(Tokenized(own.sources[:n_eval], own.targets[:n_eval], []), spec.data, 0,
                      train=False)
    dev_metrics = distill.dev_metrics_fn(eval_step, dev_own, spec.data.batch_size)
  else:
    train_step, eval_step = make_steps(spec, config, optimizer, state_shardings, batch_sharding)

    def dev_metrics(params) -> dict[str, float]:
      sums = [eval_step(params, b) for b in dev_eval.eval_batches(spec.data.batch_size)]
      sums = jax.device_get(sums)
      return {'dev_loss': float(sum(s for s, _ in sums) / max(sum(n for _, n in sums), 1.0))}

  state, results = run_loop(spec, mngr, log, state, train_step, batches, schedule,
                            dev_metrics if n_eval else None)
  results['train_wall_s'] = time.time() - t_start
  model = T5Model(params=state['params'], config=config)
  if spec.data.bleu_examples:
    results['dev_bleu'], hyps = bleu(model, tokenizer, dev_data, spec.data,
                                     spec.data.bleu_examples, spec.bleu_batch_size, spec.progress)
    log(f'dev BLEU {results["dev_bleu"]:.2f} on {min(spec.data.bleu_examples, len(hyps))} '
        f'examples; e.g. {hyps[0]!r}')
  export = Path(spec.export_dir or workdir / 'export')
  dtype = jnp.dtype(spec.model.export_dtype)
  host = jax.tree.map(lambda x: np.asarray(jax.device_get(x)).astype(dtype), state['params'])
  save_t5(T5Model(params=host, config=config), export, tokenizer)
  results['export_dir'] = str(export)
  results['wall_s'] = time.time() - t_start
  log(f'exported {export} ({sum(f.stat().st_size for f in export.iterdir()) / 1e6:.1f} MB); '
      f'done in {results["wall_s"]:.0f}s')
  write_json(workdir / 'results.json', results)
  return results


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
