"""Experiment configs: an ml_collections ConfigDict becomes a frozen, validated RunSpec here, once.

Every check that can fail on user input runs in `run_spec`, before any model is loaded or compiled,
and raises a one-line `ConfigError` naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

NGRAM_DRAFTS = ('unigram', 'bigram', 'prompt_lookup')
TASKS = ('ende', 'cnndm', 'bible_en_es')
DTYPES = ('float32', 'bfloat16')
MATMUL_PRECISIONS = ('', 'default', 'high', 'highest')


class ConfigError(ValueError):
  """Bad experiment configuration; the message names the field."""


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One experiment: a target, drafts, and the grid of tasks x temperatures x gammas it sweeps.

  Fields mirror configs/common.py, where each one is documented.
  """
  name: str
  target: str
  drafts: tuple[str, ...]
  tasks: tuple[str, ...]
  temperatures: tuple[float, ...]
  gammas: tuple[int, ...]
  top_k: int
  top_p: float
  num_examples: int
  max_source_len: int
  max_new_tokens: int
  batch_size: int
  repeats: int
  dtype: str
  matmul_precision: str
  seed: int
  output_dir: str
  local_data: str
  ngram_data: str
  ngram_examples: int
  mesh_shape: tuple[int, ...]
  compilation_cache: str
  plots: bool
  show_examples: int

  def draft_label(self, draft: str) -> str:
    """Short name used in tables and to match the paper's rows ('t5-small', 'unigram', ...)."""
    return os.path.basename(os.path.normpath(draft)) if draft not in NGRAM_DRAFTS else draft


def _tuple(value, cast, field):
  if isinstance(value, (str, bytes)):
    parts = [v for v in str(value).replace(' ', '').split(',') if v]
  elif isinstance(value, (list, tuple)):
    parts = list(value)
  else:
    parts = [value]
  try:
    return tuple(cast(v) for v in parts)
  except (TypeError, ValueError):
    raise ConfigError(f'config.{field}: cannot read {value!r} as a list of {cast.__name__}') from None


def _looks_local(path: str) -> bool:
  return path.startswith(('.', '/', '~')) or os.sep in path and not _hub_like(path)


def _hub_like(path: str) -> bool:
  # "org/name" with one slash and no path-like segments is a hub id.
  parts = path.split('/')
  return len(parts) == 2 and all(parts) and not path.startswith(('.', '/', '~'))


def _check_checkpoint(field: str, path: str):
  if not path:
    raise ConfigError(f'config.{field}: empty checkpoint path')
  expanded = os.path.expanduser(path)
  if os.path.isdir(expanded):
    if not os.path.isfile(os.path.join(expanded, 'config.json')):
      raise ConfigError(f'config.{field}: no config.json in checkpoint directory {path}')
    return
  if _looks_local(path) or os.path.exists(expanded):
    raise ConfigError(f'config.{field}: checkpoint directory not found: {path}')


def run_spec(cfg: Any) -> RunSpec:
  """Validates a ConfigDict (or dict) and freezes it. Unknown keys are errors."""
  data = cfg.to_dict() if hasattr(cfg, 'to_dict') else dict(cfg)
  fields = {f.name for f in dataclasses.fields(RunSpec)}
  unknown = sorted(set(data) - fields)
  if unknown:
    raise ConfigError(f'config.{unknown[0]}: unknown config key (known: {", ".join(sorted(fields))})')
  missing = sorted(fields - set(data))
  if missing:
    raise ConfigError(f'config.{missing[0]}: missing config key')

  spec = RunSpec(
      name=str(data['name']),
      target=str(data['target']),
      drafts=_tuple(data['drafts'], str, 'drafts'),
      tasks=_tuple(data['tasks'], str, 'tasks'),
      temperatures=_tuple(data['temperatures'], float, 'temperatures'),
      gammas=_tuple(data['gammas'], int, 'gammas'),
      top_k=int(data['top_k']),
      top_p=float(data['top_p']),
      num_examples=int(data['num_examples']),
      max_source_len=int(data['max_source_len']),
      max_new_tokens=int(data['max_new_tokens']),
      batch_size=int(data['batch_size']),
      repeats=int(data['repeats']),
      dtype=str(data['dtype']),
      matmul_precision=str(data['matmul_precision'] or ''),
      seed=int(data['seed']),
      output_dir=str(data['output_dir']),
      local_data=str(data['local_data'] or ''),
      ngram_data=str(data['ngram_data'] or ''),
      ngram_examples=int(data['ngram_examples']),
      mesh_shape=_tuple(data['mesh_shape'], int, 'mesh_shape'),
      compilation_cache=str(data['compilation_cache'] or ''),
      plots=bool(data['plots']),
      show_examples=int(data['show_examples']),
  )
  _validate(spec)
  return spec


