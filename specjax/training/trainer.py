"""The training loop every objective shares: optimiser, checkpoints (resume), logging, the steps.

Shape legend: none (the loop only moves pytrees and metric sums).

Three objectives run on it: fine-tuning a T5 (specjax.training.finetune), a feature head for a
frozen target (specjax.training.head) and on-policy distillation of a draft
(specjax.training.distill). Each builds its own train state {params, opt_state, step}, a
`train_step(state, batch) -> (state, metrics)` and optionally dev metrics; `run_loop` does the
rest: steps until `spec.steps`, logs (stdout above the progress bar, workdir/train.log,
workdir/metrics.jsonl), dev metrics every eval_every steps, orbax checkpoints of the state and
the data position every checkpoint_every steps and at the end. Re-running the same command
resumes from the newest checkpoint (`restore_checkpoint`) and stops at the same total steps.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

from specjax.training.data import progress_bar
from specjax.training.spec import FinetuneSpec, OptimSpec


def make_schedule(o: OptimSpec, steps: int):
  """The learning rate per step: warmup, then constant / cosine / linear / rsqrt."""
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
  """(optax optimizer, schedule) of the run's OptimSpec (Adafactor as T5X, or AdamW)."""
  schedule = make_schedule(o, steps)
  if o.name == 'adafactor':  # as T5X: factored second moments, update clipping, param-scaled lr
    opt = optax.adafactor(learning_rate=schedule, momentum=o.b1 or None,
                          weight_decay_rate=o.weight_decay or None)
  else:
    opt = optax.adamw(schedule, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay)
  if o.clip_norm > 0:
    opt = optax.chain(optax.clip_by_global_norm(o.clip_norm), opt)
  return opt, schedule


def global_norm(tree):
  """sqrt of the sum of squares of every leaf, in float32 (the logged gradient norm)."""
  return jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(tree)))



# ----------------------------------------------------------------------------- checkpoints


def checkpoint_manager(spec: FinetuneSpec):
  """Orbax manager of workdir/checkpoints: the state and the data position, keep-N."""
  import orbax.checkpoint as ocp
  options = ocp.CheckpointManagerOptions(save_interval_steps=spec.checkpoint_every,
                                         max_to_keep=spec.keep_checkpoints, create=True)
  return ocp.CheckpointManager(os.path.abspath(os.path.join(spec.workdir, 'checkpoints')),
                               options=options, item_names=('state', 'data'))


def save_checkpoint(mngr, step: int, state, data_state, force=False) -> bool:
  """Saves (state, data position) at `step` when due (always with `force`)."""
  import orbax.checkpoint as ocp
  return mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                 data=ocp.args.JsonSave(data_state)), force=force)


def restore_checkpoint(mngr, step: int, abstract_state):
  """(state, data position) of checkpoint `step`, laid out like `abstract_state`."""
  import orbax.checkpoint as ocp
  out = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                                   data=ocp.args.JsonRestore()))
  return out['state'], out['data']


# ----------------------------------------------------------------------------- logs and the loop


class Log:
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
  """obj as JSON at path, atomically (a killed run never leaves half a file)."""
  tmp = path.with_name(path.name + f'.tmp{os.getpid()}')
  tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
  os.replace(tmp, path)


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
      if step % spec.checkpoint_every == 0 and save_checkpoint(mngr, step, state, batches.state()):
        log(f'step {step} checkpoint saving')
    bar.close()
    if mngr.latest_step() != step:
      save_checkpoint(mngr, step, state, batches.state(), force=True)
    mngr.wait_until_finished()
    results: dict[str, Any] = {'name': spec.name, 'steps': step}
    if dev_metrics:
      dev = dev_metrics(state['params'])
      results.update(dev)
      log(f'step {step} final ' + ' '.join(f'{k} {v:.4f}' for k, v in dev.items()))
      metrics_file.write(json.dumps({'step': step, **dev}) + '\n')
  return state, results


def start(spec: FinetuneSpec, mngr, log, batches, init_fn, abstract_state, fresh_params):
  """The train state to begin with: the newest checkpoint's, with its data position restored
  into `batches`, when the workdir has one (re-running a command resumes); else
  init_fn(fresh_params()) for a new run."""
  latest = mngr.latest_step()
  if latest is None:
    state = init_fn(fresh_params())
    log(f'{spec.name}: new run, {sum(x.size for x in jax.tree.leaves(state["params"])):,} params')
    return state
  state, data_state = restore_checkpoint(mngr, latest, abstract_state)
  batches.restore(data_state)
  log(f'resumed from checkpoint step {int(state["step"])} (epoch {batches.epoch}, '
      f'batch {batches.position})')
  return state


def finish(spec: FinetuneSpec, export: Path, results: dict[str, Any], log, t_start) -> dict:
  """results with the export directory and the wall time, logged and written to results.json."""
  results['export_dir'] = str(export)
  results['wall_s'] = time.time() - t_start
  log(f'exported {export} ({sum(f.stat().st_size for f in export.iterdir()) / 1e6:.2f} MB); '
      f'done in {results["wall_s"]:.0f}s')
  write_json(Path(spec.workdir) / 'results.json', results)
  return results
