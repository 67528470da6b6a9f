"""The paper's experiment: sweep tasks x drafts x temperatures x gammas; measure alpha, c, speedup.

Each cell (task, draft, temperature, gamma) times `autoregressive_decode` and `speculative_decode` on
the same prompts, interleaved (A B A B ...) after a warm-up that is reported as compile time, with
`block_until_ready` and the median of repeats. One JSON line per finished cell is appended atomically
to results.jsonl; a restarted sweep skips the cells already there.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax.runner import config as config_lib
from specjax.decoding import loop as decoding
from specjax.runner import metrics
from specjax.runner import paper
from specjax.runner import report
from specjax.runner.config import RunSpec

CELL_KEYS = ('task', 'draft', 'temperature', 'gamma')


# ----------------------------------------------------------------------------- results file


class ResultsFile:
  """results.jsonl: one line per finished cell, rewritten atomically (temp file + rename)."""

  def __init__(self, path: str):
    self.path = path

  def load(self) -> list[dict[str, Any]]:
    if not os.path.exists(self.path):
      return []
    rows = []
    with open(self.path, encoding='utf-8') as f:
      for line in f:
        line = line.strip()
        if line:
          rows.append(json.loads(line))
    return rows

  def done_keys(self) -> set[tuple]:
    return {cell_key(r) for r in self.load()}

  def append(self, record: dict[str, Any]):
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
    existing = ''
    if os.path.exists(self.path):
      with open(self.path, encoding='utf-8') as f:
        existing = f.read()
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(self.path)), suffix='.tmp')
    with os.fdopen(fd, 'w', encoding='utf-8') as f:
      f.write(existing + json.dumps(record, sort_keys=True) + '\n')
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, self.path)


def cell_key(record: dict[str, Any]) -> tuple:
  return (record['task'], record['draft'], float(record['temperature']), int(record['gamma']))


# ----------------------------------------------------------------------------- setup


def setup_jax(spec: RunSpec):
  """Persistent compilation cache (a second run of the same sweep skips XLA compilation) and the
  matmul precision (on accelerators the default runs float32 matmuls in TF32 / bf16 passes)."""
  if spec.matmul_precision:
    jax.config.update('jax_default_matmul_precision', spec.matmul_precision)
  if spec.compilation_cache:
    path = os.path.expanduser(spec.compilation_cache)
    os.makedirs(path, exist_ok=True)
    jax.config.update('jax_compilation_cache_dir', path)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)


def _dtype(spec: RunSpec):
  return jnp.bfloat16 if spec.dtype == 'bfloat16' else jnp.float32


@dataclasses.dataclass
class Prompts:
  """A task's prompts as fixed-shape batches [n_batches, B, S] (the last batch padded with copies)."""
  batches: np.ndarray
  n: int
  sources: list[str]
  references: list[str]


def make_prompts(tokenizer, sources, references, spec: RunSpec, pad_id: int) -> Prompts:
  ids = [tokenizer(s, truncation=True, max_length=spec.max_source_len)['input_ids']
         for s in sources]
  longest = max(len(x) for x in ids)
  s_len = min(spec.max_source_len, int(math.ceil(longest / 8) * 8))  # few distinct shapes
  b = spec.batch_size
  n_batches = int(math.ceil(len(ids) / b))
  arr = np.full((n_batches * b, s_len), pad_id, np.int32)
  for i in range(n_batches * b):
    row = ids[i] if i < len(ids) else ids[0]
    arr[i, :len(row)] = row[:s_len]
  return Prompts(arr.reshape(n_batches, b, s_len), len(ids), list(sources), list(references))


def _unbatch(outputs, n):
  tokens = np.concatenate([np.asarray(o.tokens) for o in outputs])[:n]
  lengths = np.concatenate([np.asarray(o.lengths) for o in outputs])[:n]
  return tokens, lengths


def make_mesh(spec: RunSpec):
  """The device mesh of config.mesh_shape, or None for one device."""
  if not spec.mesh_shape:
    return None
  from specjax.models import sharding  # pylint: disable=import-outside-toplevel
  sharding.initialize_distributed()
  return sharding.make_mesh(spec.mesh_shape)


