"""One cell of the sweep: baseline vs speculative on the same prompts, timed side by side.

Both decoders run every batch of the task's prompts, interleaved (A B A B ...) after a warm-up that
is reported as compile time, with `block_until_ready` and the median of `repeats`. Statistics
(alpha, tokens per target call, the accepted-count histogram) come from the loop's own `SpecStats`
restricted to the real prompts (the last batch is padded with copies).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding import loop as decoding
from specjax.decoding import stopping
from specjax.runner import metrics
from specjax.runner import paper
from specjax.runner.prompts import Prompts, unbatch
from specjax.runner.quality import quality


@dataclasses.dataclass
class CellResult:
  """record: the results.jsonl line; examples: the first outputs as text (printed, not stored);
  trace: (drafts [I, G], accepted [I], tokens [L]) of the first row, for the trace picture."""
  record: dict[str, Any]
  examples: list[dict[str, str]]
  trace: tuple[np.ndarray, np.ndarray, np.ndarray]


def valid_stats(outputs, rows_valid: list[int]):
  """The SpecStats of several batches merged over their real rows (per-row fields concatenated,
  batch-wide counters summed)."""
  first = outputs[0].stats
  merged = {}
  for field in dataclasses.fields(first):
    values = [np.asarray(getattr(o.stats, field.name)) for o in outputs]
    if values[0].ndim:
      merged[field.name] = np.concatenate([v[:k] for v, k in zip(values, rows_valid)])
    else:
      merged[field.name] = np.sum(values).astype(values[0].dtype)
  return first.replace(**merged)


def run_cell(spec, task: str, draft_name: str, target, draft, tokenizer, prompts: Prompts,
             temperature: float, gamma: int, c: float, *, stop: str = 'fixed',
             verifier: str = 'token', block_cost: float = 1.0, tree: str = '',
             block_costs: tuple[float, ...] | None = None,
             predict_call: bool = False) -> CellResult:
  """Times baseline vs speculative on the same prompts and collects alpha and quality.

  `stop` is a stop rule's spelling (specjax.stopping.parse; 'alpha' gets the measured c,
  'budget' c and `block_costs`, the measured curve 1, block cost(1) .. block cost(gamma)), gamma
  then its block width G_MAX; `verifier` names the verification rule. A `tree` ('(3,2,1)')
  decodes with that token tree instead (specjax.decoding.tree; no trace picture).
  `predict_call` (chains only) adds the prediction for whole decodes
  (`theory.predicted_sequence_speedup`), its terms timed in the same interleaved session as the
  cell's decodes (`metrics.call_cost_programs`)."""
  rule = stopping.parse(stop, c=c, block_costs=block_costs)
  kw = dict(max_new_tokens=spec.max_new_tokens, temperature=temperature, top_k=spec.top_k,
            top_p=spec.top_p)
  rng = jax.random.PRNGKey(spec.seed)
  batches = [jnp.asarray(b) for b in prompts.batches_NxBxS]

  def run_base(batches=batches):
    return [decoding.autoregressive_decode(target, b, rng=jax.random.fold_in(rng, i), **kw)
            for i, b in enumerate(batches)]

  def run_spec(batches=batches):
    if tree:
      return [decoding.speculative_decode(target, draft, b, tree=tree,
                                          rng=jax.random.fold_in(rng, i), **kw)
              for i, b in enumerate(batches)]
    # trace=True costs one small write per iteration and feeds the trace picture for free.
    return [decoding.speculative_decode(target, draft, b, gamma=gamma, stop=rule,
                                        verifier=verifier, rng=jax.random.fold_in(rng, i),
                                        trace=True, **kw)
            for i, b in enumerate(batches)]

  outputs = {}
  # Every batch has the same padded shape, so warming up on the first compiles all there is.
  first = lambda fn: lambda: [o.tokens for o in fn(batches[:1])]
  fns = {'baseline': metrics.keep_outputs(outputs, 'baseline', run_base),
         'speculative': metrics.keep_outputs(outputs, 'speculative', run_spec)}
  costs = None
  if predict_call and not tree:
    pieces, costs = metrics.call_cost_programs(
        target, draft, batches, gamma=gamma, max_new_tokens=spec.max_new_tokens, rng=rng,
        sampling={k: v for k, v in kw.items() if k != 'max_new_tokens'},
        spec_kw=dict(stop=rule, verifier=verifier))
    fns.update({'cost_' + k: f for k, f in pieces.items()})
  timings = metrics.time_interleaved(
      fns, repeats=spec.repeats,
      warmups={'baseline': first(run_base), 'speculative': first(run_spec)})
  if costs is not None:
    costs = costs({k[len('cost_'):]: t for k, t in timings.items() if k.startswith('cost_')})
  spec_out, base_out = outputs['speculative'], outputs['baseline']
  stats = valid_stats(spec_out, prompts.rows_valid)
  alpha = stats.alpha

  base_tokens, base_len = unbatch(base_out, prompts.n)
  spec_tokens, spec_len = unbatch(spec_out, prompts.n)
  decode = lambda toks: tokenizer.batch_decode(toks, skip_special_tokens=True)
  base_text, spec_text = decode(base_tokens), decode(spec_tokens)
  length_ratio = float(np.sum(spec_len)) / max(float(np.sum(base_len)), 1.0)
  time_ratio = metrics.paired_ratio(timings['baseline'], timings['speculative'])
  label = spec.draft_label(draft_name)
  paper_row = paper.table2_row(task, label, temperature)
  paper_gamma = bool(paper_row and paper_row['gamma'] == gamma)
  record = {
      'task': task, 'draft': label, 'draft_path': draft_name, 'target': spec.target,
      'temperature': float(temperature), 'gamma': int(gamma), 'examples': prompts.n,
      'stop': stop, 'verifier': verifier,
      'proposed_per_target_call': stats.proposed_per_target_call,
      'draft_passes_per_call': float(stats.draft_passes) / max(int(stats.iterations), 1),
      'proposed_hist': (np.asarray(stats.proposed_hist).sum(0).tolist() if not tree else []),
      'block_cost': block_cost,
      'batch_size': spec.batch_size, 'max_new_tokens': spec.max_new_tokens,
      'alpha': alpha, 'acceptance_rate': stats.acceptance_rate,
      'tokens_per_target_call': stats.tokens_per_target_call,
      'tokens_per_target_call_pred': metrics.expected_tokens_per_call(alpha, gamma),
      'c': c, 'pred_improvement': metrics.walltime_improvement(alpha, gamma, c),
      # The cost model with the measured proposal lengths (any stop rule): E[tokens per call] /
      # (E[draft passes per call] c + block cost).
      'pred_improvement_measured': metrics.predicted_speedup(
          stats.tokens_per_target_call, float(stats.draft_passes) / max(int(stats.iterations), 1),
          c, block_cost),
      'pred_improvement_call': None if costs is None else metrics.predicted_sequence_speedup(
          float(np.sum(spec_len)) / prompts.n, stats.tokens_per_target_call,
          float(stats.draft_passes) / max(int(stats.iterations), 1), costs['proposal'] / gamma,
          costs['block_cost'], fixed_base=costs['fixed_base'],
          fixed_spec=costs['fixed_spec'], base_per_token=costs['base_per_token'],
          overhead=costs['overhead']),
      # The prediction's terms in the target's 1-token steps of the cell's session (step_s: the
      # length of that step in seconds).
      'call_costs': costs,
      'fixed_cost_base': None if costs is None else costs['fixed_base'],
      'base_step_per_token': None if costs is None else costs['base_per_token'],
      'fixed_cost_spec': None if costs is None else costs['fixed_spec'],
      'iteration_overhead': None if costs is None else costs['overhead'],
      'speedup': time_ratio * length_ratio,
      'time_ratio': time_ratio,
      'length_ratio': length_ratio,
      'baseline_generated_tokens': int(np.sum(base_len)),
      'baseline_s': timings['baseline'].median_s, 'speculative_s': timings['speculative'].median_s,
      'baseline_compile_s': timings['baseline'].compile_s,
      'speculative_compile_s': timings['speculative'].compile_s,
      'baseline_times_s': list(timings['baseline'].times_s),  # per repeat: spread in the plots
      'speculative_times_s': list(timings['speculative'].times_s),
      'generated_tokens': int(np.sum(spec_len)),
      'accepted_hist': np.asarray(stats.accepted_hist).sum(0).tolist(),
      'quality_baseline': quality(task, base_text, prompts.references),
      'quality_speculative': quality(task, spec_text, prompts.references),
      'identical_to_baseline': bool(np.array_equal(base_tokens, spec_tokens)),
      'paper_gamma': paper_gamma,
      'paper_alpha': paper.table3_alpha(task, label, temperature),
      'paper_speedup': paper_row['speedup'] if paper_gamma else None,
      'paper_c': paper_row['c'] if paper_row else None,
      'device': jax.devices()[0].device_kind,
      'time': time.strftime('%Y-%m-%dT%H:%M:%S'),
  }
  examples = [{'source': s, 'reference': r, 'baseline': b, 'speculative': p}
              for s, r, b, p in zip(prompts.sources, prompts.references, base_text,
                                    spec_text)][:spec.show_examples]
  if tree:  # alpha is the paper's for trees too; a tree's acceptance_rate is per level tried
    record.update(tree=tree, nodes_per_target_call=stats.nodes_per_target_call,
                  level_acceptance=stats.level_acceptance)
  first, trace = spec_out[0], None
  if not tree:
    trace = (np.asarray(first.trace_drafts[0]), np.asarray(first.trace_accepted[0]),
             np.asarray(first.tokens[0])[:int(first.lengths[0])])
  return CellResult(record, examples, trace)
