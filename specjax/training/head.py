"""Training a feature head (specjax.models.head) for a frozen T5 target: EAGLE's recipe for T5.

  python -m specjax.finetune --config=configs/finetune/bible_head.py

Shape legend: B batch, S source length, T target length, Df the target's d_model, V vocab.

With `head.feature_taps` the head reads the outputs of those target decoder layers beside the
final state (EAGLE-3's multi-layer fusion; Di = Df (1 + #taps)), and `head.unroll_decay` < 1
weights pass k by decay^(k-1) (EAGLE-3's 0.8).

Data: the target's own greedy translations of the training sources (`data.train_examples` of
them, decoded once and cached like a distilled draft's targets) and, with
`head.include_references`, the references too. Per batch the frozen target runs teacher-forced
on (source, y) and hands back, at every decoder position j, its final hidden state f_j and its
next-token distribution p_j (T = 1). The head reads (f_{j-1}, y_j) and is trained on

  feature_weight * smooth-L1((f^_j - f_j) / rms(f))  +  distribution_weight * KL(p_j || q_j)

(EAGLE: regression onto the next feature plus the token distribution). Input features get
uniform noise of `feature_noise` x rms(f) (EAGLE's robustness to its own errors), and with
`unroll` = K > 1 the loss is averaged over K passes where pass k reads the features pass k - 1
predicted (the head drafts from its own predictions beyond the verified prefix; a training-time
rollout in the spirit of HASS / EAGLE-3). Dev metrics on the target's outputs of dev sources:
the mean of sum_x min(p, q) (alpha at T = 1, teacher forced) and the argmax agreement (alpha's
analogue at T = 0), for pass 1 (true features: the first draft of a block) and pass K.

The train state is {params, opt_state, step} of the head alone; checkpoints, the data position,
logs and metrics are the shared loop's (specjax.training.trainer.run_loop). Export: save_head's
head_config.json + head.safetensors in `export_dir`, and vocab.json (save_vocab: the training
targets' token ids by frequency, for a truncated draft vocabulary).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.decoding import theory
from specjax.models import head as head_lib
from specjax.models import t5
from specjax.models.checkpoints import load_t5
from specjax.training import trainer
from specjax.training.data import Batches, Tokenized, get_tokenizer, tokenize_split
from specjax.training.spec import FinetuneSpec


def target_view(tparams, tconfig: t5.T5Config, inputs_BxS, dec_in_BxT, taps=()):
  """What the frozen target hands the head, teacher-forced: (features f [B, T, Di]: the final
  state, then the tapped layers' outputs; log p [B, T, V] at T = 1, the last layer's cross K/V
  and the encoder mask)."""
  cache = t5.init_cache(tparams, tconfig, inputs_BxS, dec_in_BxT.shape[1])
  lengths = jnp.zeros((inputs_BxS.shape[0],), jnp.int32)
  f, _ = t5.decode_hidden(tparams, tconfig, cache, dec_in_BxT, lengths, taps=tuple(taps))
  log_p = jax.nn.log_softmax(t5.output_logits(tparams, tconfig, f[..., :tconfig.d_model]), -1)
  return (jax.lax.stop_gradient(f), jax.lax.stop_gradient(log_p), cache.cross_k[-1],
          cache.cross_v[-1], cache.enc_mask)


def head_passes(hparams, hconfig: head_lib.HeadConfig, embed_VxDf, view, dec_in_BxT,
                unroll: int, noise_BxTxDf=None):
  """[(predicted features, logits)] of `unroll` passes; pass 1 reads the true f (plus noise),
  pass k > 1 the features pass k - 1 predicted."""
  f, _, ck, cv, mask = view
  prev = head_lib.shift_features(hparams, f)
  if noise_BxTxDf is not None:
    prev = prev + noise_BxTxDf.at[:, 0].set(0.0)  # the learned start feature stays clean
  outs = []
  for _ in range(unroll):
    feat, logits = head_lib.teacher_forced(hparams, hconfig, embed_VxDf, ck, cv, mask, dec_in_BxT,
                                           prev)
    outs.append((feat, logits))
    prev = head_lib.shift_features(hparams, feat)
  return outs


def feature_rms(f_BxTxDi, parts: int):
  """Each fused part's RMS over the batch, repeated over its Df columns [Di]: the scale the
  feature error is measured in (a tapped residual stream is larger than the final state)."""
  f = f_BxTxDi.astype(jnp.float32)
  f = f.reshape(f.shape[:-1] + (parts, f.shape[-1] // parts))
  rms = jnp.sqrt(jnp.mean(jnp.square(f), axis=(0, 1, 3)) + 1e-12)
  return jnp.repeat(rms, f.shape[-1])


def pass_sums(view, feat, logits, mask_BxT, parts: int = 1):
  """Per-pass sums over masked positions: smooth-L1 feature error (each fused part in its own
  RMS), KL(p || q), sum_x min(p, q) and argmax agreement."""
  f, log_p = view[0], view[1]
  rms = feature_rms(f, parts)
  feat_err = jnp.mean(optax.huber_loss(feat.astype(jnp.float32) / rms,
                                       f.astype(jnp.float32) / rms), -1)
  log_q = jax.nn.log_softmax(logits, -1)
  p = jnp.exp(log_p)
  kl = jnp.sum(p * (log_p - log_q), -1)
  overlap = theory.beta(p, jnp.exp(log_q))
  top1 = (jnp.argmax(log_p, -1) == jnp.argmax(log_q, -1)).astype(jnp.float32)
  return {k: jnp.sum(v * mask_BxT) for k, v in
          (('feat', feat_err), ('kl', kl), ('alpha', overlap), ('top1', top1))}


def make_steps(spec: FinetuneSpec, hconfig, tconfig, optimizer):
  h = spec.head
  parts = 1 + len(h.feature_taps)

  def loss_fn(hparams, tparams, batch, key):
    labels = batch['labels']
    dec_in = t5.shift_right(labels, tconfig)
    mask = (labels != tconfig.pad_token_id).astype(jnp.float32)
    view = target_view(tparams, tconfig, batch['inputs'], dec_in, h.feature_taps)
    f = view[0]
    rms = feature_rms(f, parts)
    noise = (h.feature_noise * rms * jax.random.uniform(key, f.shape, jnp.float32, -1.0, 1.0)
             if h.feature_noise else None)
    outs = head_passes(hparams, hconfig, tparams['shared'], view, dec_in, h.unroll, noise)
    sums = [pass_sums(view, feat, logits, mask, parts) for feat, logits in outs]
    n = jnp.maximum(jnp.sum(mask), 1.0)
    weights = [h.unroll_decay ** k for k in range(len(sums))]
    total = sum(w * (h.feature_weight * s['feat'] + h.distribution_weight * s['kl'])
                for w, s in zip(weights, sums)) / sum(weights)
    return total / n, (total, sums, n)

  def train_step(state, batch, tparams):
    key = jax.random.fold_in(jax.random.PRNGKey(spec.seed + 3), state['step'])
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (_, (total, sums, n)), grads = grad_fn(state['params'], tparams, batch, key)
    updates, opt_state = optimizer.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    metrics = {'loss_sum': total, 'count': n, 'grad_norm': trainer.global_norm(grads),
               'alpha_sum': sums[0]['alpha'], 'top1_sum': sums[0]['top1'],
               f'alpha{len(sums)}_sum': sums[-1]['alpha'], 'feat_sum': sums[0]['feat'],
               'kl_sum': sums[0]['kl']}
    return {'params': params, 'opt_state': opt_state, 'step': state['step'] + 1}, metrics

  def eval_step(hparams, tparams, batch):
    labels = batch['labels']
    dec_in = t5.shift_right(labels, tconfig)
    mask = (labels != tconfig.pad_token_id).astype(jnp.float32)
    view = target_view(tparams, tconfig, batch['inputs'], dec_in, h.feature_taps)
    outs = head_passes(hparams, hconfig, tparams['shared'], view, dec_in, h.unroll)
    first = pass_sums(view, *outs[0], mask, parts)
    last = pass_sums(view, *outs[-1], mask, parts)
    return first['alpha'], first['top1'], last['alpha'], last['top1'], jnp.sum(mask)

  return jax.jit(train_step, donate_argnums=0), jax.jit(eval_step)


def train(spec: FinetuneSpec, mngr, log, t_start) -> dict[str, Any]:
  """Trains (or resumes) the head of `spec` for the frozen target spec.model.init_from."""
  h = spec.head
  mesh = None
  if jax.device_count() > 1:  # a large frozen target is sharded like a fine-tuned one
    from specjax.models import sharding as sharding_lib  # pylint: disable=import-outside-toplevel
    mesh = sharding_lib.make_mesh(spec.mesh_shape)
  target = load_t5(spec.model.init_from, dtype=jnp.dtype(spec.model.param_dtype), mesh=mesh)
  tokenizer = get_tokenizer(spec)
  hconfig = head_lib.HeadConfig.for_target(target.config, d_model=h.d_model,
                                           num_heads=h.num_heads, d_kv=h.d_kv, d_ff=h.d_ff,
                                           feature_taps=h.feature_taps)
  hconfig.check_target(target.config)  # taps beyond the target's layers: one line, now
  own = tokenize_split(spec, tokenizer, 'train', spec.data.train_examples, spec.model.init_from,
                       log)
  parts = [own]
  if h.include_references:
    parts.append(tokenize_split(spec, tokenizer, 'train', spec.data.train_examples, '', log))
  train_data = Tokenized([s for p in parts for s in p.sources],
                         [t for p in parts for t in p.targets], [])
  batches = Batches(train_data, spec.data, spec.seed)
  n_eval = spec.data.eval_examples
  dev = (tokenize_split(spec, tokenizer, 'dev', n_eval, spec.model.init_from, log)
         if n_eval else None)
  log(f'{spec.name}: head d_model {h.d_model}, {head_lib.param_count(hconfig):,} params, for '
      f'{spec.model.init_from}; {len(batches.kept)} training examples '
      f'({len(own.sources)} target outputs' +
      (f' + {len(parts[1].sources)} references)' if len(parts) > 1 else ')') +
      f', {batches.batches_per_epoch} batches of {spec.data.batch_size} per epoch')

  optimizer, schedule = trainer.make_optimizer(spec.optim, spec.steps)
  key = jax.random.PRNGKey(spec.seed)
  init_fn = jax.jit(lambda p: {'params': p, 'opt_state': optimizer.init(p),
                               'step': jnp.zeros((), jnp.int32)})
  fresh = lambda: head_lib.init_head_params(hconfig, key, jnp.dtype(spec.model.param_dtype))  # noqa: E731
  state = trainer.start(spec, mngr, log, batches, init_fn,
                        jax.eval_shape(init_fn, jax.eval_shape(fresh)), fresh)
  train_step, eval_step = make_steps(spec, hconfig, target.config, optimizer)
  tparams = target.params
  dev_metrics = None
  if dev is not None:
    dev_batches = Batches(Tokenized(dev.sources[:n_eval], dev.targets[:n_eval], []), spec.data,
                          0, train=False)

    def dev_metrics(params) -> dict[str, float]:
      sums = jax.device_get([eval_step(params, tparams, b)
                             for b in dev_batches.eval_batches(spec.data.batch_size)])
      tot = np.sum(np.asarray(sums, np.float64), axis=0)
      n = max(tot[4], 1.0)
      return {'dev_alpha': tot[0] / n, 'dev_top1': tot[1] / n,
              f'dev_alpha{h.unroll}': tot[2] / n, f'dev_top1_{h.unroll}': tot[3] / n}

  state, results = trainer.run_loop(spec, mngr, log, state,
                                    lambda s, b: train_step(s, b, tparams), batches, schedule,
                                    dev_metrics)
  results['train_wall_s'] = time.time() - t_start
  export = Path(spec.export_dir or Path(spec.workdir) / 'export')
  head_lib.save_head(state['params'], hconfig, export, dtype=jnp.dtype(spec.model.export_dtype))
  # The token ranking a truncated draft vocabulary is cut from (FeatureHeadDraft vocab=V_d).
  head_lib.save_vocab(export, *head_lib.token_order(train_data.targets, hconfig.vocab_size),
                      f'target-side ids of the {len(train_data.targets)} training examples')
  results['head_params'] = head_lib.param_count(hconfig)
  return trainer.finish(spec, export, results, log, t_start)
