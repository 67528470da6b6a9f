"""The oracle bound of bench_adaptive: logged betas and the best proposal length per iteration.

Shapes: I logged iterations (all rows'), G the logged width, R rows of one teacher-forced pass,
S source, W decoder width, V vocab.

  logged_betas     an untimed, traced fixed-G run, then one teacher-forced pass of each model
                   over [start, committed prefix, the iteration's G drafts]: beta_i =
                   sum_x min(p_i, q_i) per drafted position (q and p processed as the loop does;
                   the 0/1 match of the argmaxes at T = 0). The compiled loop is not touched. A
                   draft that is no T5 model (the feature head, whose q depends on the features it
                   predicted along its own rollout): the betas the loop's verifier computed for
                   every drafted position of the block (`trace_beta`, the same sum_x min(p, q)
                   with the q each token was drawn from), at any temperature.
  iteration_costs  cost of proposing k = 0..G drafts: the cheapest measured block of >= k + 1
                   tokens + k c, in 1-token target steps.
  add_oracle       theory.oracle_lengths on those, as a row of bench_adaptive's table, and each
                   token rule's share of the oracle's gain over the best fixed gamma.

Why the oracle bounds exact stop rules: experiments/bench_adaptive.py's docstring.
"""

from __future__ import annotations

import functools


def logged_betas(target, draft, prompts_NxS, *, batch, temperature, gamma, max_new_tokens,
                 rows_per_pass=8):
  """beta_i of every iteration of a fixed-gamma run (untimed, traced), from one teacher-forced pass
  of each model over [start, committed prefix, the iteration's gamma drafts]: (beta [I, gamma],
  accepted [I]) over all rows' iterations (I of them). The run decodes the prompts in chunks of
  `batch`, seeded as the timed runs. beta is the 0/1 match of the argmaxes at temperature 0.
  `draft` a T5 model, or any draft: its betas are then the loop's own (trace_beta), which a
  fixed-gamma block computes at every drafted position, rejected or not."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop  # pylint: disable=import-outside-toplevel
  from specjax.decoding.model_draft import as_draft  # pylint: disable=import-outside-toplevel
  from specjax.decoding.sampling import Sampling  # pylint: disable=import-outside-toplevel
  from specjax.models.t5 import T5Model  # pylint: disable=import-outside-toplevel

  model_q = isinstance(draft, T5Model)

  n = prompts_NxS.shape[0] - prompts_NxS.shape[0] % batch
  start_id = target.config.decoder_start_token_id
  width = max_new_tokens + gamma + 1  # [start, at most max_new_tokens - 1 committed, gamma drafts]
  src, dec, pos, accepted, traced = [], [], [], [], []
  for i in range(0, n, batch):
    out = jax.device_get(loop.speculative_decode(
        target, as_draft(draft), prompts_NxS[i:i + batch], gamma=gamma, rng=i // batch,
        max_new_tokens=max_new_tokens, temperature=temperature, trace=True))
    for b in range(out.tokens.shape[0]):
      t = 0
      for drafts_G, m, beta_G in zip(out.trace_drafts[b], out.trace_accepted[b],
                                     out.trace_beta[b]):
        if m < 0:  # the row had finished
          break
        traced.append(beta_G)
        row = np.zeros(width, np.int32)
        row[0], row[1:t + 1], row[t + 1:t + 1 + gamma] = start_id, out.tokens[b, :t], drafts_G
        src.append(prompts_NxS[i + b])
        dec.append(row)
        pos.append(t)
        accepted.append(int(m))
        t += int(m) + 1
  if not model_q:
    return np.asarray(traced, np.float32), np.asarray(accepted)
  pad = -len(src) % rows_per_pass  # whole passes: one program
  src_RxS = np.stack(src + [src[0]] * pad)
  dec_RxW = np.stack(dec + [dec[0]] * pad)
  pos_R = np.asarray(pos + [pos[0]] * pad, np.int32)
  sampling = Sampling(temperature=float(temperature))
  beta = [_betas_program()(target, draft if model_q else None, src_RxS[j:j + rows_per_pass],
                           dec_RxW[j:j + rows_per_pass], pos_R[j:j + rows_per_pass], gamma=gamma,
                           sampling=sampling)
          for j in range(0, len(pos_R), rows_per_pass)]
  return np.concatenate([np.asarray(x) for x in beta])[:len(pos)], np.asarray(accepted)


@functools.lru_cache(maxsize=None)
def _betas_program():
  """jit(target, draft, src [R, S], dec [R, W], pos [R]) -> beta [R, gamma] (gamma and sampling
  static): draft i (1-based) of a row whose prefix holds t tokens is predicted at decoder index
  t + i - 1 and sits at t + i. draft None: q is the one-hot of the logged draft (greedy)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.decoding import sampling as sampling_lib  # pylint: disable=import-outside-toplevel
  from specjax.decoding import theory  # pylint: disable=import-outside-toplevel
  from specjax.models import t5  # pylint: disable=import-outside-toplevel

  @functools.partial(jax.jit, static_argnames=('gamma', 'sampling'))
  def run(target, draft, src_RxS, dec_RxW, pos_R, *, gamma, sampling):
    idx_RxG = pos_R[:, None] + jnp.arange(gamma)[None, :]

    def probs(model):
      logits_RxWxV = t5.teacher_forced_logits(model.params, model.config, src_RxS, dec_RxW)
      return sampling_lib.probs(jnp.take_along_axis(logits_RxWxV, idx_RxG[..., None], axis=1),
                                sampling)
    if draft is None:
      x_RxG = jnp.take_along_axis(dec_RxW, idx_RxG + 1, axis=1)
      return theory.beta(probs(target), jax.nn.one_hot(x_RxG, target.config.vocab_size))
    return theory.beta(probs(target), probs(draft))
  return run