def build_draft(spec: RunSpec, draft: str, target, tokenizer, task: str, mesh=None):
  """A T5 draft from a checkpoint, or an n-gram / prompt-lookup draft fitted for this target."""
  from specjax.decoding import drafts as drafts_lib  # pylint: disable=import-outside-toplevel
  from specjax.models.checkpoints import load_t5  # pylint: disable=import-outside-toplevel
  vocab = target.config.vocab_size
  if draft == 'prompt_lookup':
    return drafts_lib.PromptLookupDraft(vocab_size=vocab)
  if draft in ('unigram', 'bigram'):
    # Fitted once per (task, data, size); cached next to the results so a resumed sweep reuses it.
    cache = os.path.join(spec.output_dir, f'{draft}_{task}_{spec.ngram_examples}.npz')
    if os.path.exists(cache):
      return drafts_lib.load_ngram(cache)
    texts = _ngram_texts(spec, task)
    token_lists = [tokenizer(t)['input_ids'] for t in texts]
    fit = drafts_lib.fit_unigram if draft == 'unigram' else drafts_lib.fit_bigram
    fitted = fit(token_lists, vocab)
    os.makedirs(spec.output_dir, exist_ok=True)
    tmp = cache + '.tmp.npz'
    drafts_lib.save_ngram(fitted, tmp)
    os.replace(tmp, cache)
    return fitted
  model = load_t5(draft, dtype=_dtype(spec), mesh=mesh)
  if model.config.vocab_size != target.config.vocab_size:
    raise config_lib.ConfigError(
        f'config.drafts: {draft} has vocab_size {model.config.vocab_size}, the target has '
        f'{target.config.vocab_size}; the draft must share the target vocabulary')
  return model


def _ngram_texts(spec: RunSpec, task: str) -> list[str]:
  from specjax import data  # pylint: disable=import-outside-toplevel
  if spec.ngram_data:
    with open(os.path.expanduser(spec.ngram_data), encoding='utf-8') as f:
      lines = [line.strip() for line in f if line.strip()]
    texts = []
    for line in lines[:spec.ngram_examples]:
      if line.startswith('{'):
        row = json.loads(line)
        texts.append(row.get('reference') or row.get('target') or row.get('text') or '')
      else:
        texts.append(line)
    return texts
  _, refs = data.load_task(task, 'train', spec.ngram_examples)
  return refs


@functools.partial(jax.jit, static_argnames=('steps',))
def step_loop(model, cache, tokens_BxK, lengths_B, *, steps):
  """`steps` decoder steps of K tokens per row at fixed offsets in one program, the cache carried
  and the argmax fed back (nothing is dead code). Used to time steps as the decode loops run them."""
  def body_fn(_, carry):
    cache, tokens_BxK = carry
    logits_BxKxV, cache = model.decode(cache, tokens_BxK, lengths_B)
    return cache, jnp.argmax(logits_BxKxV, axis=-1).astype(jnp.int32)
  return jax.lax.fori_loop(0, steps, body_fn, (cache, tokens_BxK))[1]


