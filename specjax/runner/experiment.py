"""The paper's experiment: sweep tasks x drafts x temperatures x gammas; measure alpha, c, speedup.

Each cell (a point of `SWEEP`) is run by `cell.run_cell`; one JSON line per finished cell is
appended atomically to results.jsonl (`results`), and a restarted sweep skips the cells whose stored
settings match the current ones (changed settings recompute; see specjax.runner.results). Data
and the mesh are checked before any model is loaded. Tables and plots (`report`) show only the
cells of the current settings.

Modules: setup (JAX, mesh), prompts (batching), drafts (the draft registry), cell (one cell),
metrics (cost model, timing, c), quality (BLEU / ROUGE), results (the file and cell identity).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from specjax.decoding import stopping
from specjax.errors import ConfigError
from specjax.runner import drafts as drafts_lib
from specjax.runner import metrics
from specjax.runner import report
from specjax.runner import results as results_lib
from specjax.runner import setup
from specjax.runner.cell import CellResult, run_cell  # pylint: disable=unused-import
from specjax.runner import config as config_lib
from specjax.runner.config import RunSpec
from specjax.runner.prompts import make_prompts
from specjax.runner.results import ResultsFile  # pylint: disable=unused-import

# The sweep's dimensions: (cell field, RunSpec field listing its values), outermost first.
SWEEP = (('task', 'tasks'), ('draft', 'drafts'), ('temperature', 'temperatures'),
         ('gamma', 'gammas'), ('stop', 'stops'), ('verifier', 'verifiers'))


def curve(block_cost: dict[int, float], gamma: int) -> tuple[float, ...] | None:
  """(1, block_cost[1], .., block_cost[gamma]) when all were measured, else None."""
  if not all(g in block_cost for g in range(1, gamma + 1)):
    return None
  return (1.0,) + tuple(float(block_cost[g]) for g in range(1, gamma + 1))


def cells(spec: RunSpec) -> list[dict[str, Any]]:
  """Every cell of the sweep, as {cell field: value}, in loop order."""
  out = [{}]
  for name, field in SWEEP:
    out = [dict(c, **{name: v}) for c in out for v in getattr(spec, field)]
  if spec.trees:  # one cell per tree beside the gammas (gamma = its depth, the paper's rule)
    from specjax.decoding import tree as tree_lib  # pylint: disable=import-outside-toplevel
    out += [dict(task=t, draft=d, temperature=x, gamma=s.depth, stop='fixed', verifier='token',
                 tree=str(s))
            for t in spec.tasks for d in spec.drafts for x in spec.temperatures
            for s in tree_lib.parse_trees(spec.trees)]
  return out


def _key(spec: RunSpec, c: dict[str, Any]) -> tuple:
  return results_lib.cell_key(dict(c, draft=spec.draft_label(c['draft'])))


def run(spec: RunSpec, out=None) -> list[dict[str, Any]]:
  """Runs every cell not yet in results.jsonl with the current settings, then writes the table,
  CSV/Markdown and plots from the current cells only."""
  out = out or sys.stdout
  config_lib.check_environment(spec)
  setup.setup_jax(spec)
  mesh = setup.make_mesh(spec)
  results = ResultsFile(os.path.join(spec.output_dir, 'results.jsonl'))
  shared = results_lib.run_settings(spec, setup.device_label(mesh))
  draft_ids = {d: results_lib.draft_settings(spec, d, drafts_lib.SETTINGS) for d in spec.drafts}
  sweep = cells(spec)
  expected = {_key(spec, c): results_lib.cell_settings(shared, c['task'], draft_ids[c['draft']],
                                                       c['temperature'], c['gamma'], c['stop'],
                                                       c['verifier'], c.get('tree', ''))
              for c in sweep}
  current, changed = {}, set()
  for row in results.load():
    key = results_lib.cell_key(row)
    if key not in expected:
      continue
    if row.get('settings_id') == results_lib.settings_id(expected[key]):
      current[key] = row
    else:
      changed.update(results_lib.differing(row.get('settings', {}), expected[key])
                     if 'settings' in row else ['(results written before settings were stored)'])
  todo = [c for c in sweep if _key(spec, c) not in current]
  if len(todo) < len(sweep):
    print(f'resuming: {len(sweep) - len(todo)} of {len(sweep)} cells already in {results.path}',
          file=out)
  if changed and todo:
    print(f'settings changed since stored results ({", ".join(sorted(changed))}): recomputing '
          f'{len(todo)} cells; the old rows stay in {results.path} and are not shown', file=out)
  shown = _run_cells(spec, todo, mesh, results, shared, draft_ids, expected, current, out)

  rows = [current[k] for k in expected if k in current]
  report.write_tables(spec, rows, out=out)
  if spec.plots:
    report.plots(spec, rows)
  if shown and shown[3]:
    print(f'\nexamples (draft {shown[2]}, T={shown[0]:g}, gamma={shown[1]})', file=out)
  for ex in (shown[3] if shown else []):
    print(f"\nsource:      {ex['source']}\nreference:   {ex['reference']}\n"
          f"baseline:    {ex['baseline']}\nspeculative: {ex['speculative']}", file=out)
  return rows


def _run_cells(spec, todo, mesh, results, shared, draft_ids, expected, current, out):
  """Computes the `todo` cells (data first, then models), appending each record; returns the
  (temperature, gamma, draft, examples) whose outputs are printed."""
  if not todo:
    return None
  from specjax import data  # pylint: disable=import-outside-toplevel
  from specjax.models import checkpoints  # pylint: disable=import-outside-toplevel
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel

  tasks = [t for t in spec.tasks if any(c['task'] == t for c in todo)]
  texts = {t: data.load_task(t, 'test', spec.num_examples, local_path=spec.local_data or None)
           for t in tasks}  # before any model: a bad data file fails fast
  tokenizer = checkpoints.load_tokenizer(spec.target)
  if tokenizer is None:
    raise ConfigError(f'config.target: no tokenizer files in {spec.target}')
  target = checkpoints.load_t5(spec.target, dtype=setup.dtype(spec), mesh=mesh)
  shown = None
  progress = tqdm(total=len(todo), desc='cells', unit='cell', file=out, dynamic_ncols=True)
  for task in tasks:
    prompts = make_prompts(tokenizer, *texts[task], max_source_len=spec.max_source_len,
                           batch_size=spec.batch_size, pad_id=target.config.pad_token_id)
    cache_len = spec.max_new_tokens + max(spec.gammas) + 1
    # The target's (gamma+1)-token step over its 1-token step (a property of the target, so once
    # per task), for the cost model beside Theorem 3.8's (which assumes 1): measured when asked
    # or when the sweep has stop rules (their cells verify variable-length blocks); at every
    # gamma up to the largest when a rule prices its proposals with the curve ('budget').
    measured = set(spec.gammas) if spec.block_cost or set(spec.stops) != {'fixed'} else set()
    if any(stopping.takes_block_costs(s) for s in spec.stops):
      measured |= set(range(1, max(spec.gammas) + 1))
    block_cost = {g: metrics.measure_block_cost(target, prompts.batches_NxBxS[0], cache_len, g)
                  for g in sorted(measured)}
    for draft_name in spec.drafts:
      draft_cells = [c for c in todo if c['task'] == task and c['draft'] == draft_name]
      if not draft_cells:
        continue
      label = spec.draft_label(draft_name)
      identity = json.dumps([shared['target'], draft_ids[draft_name], task], sort_keys=True)
      draft = drafts_lib.build(spec, draft_name, target, tokenizer, task, mesh, identity)
      c = metrics.measure_c(target, draft, prompts.batches_NxBxS[0], cache_len)
      for cell in draft_cells:
        temperature, gamma = cell['temperature'], cell['gamma']
        progress.set_postfix_str(f'{task} {label} T={temperature} gamma={gamma}')
        result = run_cell(spec, task, draft_name, target, draft, tokenizer, prompts,
                          temperature, gamma, c, stop=cell['stop'], verifier=cell['verifier'],
                          block_cost=block_cost.get(gamma, 1.0), tree=cell.get('tree', ''),
                          block_costs=curve(block_cost, gamma),
                          predict_call=spec.block_cost)
        if shown is None or temperature < shown[0]:  # greedy examples when the sweep has them
          shown = (temperature, gamma, label, result.examples)
        if (spec.plots and temperature == min(spec.temperatures) and gamma == max(spec.gammas)
            and cell['stop'] == spec.stops[0] and cell['verifier'] == spec.verifiers[0]
            and not cell.get('tree')):
          report.trace_picture(spec, task, label, tokenizer, *result.trace, gamma=gamma,
                               temperature=temperature)
        key = _key(spec, cell)
        record = dict(result.record, settings=expected[key],
                      settings_id=results_lib.settings_id(expected[key]))
        results.append(record)
        current[key] = record
        progress.update(1)
  progress.close()
  return shown