def iteration_costs(block_cost, c, gamma):
  """[gamma + 1]: an iteration proposing k drafts costs min_{j >= k} block_cost(j) + k c target
  steps (block_cost(j): the (j+1)-token target step over the 1-token one; block_cost(0) = 1).
  k drafts can be verified in any block of at least k + 1 tokens (a rule's program uses the
  narrowest compiled width >= k + 1), so the cheapest such block is charged: a measured curve
  that is not monotone (noise, a kernel's tile) never charges the oracle more than a rule pays."""
  widths = [1.0] + [block_cost[j] for j in range(1, gamma + 1)]
  return [min(widths[k:]) + k * c for k in range(gamma + 1)]


def add_oracle(rows, fixed, rules, beta_IxG, accepted_I, cost_G1, temperature) -> dict:
  """Inserts the oracle row into the table `rows` (before AR), gives each of `rules` (exact
  token-verification rules, rows of the table) its oracle share; returns the setting's oracle
  fields. `fixed`: the fixed-gamma token-verification rows, the oracle's anchor."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from specjax.decoding import theory  # pylint: disable=import-outside-toplevel
  g = beta_IxG.shape[1]
  tokens_IxG1 = theory.chain_tokens(beta_IxG)
  k_I, rate = theory.oracle_lengths(beta_IxG, cost_G1)
  fixed = [r for r in fixed if r['gamma'] <= g]

  def scaled(key):
    # The oracle's gain over the best fixed gamma (by `key`) on the logged iterations, applied to
    # that gamma's measured figure.
    best = max(fixed, key=lambda r: r[key])
    model = theory.pooled_rate(tokens_IxG1, cost_G1, np.full(len(k_I), best['gamma']))
    return best, best[key] * rate / model, rate / model

  (best_s, tok_s, gain), (best_p, predicted, _) = scaled('tokens_per_s'), scaled('predicted')
  tokens_per_call = float(tokens_IxG1[np.arange(len(k_I)), k_I].mean())
  ar = next(r for r in rows if r['variant'] == 'AR')
  oracle = dict(variant='oracle', gamma=g, verifier='token', bound=True, tokens_per_s=tok_s,
                vs_best_fixed=gain, vs_ar=tok_s / ar['tokens_per_s'],
                tokens_per_call=tokens_per_call, passes_per_call=float(k_I.mean()),
                passes_per_token=float(k_I.mean()) / tokens_per_call,
                proposed_per_call=float(k_I.mean()), predicted=predicted,
                proposed_hist=np.bincount(k_I, minlength=g + 1).tolist())
  rows.insert(len(rows) - 1 if rows[-1]['variant'] == 'AR' else len(rows), oracle)

  def share(value, best, bound):
    return (value - best) / (bound - best) if bound > best else float('nan')

  for r in rules:
    r['oracle_share'] = share(r['tokens_per_s'], best_s['tokens_per_s'], tok_s)
    r['oracle_share_cost'] = share(r['predicted'], best_p['predicted'], predicted)
  best_rule = max(rules, key=lambda r: r['tokens_per_s']) if rules else {}
  # The logged run's own check: the mean beta over positions whose prefix was accepted is the
  # run's alpha; at T = 0 the leading ones of beta are the accepted count (up to ties in floats).
  seen_IxG = np.arange(g)[None, :] <= np.minimum(accepted_I, g - 1)[:, None]
  out = dict(oracle_tokens_per_s=tok_s, oracle_vs_fixed=gain, oracle_predicted=predicted,
             oracle_tokens_per_call=tokens_per_call, oracle_passes_per_call=float(k_I.mean()),
             oracle_iterations=int(len(k_I)), oracle_gamma=g, oracle_cost=list(cost_G1),
             oracle_token_rule=best_rule.get('variant'),
             oracle_share=best_rule.get('oracle_share', float('nan')),
             oracle_share_cost=best_rule.get('oracle_share_cost', float('nan')),
             logged_alpha=float(beta_IxG[seen_IxG].mean()))
  if temperature == 0:
    lead_I = np.argmin(np.concatenate([beta_IxG > 0.5, np.zeros((len(k_I), 1), bool)], 1), 1)
    out['logged_agree'] = float(np.mean(lead_I == accepted_I))
  return out