def measure_c(target, draft, batch: np.ndarray, cache_len: int, repeats: int = 15,
              steps: int = 32) -> float:
  """c = draft / target time of one decode step, same batch and lengths, each timed inside one
  compiled loop of `steps` steps: the speculative loop runs its steps inside one program, so a
  per-call timing would add the ~0.1 ms dispatch to both and inflate c for small drafts."""
  if not hasattr(draft, 'init_cache'):
    return 0.0
  ids = jnp.asarray(batch)
  b = ids.shape[0]
  tok = jnp.zeros((b, 1), jnp.int32)
  lengths = jnp.full((b,), cache_len // 2, jnp.int32)

  def stepper(model):
    cache = jax.jit(model.init_cache, static_argnums=1)(ids, cache_len)
    return lambda: step_loop(model, cache, tok, lengths, steps=steps)

  timings = metrics.time_interleaved({'target': stepper(target), 'draft': stepper(draft)},
                                     repeats=repeats)
  return timings['draft'].median_s / timings['target'].median_s


# ----------------------------------------------------------------------------- quality


def quality(task: str, hyps: list[str], refs: list[str]) -> dict[str, float]:
  """BLEU (sacrebleu) for translation, ROUGE (rouge-score) F1 for summarisation."""
  if task == 'cnndm':
    from rouge_score import rouge_scorer  # pylint: disable=import-outside-toplevel
    scorer = rouge_scorer.RougeScorer(['rouge1', 'rouge2', 'rougeL'], use_stemmer=True)
    scores = [scorer.score(r, h) for h, r in zip(hyps, refs)]
    return {k: 100 * float(np.mean([s[k].fmeasure for s in scores]))
            for k in ('rouge1', 'rouge2', 'rougeL')}
  import sacrebleu  # pylint: disable=import-outside-toplevel
  return {'bleu': float(sacrebleu.corpus_bleu(hyps, [refs]).score)}


# ----------------------------------------------------------------------------- one cell


def run_cell(spec: RunSpec, task: str, draft_name: str, target, draft, tokenizer,
             prompts: Prompts, temperature: float, gamma: int, c: float) -> dict[str, Any]:
  """Times baseline vs speculative on the same prompts and collects alpha and quality."""
  kw = dict(max_new_tokens=spec.max_new_tokens, temperature=temperature, top_k=spec.top_k,
            top_p=spec.top_p)
  rng = jax.random.PRNGKey(spec.seed)
  batches = [jnp.asarray(b) for b in prompts.batches]

  def run_base():
    return [decoding.autoregressive_decode(target, b, rng=jax.random.fold_in(rng, i), **kw)
            for i, b in enumerate(batches)]

  def run_spec():
    # trace=True costs one small write per iteration and feeds the trace picture for free.
    return [decoding.speculative_decode(target, draft, b, gamma=gamma,
                                        rng=jax.random.fold_in(rng, i), trace=True, **kw)
            for i, b in enumerate(batches)]

  outputs = {}

  def keep(name, fn):
    def wrapped():
      outputs[name] = fn()
      return [o.tokens for o in outputs[name]]
    return wrapped

  timings = metrics.time_interleaved({'baseline': keep('baseline', run_base),
                                      'speculative': keep('speculative', run_spec)},
                                     repeats=spec.repeats)
  spec_out, base_out = outputs['speculative'], outputs['baseline']
  # Statistics over real prompts only (the last batch is padded with copies of a prompt).
  b = spec.batch_size
  rows_valid = [min(b, prompts.n - i * b) for i in range(len(spec_out))]

  def total(field, dtype=int):
    return sum(dtype(np.sum(np.asarray(getattr(o.stats, field))[:k]))
               for o, k in zip(spec_out, rows_valid))

  alpha_sum, alpha_cnt = total('alpha_sum', float), total('alpha_count')
  target_calls, emitted, accepted = total('target_calls'), total('emitted'), total('accepted')
  hist = np.sum([np.asarray(o.stats.accepted_hist)[:k].sum(0)
                 for o, k in zip(spec_out, rows_valid)], axis=0)
  alpha = alpha_sum / max(alpha_cnt, 1)
  tokens_per_call = emitted / max(target_calls, 1)

  base_tokens, base_len = _unbatch(base_out, prompts.n)
  spec_tokens, spec_len = _unbatch(spec_out, prompts.n)
  decode = lambda toks: tokenizer.batch_decode(toks, skip_special_tokens=True)
  base_text, spec_text = decode(base_tokens), decode(spec_tokens)
  speedup = timings['baseline'].median_s / timings['speculative'].median_s
  label = spec.draft_label(draft_name)
  paper_row = paper.table2_row(task, label, temperature)
  record = {
      'task': task, 'draft': label, 'draft_path': draft_name, 'target': spec.target,
      'temperature': float(temperature), 'gamma': int(gamma), 'examples': prompts.n,
      'batch_size': spec.batch_size, 'max_new_tokens': spec.max_new_tokens,
      'alpha': alpha, 'acceptance_rate': accepted / max(target_calls * gamma, 1),
      'tokens_per_target_call': tokens_per_call,
      'tokens_per_target_call_pred': metrics.expected_tokens_per_call(alpha, gamma),
      'c': c, 'pred_improvement': metrics.walltime_improvement(alpha, gamma, c),
      'speedup': speedup,
      'baseline_s': timings['baseline'].median_s, 'speculative_s': timings['speculative'].median_s,
      'baseline_compile_s': timings['baseline'].compile_s,
      'speculative_compile_s': timings['speculative'].compile_s,
      'generated_tokens': int(np.sum(spec_len)),
      'accepted_hist': hist.tolist(),
      'quality_baseline': quality(task, base_text, prompts.references),
      'quality_speculative': quality(task, spec_text, prompts.references),
      'identical_to_baseline': bool(np.array_equal(base_tokens, spec_tokens)),
      'paper_gamma': bool(paper_row and paper_row['gamma'] == gamma),
      'paper_alpha': paper.table3_alpha(task, label, temperature),
      'paper_speedup': paper_row['speedup'] if paper_row and paper_row['gamma'] == gamma else None,
      'paper_c': paper_row['c'] if paper_row else None,
      'device': jax.devices()[0].device_kind,
      'time': time.strftime('%Y-%m-%dT%H:%M:%S'),
  }
  record['_examples'] = [{'source': s, 'reference': r, 'baseline': b, 'speculative': p}
                         for s, r, b, p in zip(prompts.sources, prompts.references, base_text,
                                               spec_text)][:spec.show_examples]
  first = spec_out[0]
  record['_trace'] = (np.asarray(first.trace_drafts[0]), np.asarray(first.trace_accepted[0]),
                      np.asarray(first.tokens[0])[:int(first.lengths[0])])
  return record


# ----------------------------------------------------------------------------- the sweep


def run(spec: RunSpec, out=None) -> list[dict[str, Any]]:
  """Runs every cell not yet in results.jsonl, then writes the table, CSV/Markdown and plots."""
  out = out or sys.stdout
  from specjax import data  # pylint: disable=import-outside-toplevel
  from specjax.models import checkpoints  # pylint: disable=import-outside-toplevel
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel

  setup_jax(spec)
  results = ResultsFile(os.path.join(spec.output_dir, 'results.jsonl'))
  done = results.done_keys()
  cells = [(task, d, t, g) for task in spec.tasks for d in spec.drafts
           for t in spec.temperatures for g in spec.gammas]
  todo = [c for c in cells if (c[0], spec.draft_label(c[1]), c[2], c[3]) not in done]
  if len(todo) < len(cells):
    print(f'resuming: {len(cells) - len(todo)} of {len(cells)} cells already in {results.path}',
          file=out)
  shown = None  # (temperature, gamma, draft, examples) of the cell whose outputs are printed
  if todo:
    mesh = make_mesh(spec)
    target = checkpoints.load_t5(spec.target, dtype=_dtype(spec), mesh=mesh)
    tokenizer = checkpoints.load_tokenizer(spec.target)
    if tokenizer is None:
      raise config_lib.ConfigError(f'config.target: no tokenizer files in {spec.target}')
    progress = tqdm(total=len(todo), desc='cells', unit='cell', file=out, dynamic_ncols=True)
    for task in spec.tasks:
      task_cells = [c for c in todo if c[0] == task]
      if not task_cells:
        continue
      sources, references = data.load_task(task, 'test', spec.num_examples,
                                           local_path=spec.local_data or None)
      prompts = make_prompts(tokenizer, sources, references, spec,
                             target.config.pad_token_id)
      for draft_name in spec.drafts:
        draft_cells = [c for c in task_cells if c[1] == draft_name]
        if not draft_cells:
          continue
        draft = build_draft(spec, draft_name, target, tokenizer, task, mesh)
        cache_len = spec.max_new_tokens + max(spec.gammas) + 1
        c = measure_c(target, draft, prompts.batches[0], cache_len)
        for _, _, temperature, gamma in draft_cells:
          progress.set_postfix_str(f'{task} {spec.draft_label(draft_name)} T={temperature} '
                                   f'gamma={gamma}')
          record = run_cell(spec, task, draft_name, target, draft, tokenizer, prompts,
                            temperature, gamma, c)
          cell_examples = record.pop('_examples')
          if shown is None or temperature < shown[0]:  # greedy examples when the sweep has them
            shown = (temperature, gamma, spec.draft_label(draft_name), cell_examples)
          trace = record.pop('_trace')
          if spec.plots and temperature == min(spec.temperatures) and gamma == max(spec.gammas):
            report.trace_picture(spec, task, spec.draft_label(draft_name), tokenizer, *trace,
                                 gamma=gamma, temperature=temperature)
          results.append(record)
          progress.update(1)
    progress.close()
  rows = results.load()
  report.write_tables(spec, rows, out=out)
  if spec.plots:
    report.plots(spec, rows)
  if shown and shown[3]:
    print(f'\nexamples (draft {shown[2]}, T={shown[0]:g}, gamma={shown[1]})', file=out)
  for ex in (shown[3] if shown else []):
    print(f"\nsource:      {ex['source']}\nreference:   {ex['reference']}\n"
          f"baseline:    {ex['baseline']}\nspeculative: {ex['speculative']}", file=out)
  return rows