def _validate(spec: RunSpec):
  if not spec.drafts:
    raise ConfigError('config.drafts: at least one draft is needed')
  if not spec.tasks:
    raise ConfigError('config.tasks: at least one task is needed')
  for task in spec.tasks:
    if task not in TASKS:
      raise ConfigError(f'config.tasks: unknown task {task!r} (known: {", ".join(TASKS)})')
  if not spec.gammas:
    raise ConfigError('config.gammas: at least one gamma is needed')
  for g in spec.gammas:
    if g < 1:
      raise ConfigError(f'config.gammas: gamma must be >= 1, got {g}')
  if not spec.temperatures:
    raise ConfigError('config.temperatures: at least one temperature is needed')
  for t in spec.temperatures:
    if t < 0:
      raise ConfigError(f'config.temperatures: temperature must be >= 0, got {t}')
  if spec.top_k < 0:
    raise ConfigError(f'config.top_k: must be >= 0, got {spec.top_k}')
  if not 0.0 < spec.top_p <= 1.0:
    raise ConfigError(f'config.top_p: must be in (0, 1], got {spec.top_p}')
  for field in ('num_examples', 'max_source_len', 'max_new_tokens', 'batch_size', 'repeats'):
    if getattr(spec, field) < 1:
      raise ConfigError(f'config.{field}: must be positive, got {getattr(spec, field)}')
  if spec.ngram_examples < 1:
    raise ConfigError(f'config.ngram_examples: must be positive, got {spec.ngram_examples}')
  if spec.dtype not in DTYPES:
    raise ConfigError(f'config.dtype: must be one of {DTYPES}, got {spec.dtype!r}')
  if spec.matmul_precision not in MATMUL_PRECISIONS:
    raise ConfigError(f'config.matmul_precision: must be one of {MATMUL_PRECISIONS}, '
                      f'got {spec.matmul_precision!r}')
  if not spec.output_dir:
    raise ConfigError('config.output_dir: empty')
  if any(d < 1 and d != -1 for d in spec.mesh_shape) or len(spec.mesh_shape) not in (0, 2):
    raise ConfigError(f'config.mesh_shape: expected () or (data, model), got {spec.mesh_shape}')
  if spec.local_data and not os.path.isfile(os.path.expanduser(spec.local_data)):
    raise ConfigError(f'config.local_data: file not found: {spec.local_data}')
  if spec.ngram_data and not os.path.isfile(os.path.expanduser(spec.ngram_data)):
    raise ConfigError(f'config.ngram_data: file not found: {spec.ngram_data}')
  _check_checkpoint('target', spec.target)
  for i, draft in enumerate(spec.drafts):
    if draft not in NGRAM_DRAFTS:
      _check_checkpoint(f'drafts[{i}]', draft)
  _check_vocab(spec)


def _local_vocab(path: str):
  cfg = os.path.join(os.path.expanduser(path), 'config.json')
  if not os.path.isfile(cfg):
    return None
  try:
    with open(cfg, encoding='utf-8') as f:
      return int(json.load(f).get('vocab_size', 32128))
  except (OSError, ValueError) as e:
    raise ConfigError(f'{cfg}: unreadable config.json ({e})') from None


def _check_vocab(spec: RunSpec):
  """Target/draft vocabulary mismatch, from local config.json files (hub ids are checked on load)."""
  target_vocab = _local_vocab(spec.target)
  if target_vocab is None:
    return
  for i, draft in enumerate(spec.drafts):
    if draft in NGRAM_DRAFTS:
      continue
    vocab = _local_vocab(draft)
    if vocab is not None and vocab != target_vocab:
      raise ConfigError(f'config.drafts[{i}]: vocab_size {vocab} of {draft} differs from the '
                        f'target\'s {target_vocab}')
