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
targets' token ids by frequency, for a truncated draft vocabulary; with head.freeze_trunk the
head.init_from's own). Parallel blocks (head.parallel_depth, specjax.models.head.parallel_step)
are trained on KL(p_{j+k-1} || q_k(j)) per depth k; with head.freeze_trunk alone.
"""

from __future__ import annotations

import dataclasses
import shutil
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
  """([(predicted features, logits)] of `unroll` passes, pass 1's state z [B, T, D]); pass 1
  reads the true f (plus noise), pass k > 1 the features pass k - 1 predicted."""
  f, _, ck, cv, mask = view
  prev = head_lib.shift_features(hparams, f)
  if noise_BxTxDf is not None:
    prev = prev + noise_BxTxDf.at[:, 0].set(0.0)  # the learned start feature stays clean
  outs, z1 = [], None
  for _ in range(unroll):
    z = head_lib.teacher_forced_state(hparams, hconfig, embed_VxDf, ck, cv, mask, dec_in_BxT,
                                      prev)
    z1 = z if z1 is None else z1
    feat, logits = head_lib.outputs(hparams, hconfig, z)
    outs.append((feat, logits))
    prev = head_lib.shift_features(hparams, feat)
  return outs, z1


def parallel_sums(hparams, hconfig: head_lib.HeadConfig, z_BxTxD, log_p_BxTxV, mask_BxT,
                  dec_in_BxT, embed_VxDf):
  """Per parallel depth k = 2 .. P + 1: sums over positions j (where j + k - 1 is a target
  position) of KL(p_{j+k-1} || q_k(j)), sum_x min(p, q) and argmax agreement, where q_k(j) is
  what the parallel mode drafts token k of a block from when the verified prefix ends at j
  (with parallel_tokens, after drafts 1 .. k - 1 equal to the training targets y_{j+1} ..)."""
  t = z_BxTxD.shape[1]
  s = z_BxTxD
  out = []
  for k in range(2, hconfig.parallel_depth + 2):
    # Draft k - 1 of the block at j is y_{j+k-1}, the decoder input at j + k - 1.
    prev_tok = jnp.pad(dec_in_BxT[:, k - 1:], ((0, 0), (0, k - 1)))
    s = head_lib.parallel_step(hparams, hconfig, s, z_BxTxD, k - 2, embed_VxDf[prev_tok])
    _, logits = head_lib.outputs(hparams, hconfig, s)
    log_p = log_p_BxTxV[:, k - 1:]  # q_k at j reads p at j + k - 1: shift p and the mask left
    m = mask_BxT[:, k - 1:]
    log_q = jax.nn.log_softmax(logits[:, :t - k + 1], -1)
    p = jnp.exp(log_p)
    kl = jnp.sum(p * (log_p - log_q), -1)
    top1 = (jnp.argmax(log_p, -1) == jnp.argmax(log_q, -1)).astype(jnp.float32)
    out.append({'kl': jnp.sum(kl * m), 'alpha': jnp.sum(theory.beta(p, jnp.exp(log_q)) * m),
                'top1': jnp.sum(top1 * m), 'n': jnp.sum(m)})
  return out


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


def batch_view(tparams, tconfig: t5.T5Config, batch, taps):
  """(decoder inputs, label mask, target_view) of a training batch."""
  labels = batch['labels']
  dec_in = t5.shift_right(labels, tconfig)
  mask = (labels != tconfig.pad_token_id).astype(jnp.float32)
  return dec_in, mask, target_view(tparams, tconfig, batch['inputs'], dec_in, taps)


def make_steps(spec: FinetuneSpec, hconfig, tconfig, optimizer):
  """(train_step(state, batch, tparams, trunk), eval_step(params, tparams, batch) -> sums).
  With head.freeze_trunk the state's params are the parallel blocks only and `trunk` the rest
  (fixed); otherwise `trunk` is {} and every param trains."""
  h = spec.head
  parts = 1 + len(h.feature_taps)
  unroll = 1 if h.freeze_trunk else h.unroll  # a frozen trunk's passes train nothing
  view_of = lambda tparams, batch: batch_view(tparams, tconfig, batch, h.feature_taps)  # noqa: E731

  def loss_fn(hparams, tparams, trunk, batch, key):
    params = {**trunk, **hparams}
    dec_in, mask, view = view_of(tparams, batch)
    f = view[0]
    rms = feature_rms(f, parts)
    noise = (h.feature_noise * rms * jax.random.uniform(key, f.shape, jnp.float32, -1.0, 1.0)
             if h.feature_noise and not h.freeze_trunk else None)
    outs, z = head_passes(params, hconfig, tparams['shared'], view, dec_in, unroll, noise)
    sums = [pass_sums(view, feat, logits, mask, parts) for feat, logits in outs]
    n = jnp.maximum(jnp.sum(mask), 1.0)
    weights = [h.unroll_decay ** k for k in range(len(sums))]
    total = 0.0 if h.freeze_trunk else sum(
        w * (h.feature_weight * s['feat'] + h.distribution_weight * s['kl'])
        for w, s in zip(weights, sums)) / sum(weights)
    par = (parallel_sums(params, hconfig, z, view[1], mask, dec_in, tparams['shared'])
           if h.parallel_depth else [])
    if par:  # each depth's KL, averaged over the depths
      total = total + h.distribution_weight * sum(s['kl'] for s in par) / len(par)
    return total / n, (total, sums, par, n)

  def train_step(state, batch, tparams, trunk):
    key = jax.random.fold_in(jax.random.PRNGKey(spec.seed + 3), state['step'])
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (_, (total, sums, par, n)), grads = grad_fn(state['params'], tparams, trunk, batch, key)
    updates, opt_state = optimizer.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    metrics = {'loss_sum': total, 'count': n, 'grad_norm': trainer.global_norm(grads),
               'alpha_sum': sums[0]['alpha'], 'top1_sum': sums[0]['top1'],
               f'alpha{len(sums)}_sum': sums[-1]['alpha'], 'feat_sum': sums[0]['feat'],
               'kl_sum': sums[0]['kl']}
    if par:  # per-depth sums over fewer positions than `count`: a log's trend, not alpha
      metrics.update({'alpha_d2_sum': par[0]['alpha'],
                      f'alpha_d{len(par) + 1}_sum': par[-1]['alpha']})
    return {'params': params, 'opt_state': opt_state, 'step': state['step'] + 1}, metrics

  def eval_step(params, tparams, batch):
    dec_in, mask, view = view_of(tparams, batch)
    outs, z = head_passes(params, hconfig, tparams['shared'], view, dec_in, h.unroll)
    first = pass_sums(view, *outs[0], mask, parts)
    last = pass_sums(view, *outs[-1], mask, parts)
    out = {'dev_alpha': first['alpha'], 'dev_top1': first['top1'],
           f'dev_alpha{h.unroll}': last['alpha'], f'dev_top1_{h.unroll}': last['top1'],
           'n': jnp.sum(mask)}
    par = (parallel_sums(params, hconfig, z, view[1], mask, dec_in, tparams['shared'])
           if h.parallel_depth else [])
    for k, s in enumerate(par, start=2):
      out.update({f'dev_alpha_d{k}': s['alpha'], f'dev_top1_d{k}': s['top1'], f'n_d{k}': s['n']})
    return out

  return jax.jit(train_step, donate_argnums=0), jax.jit(eval_step)


def head_start(spec: FinetuneSpec, target_config: t5.T5Config, key):
  """(HeadConfig, fresh_params() -> the params training starts from, trunk): a new head, or with
  head.init_from that head's params with new parallel blocks beside them; with
  head.freeze_trunk the fresh params are the parallel blocks alone and `trunk` the rest."""
  h = spec.head
  dtype = jnp.dtype(spec.model.param_dtype)
  arch = dict(parallel_depth=h.parallel_depth, parallel_ff=h.parallel_ff,
              parallel_tokens=h.parallel_tokens)
  if not h.init_from:
    hconfig = head_lib.HeadConfig.for_target(target_config, d_model=h.d_model,
                                             num_heads=h.num_heads, d_kv=h.d_kv, d_ff=h.d_ff,
                                             feature_taps=h.feature_taps, **arch)
    hconfig.check_target(target_config)  # taps beyond the target's layers: one line, now
    return hconfig, lambda: head_lib.init_head_params(hconfig, key, dtype), {}
  loaded, saved = head_lib.load_head(h.init_from, dtype=dtype)
  hconfig = dataclasses.replace(saved, **arch)
  hconfig.check_target(target_config)
  fresh = head_lib.init_head_params(hconfig, key, dtype)
  start = {k: loaded[k] if k in loaded and loaded[k].shape == v.shape else v
           for k, v in fresh.items()}
  if not h.freeze_trunk:
    return hconfig, lambda: start, {}
  par = ('par_in', 'par_out')
  return (hconfig, lambda: {k: start[k] for k in par},
          {k: v for k, v in start.items() if k not in par})


def train(spec: FinetuneSpec, mngr, log, t_start) -> dict[str, Any]:
  """Trains (or resumes) the head of `spec` for the frozen target spec.model.init_from."""
  h = spec.head
  mesh = None
  if jax.device_count() > 1:  # a large frozen target is sharded like a fine-tuned one
    from specjax.models import sharding as sharding_lib  # pylint: disable=import-outside-toplevel
    mesh = sharding_lib.make_mesh(spec.mesh_shape)
  target = load_t5(spec.model.init_from, dtype=jnp.dtype(spec.model.param_dtype), mesh=mesh)
  tokenizer = get_tokenizer(spec)
  hconfig, fresh, trunk = head_start(spec, target.config, jax.random.PRNGKey(spec.seed))
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
  init_fn = jax.jit(lambda p: {'params': p, 'opt_state': optimizer.init(p),
                               'step': jnp.zeros((), jnp.int32)})
  state = trainer.start(spec, mngr, log, batches, init_fn,
                        jax.eval_shape(init_fn, jax.eval_shape(fresh)), fresh)
  train_step, eval_step = make_steps(spec, hconfig, target.config, optimizer)
  tparams = target.params
  dev_metrics = None
  if dev is not None:
    dev_batches = Batches(Tokenized(dev.sources[:n_eval], dev.targets[:n_eval], []), spec.data,
                          0, train=False)

    def dev_metrics(params) -> dict[str, float]:
      sums = jax.device_get([eval_step({**trunk, **params}, tparams, b)
                             for b in dev_batches.eval_batches(spec.data.batch_size)])
      tot = {k: float(np.sum([s[k] for s in sums], dtype=np.float64)) for k in sums[0]}
      # A parallel depth's sums (…_d<k>) count its own positions, n_d<k>; the rest, n.
      return {k: v / max(tot['n_d' + k.rpartition('_d')[2] if '_d' in k else 'n'], 1.0)
              for k, v in tot.items() if k.startswith('dev_')}

  state, results = trainer.run_loop(spec, mngr, log, state,
                                    lambda s, b: train_step(s, b, tparams, trunk), batches,
                                    schedule, dev_metrics)
  results['train_wall_s'] = time.time() - t_start
  export = Path(spec.export_dir or Path(spec.workdir) / 'export')
  head_lib.save_head({**trunk, **state['params']}, hconfig, export,
                     dtype=jnp.dtype(spec.model.export_dtype))
  export_vocab(h, export, train_data.targets, hconfig.vocab_size)
  results['head_params'] = head_lib.param_count(hconfig)
  return trainer.finish(spec, export, results, log, t_start)


def export_vocab(h, export: Path, targets, vocab_size: int) -> None:
  """The token ranking a truncated draft vocabulary is cut from (FeatureHeadDraft vocab=V_d): a
  frozen trunk keeps its own (its output layer learned on those counts), else this run's."""
  start_vocab = Path(h.init_from or '.').expanduser() / head_lib.VOCAB_NAME
  if h.freeze_trunk and start_vocab.is_file():
    shutil.copyfile(start_vocab, export / head_lib.VOCAB_NAME)
  else:
    head_lib.save_vocab(export, *head_lib.token_order(targets, vocab_size),
                        f'target-side ids of the {len(targets)} training examples')
