"""On-policy distillation of a T5 draft (DistillSpec, Zhou et al., arXiv 2310.08461).

Shape legend: B batch, S source length, M sampled tokens, V vocab.

Sequence-level distillation (config.data.distill_from) trains the draft on the target's greedy
outputs: prefixes the draft itself rarely produces at T = 1. Here every step samples the draft's
own continuations of the batch's sources (at config.onpolicy.temperature, with the current
params), scores them with the frozen teacher and the draft teacher-forced, and minimises a
divergence between the two next-token distributions at every sampled position:

  tvd  total variation 1/2 sum_x |p(x) - q(x)| = 1 - sum_x min(p, q): exactly 1 - alpha at that
       prefix, the quantity speculative decoding pays for (DistillSpec's best for sampling)
  fkl  forward KL(p || q) = sum_x p log(p / q)

Gradients flow through q only; the sampled tokens are treated as data (as in DistillSpec). The
train state, checkpoints, data position and export are fine-tuning's (specjax.training.finetune,
on the shared loop of specjax.training.trainer): only the step differs. Dev metrics: on the teacher's own greedy outputs of dev sources (the
prefixes speculative decoding verifies), the mean of sum_x min(p, q) (alpha at T = 1, teacher
forced) and the argmax agreement (alpha's analogue at T = 0).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from specjax.decoding import loop as decoding
from specjax.decoding import theory
from specjax.models.checkpoints import load_t5
from specjax.models.t5 import T5Config, shift_right, teacher_forced_logits
from specjax.training import trainer
from specjax.training.spec import FinetuneSpec


def divergence(name: str, teacher_logits, student_logits):
  """Per position [B, T]: 'tvd' or 'fkl' between softmax(teacher) and softmax(student)."""
  log_p = jax.nn.log_softmax(teacher_logits.astype(jnp.float32), -1)
  log_q = jax.nn.log_softmax(student_logits.astype(jnp.float32), -1)
  if name == 'tvd':
    return 0.5 * jnp.sum(jnp.abs(jnp.exp(log_p) - jnp.exp(log_q)), -1)
  return jnp.sum(jnp.exp(log_p) * (log_p - log_q), -1)


def agreement_sums(teacher_logits, student_logits, mask_BxT):
  """(sum of sum_x min(p, q), sum of argmax agreement, count) over masked positions."""
  p = jax.nn.softmax(teacher_logits.astype(jnp.float32), -1)
  q = jax.nn.softmax(student_logits.astype(jnp.float32), -1)
  overlap = theory.beta(p, q)
  top1 = (jnp.argmax(teacher_logits, -1) == jnp.argmax(student_logits, -1)).astype(jnp.float32)
  return jnp.sum(overlap * mask_BxT), jnp.sum(top1 * mask_BxT), jnp.sum(mask_BxT)


def sample_prefixes(student_params, config: T5Config, inputs_BxS, key, temperature: float,
                    max_new_tokens: int, eos_id: int):
  """The draft's own continuations: (labels [B, M] with pad after each row's end, mask [B, M])."""
  from specjax.models.t5 import T5Model  # pylint: disable=import-outside-toplevel
  out = decoding.autoregressive_program(
      T5Model(params=jax.lax.stop_gradient(student_params), config=config), inputs_BxS, key,
      max_new_tokens=max_new_tokens, sampling=decoding.make_sampling(temperature),
      eos_id=eos_id)
  mask_BxM = jnp.arange(max_new_tokens)[None, :] < out.lengths[:, None]
  return jnp.where(mask_BxM, out.tokens, config.pad_token_id), mask_BxM.astype(jnp.float32)


def make_steps(spec: FinetuneSpec, config: T5Config, optimizer, state_shardings, batch_sharding,
               log=print):
  """(train_step(state, batch) -> state, metrics; eval_step(params, batch) -> sums): the
  on-policy step, with the frozen teacher's params bound as an argument (not a constant)."""
  o = spec.onpolicy
  teacher = load_t5(o.teacher, dtype=jnp.dtype(spec.model.param_dtype))
  if teacher.config.vocab_size != config.vocab_size:
    raise ValueError(f'config.onpolicy.teacher: vocabulary {teacher.config.vocab_size} != the '
                     f'draft\'s {config.vocab_size}')
  log(f'on-policy distillation ({o.divergence}) from {o.teacher}: draft samples at '
      f'T = {o.temperature}, {o.max_new_tokens} tokens')
  tconfig = teacher.config
  base_key = jax.random.PRNGKey(spec.seed + 2)

  def loss_fn(params, tparams, inputs, labels, mask):
    dec_in = shift_right(labels, config)
    t_logits = jax.lax.stop_gradient(teacher_forced_logits(tparams, tconfig, inputs, dec_in))
    s_logits = teacher_forced_logits(params, config, inputs, dec_in)
    per_pos = divergence(o.divergence, t_logits, s_logits)
    n = jnp.maximum(jnp.sum(mask), 1.0)
    overlap, top1, count = agreement_sums(t_logits, s_logits, mask)
    return jnp.sum(per_pos * mask) / n, (jnp.sum(per_pos * mask), overlap, top1, count)

  def train_step(state, batch, tparams):
    key = jax.random.fold_in(base_key, state['step'])
    labels, mask = sample_prefixes(state['params'], config, batch['inputs'], key,
                                   o.temperature, o.max_new_tokens, config.eos_token_id)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (_, (div_sum, overlap, top1, count)), grads = grad_fn(state['params'], tparams,
                                                          batch['inputs'], labels, mask)
    updates, opt_state = optimizer.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    grad_norm = trainer.global_norm(grads)
    metrics = {'loss_sum': div_sum, 'alpha_sum': overlap, 'top1_sum': top1, 'count': count,
               'grad_norm': grad_norm}
    return {'params': params, 'opt_state': opt_state, 'step': state['step'] + 1}, metrics

  def eval_step(params, tparams, batch):
    labels = batch['labels']
    mask = (labels != config.pad_token_id).astype(jnp.float32)
    dec_in = shift_right(labels, config)
    t_logits = teacher_forced_logits(tparams, tconfig, batch['inputs'], dec_in)
    s_logits = teacher_forced_logits(params, config, batch['inputs'], dec_in)
    return agreement_sums(t_logits, s_logits, mask)

  batch_in = {'inputs': batch_sharding, 'labels': batch_sharding}
  train = jax.jit(train_step, donate_argnums=0, in_shardings=(state_shardings, batch_in, None),
                  out_shardings=(state_shardings, None))
  evaluate = jax.jit(eval_step, in_shardings=(state_shardings['params'], None, batch_in))
  tparams = teacher.params
  return (lambda state, batch: train(state, batch, tparams),
          lambda params, batch: evaluate(params, tparams, batch))


def dev_metrics_fn(eval_step, dev_batches, batch_size: int):
  """params -> {'dev_alpha', 'dev_top1'} on the teacher's outputs of the dev sources."""
  def dev_metrics(params) -> dict[str, Any]:
    sums = jax.device_get([eval_step(params, b) for b in dev_batches.eval_batches(batch_size)])
    n = max(sum(float(s[2]) for s in sums), 1.0)
    return {'dev_alpha': sum(float(s[0]) for s in sums) / n,
            'dev_top1': sum(float(s[1]) for s in sums) / n}
  return dev_metrics
