"""Fine-tuning configs: a ConfigDict becomes a frozen, validated FinetuneSpec here, once.

Every field is documented in configs/finetune/common.py; every check raises a one-line
`ConfigError` naming the field, before anything is loaded or compiled.
"""


from __future__ import annotations

import dataclasses
import os
from typing import Any

from specjax.runner.config import ConfigError
from specjax.models.t5 import T5Config

OPTIMIZERS = ('adafactor', 'adamw')
SCHEDULES = ('constant', 'cosine', 'linear', 'rsqrt')
DTYPES = ('float32', 'bfloat16')
LONG_EXAMPLES = ('drop', 'truncate')


# ----------------------------------------------------------------------------- config boundary


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  init_from: str            # HF directory or hub id; '' = from scratch with `t5`
  t5: T5Config | None       # architecture from scratch
  vocab_size: int           # from scratch: t5.vocab_size as configured (0 = the tokenizer's size)
  param_dtype: str          # training dtype of the params
  export_dtype: str         # dtype of the exported safetensors


@dataclasses.dataclass(frozen=True)
class DataSpec:
  task: str                 # 'bible_en_es' (shipped corpus) or a specjax.data.load_task name
  source_field: str         # bible_en_es: the record fields read as source and target
  target_field: str
  prefix: str               # prepended to every source (load_task adds the task's own first)
  tokenizer: str            # 'bible' | '' (the init_from checkpoint's) | HF dir or hub id
  source_buckets: tuple[int, ...]
  target_buckets: tuple[int, ...]
  long_examples: str        # 'drop' | 'truncate'
  batch_size: int
  train_examples: int       # 0 = all, else a random subset of this size (seeded)
  eval_examples: int        # dev examples for the periodic dev loss
  bleu_examples: int        # dev examples decoded for BLEU at the end (0 = skip)
  distill_from: str         # teacher checkpoint: train on its greedy outputs ('' = references)


@dataclasses.dataclass(frozen=True)
class OptimSpec:
  name: str
  learning_rate: float
  schedule: str
  warmup_steps: int
  end_lr_fraction: float    # cosine / linear: final lr = learning_rate * end_lr_fraction
  weight_decay: float       # adamw only
  b1: float
  b2: float
  clip_norm: float          # global gradient-norm clipping (0 = off)
  label_smoothing: float
  z_loss: float             # T5X's auxiliary log(Z)^2 loss weight


@dataclasses.dataclass(frozen=True)
class FinetuneSpec:
  name: str
  workdir: str
  export_dir: str           # '' = workdir/export
  seed: int
  steps: int
  model: ModelSpec
  data: DataSpec
  optim: OptimSpec
  log_every: int
  eval_every: int           # 0 = only at the end
  checkpoint_every: int
  keep_checkpoints: int
  bleu_batch_size: int
  mesh_shape: tuple[int, ...]  # (data, model); (-1, 1) = data parallel over every device
  progress: bool
  throttle_s: float         # sleep per step (tests that interrupt a run use it); 0 normally


def _one(cd, group: str, name: str):
  try:
    return cd[name]
  except (KeyError, AttributeError):
    raise ConfigError(f'config.{group}{name}: missing config key') from None


def _read_group(cd, group: str, casts: dict[str, Any], subgroups=()) -> dict[str, Any]:
  """Reads the keys of `casts` from ConfigDict `cd`, casting each; unknown keys are errors."""
  names = list(casts) + list(subgroups)
  for key in cd.keys():
    if key not in names:
      raise ConfigError(f'config.{group}{key}: unknown config key (known: {", ".join(names)})')
  out = {}
  for name in casts:
    value = _one(cd, group, name)
    cast = casts[name]
    try:
      out[name] = cast(value)
    except (TypeError, ValueError):
      raise ConfigError(f'config.{group}{name}: cannot read {value!r} as '
                        f'{getattr(cast, "__name__", "the expected type")}') from None
  return out


def _ints(value) -> tuple[int, ...]:
  if isinstance(value, str):
    value = [v for v in value.replace(' ', '').split(',') if v]
  elif not isinstance(value, (list, tuple)):
    value = [value]
  out = []
  for v in value:
    if isinstance(v, float) and not v.is_integer():
      raise ValueError(v)
    out.append(int(v))
  return tuple(out)


def _int(value) -> int:
  if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
    raise ValueError(value)
  return int(value)


def _bool(value) -> bool:
  if isinstance(value, str):
    if value.lower() not in ('true', 'false', '1', '0', 'yes', 'no'):
      raise ValueError(value)
    return value.lower() in ('true', '1', 'yes')
  return bool(value)


def _require(ok: bool, field: str, want: str, value):
  if not ok:
    raise ConfigError(f'config.{field}: must be {want}, got {value!r}')


def finetune_spec(cfg) -> FinetuneSpec:
  """ConfigDict (configs/finetune/common.py) -> validated FinetuneSpec; else a ConfigError."""
  if isinstance(cfg, FinetuneSpec):
    return cfg
  top = _read_group(cfg, '', dict(
      name=str, workdir=str, export_dir=str, seed=_int, steps=_int, log_every=_int,
      eval_every=_int, checkpoint_every=_int, keep_checkpoints=_int, bleu_batch_size=_int,
      mesh_shape=_ints, progress=_bool, throttle_s=float), subgroups=('model', 'data', 'optim'))
  m = _read_group(_one(cfg, '', 'model'), 'model.',
                  dict(init_from=str, param_dtype=str, export_dtype=str), subgroups=('t5',))
  d = _read_group(_one(cfg, '', 'data'), 'data.', dict(
      task=str, source_field=str, target_field=str, prefix=str, tokenizer=str,
      source_buckets=_ints, target_buckets=_ints, long_examples=str, batch_size=_int,
      train_examples=_int, eval_examples=_int, bleu_examples=_int, distill_from=str))
  o = _read_group(_one(cfg, '', 'optim'), 'optim.', dict(
      name=str, learning_rate=float, schedule=str, warmup_steps=_int, end_lr_fraction=float,
      weight_decay=float, b1=float, b2=float, clip_norm=float, label_smoothing=float,
      z_loss=float))

  t5, vocab = None, 0
  if not m['init_from']:
    t5_cd = _one(cfg.model, 'model.', 't5')
    known = {f.name for f in dataclasses.fields(T5Config)}
    for key in t5_cd.keys():
      if key not in known:
        raise ConfigError(f'config.model.t5.{key}: unknown config key')
    kw = {}
    for key in t5_cd.keys():
      value = t5_cd[key]
      want = type(T5Config.__dataclass_fields__[key].default)
      cast = {bool: _bool, float: float}.get(want, _int)
      try:
        kw[key] = cast(value)
      except (TypeError, ValueError):
        raise ConfigError(f'config.model.t5.{key}: cannot read {value!r}') from None
    vocab = kw.get('vocab_size', 0)
    _require(vocab >= 0, 'model.t5.vocab_size', '>= 0 (0 = the tokenizer\'s size)', vocab)
    kw['vocab_size'] = vocab or 1  # placeholder: ModelSpec.vocab_size = 0 means the tokenizer's
    try:
      t5 = T5Config(**kw)
    except TypeError as e:
      raise ConfigError(f'config.model.t5: {e}') from None
    except ValueError as e:  # 'T5Config.<field> must be positive, got 0'
      field, _, why = str(e).split('.', 1)[1].partition(' ')
      raise ConfigError(f'config.model.t5.{field}: {why}') from None
  spec = FinetuneSpec(model=ModelSpec(t5=t5, vocab_size=vocab, **m), data=DataSpec(**d),
                      optim=OptimSpec(**o), **top)
  _validate(spec)
  return spec


def _validate(s: FinetuneSpec):
  _require(bool(s.workdir), 'workdir', 'a directory', s.workdir)
  for field in ('steps', 'log_every', 'checkpoint_every', 'keep_checkpoints', 'bleu_batch_size'):
    _require(getattr(s, field) > 0, field, '> 0', getattr(s, field))
  _require(s.eval_every >= 0, 'eval_every', '>= 0', s.eval_every)
  _require(s.throttle_s >= 0, 'throttle_s', '>= 0', s.throttle_s)
  _require(len(s.mesh_shape) == 2, 'mesh_shape', '(data, model), e.g. (-1, 1)', s.mesh_shape)
  m, d, o = s.model, s.data, s.optim
  _require(m.param_dtype in DTYPES, 'model.param_dtype', f'one of {DTYPES}', m.param_dtype)
  _require(m.export_dtype in DTYPES, 'model.export_dtype', f'one of {DTYPES}', m.export_dtype)
  _require(bool(d.task), 'data.task', 'a task name', d.task)
  _require(bool(d.tokenizer or m.init_from), 'data.tokenizer',
           "set (it may be '' only with model.init_from)", d.tokenizer)
  for field in ('source_buckets', 'target_buckets'):
    b = getattr(d, field)
    _require(len(b) > 0 and all(x > 1 for x in b) and list(b) == sorted(set(b)), f'data.{field}',
             'increasing lengths > 1', b)
  _require(len(d.source_buckets) == len(d.target_buckets), 'data.target_buckets',
           f'as many buckets as data.source_buckets ({len(d.source_buckets)})', d.target_buckets)
  _require(d.long_examples in LONG_EXAMPLES, 'data.long_examples', f'one of {LONG_EXAMPLES}',
           d.long_examples)
  _require(d.batch_size > 0, 'data.batch_size', '> 0', d.batch_size)
  for field in ('train_examples', 'eval_examples', 'bleu_examples'):
    _require(getattr(d, field) >= 0, f'data.{field}', '>= 0', getattr(d, field))
  _require(o.name in OPTIMIZERS, 'optim.name', f'one of {OPTIMIZERS}', o.name)
  _require(o.schedule in SCHEDULES, 'optim.schedule', f'one of {SCHEDULES}', o.schedule)
  _require(o.learning_rate > 0, 'optim.learning_rate', '> 0', o.learning_rate)
  _require(o.warmup_steps >= 0, 'optim.warmup_steps', '>= 0', o.warmup_steps)
  _require(0 <= o.end_lr_fraction <= 1, 'optim.end_lr_fraction', 'in [0, 1]', o.end_lr_fraction)
  _require(o.weight_decay >= 0, 'optim.weight_decay', '>= 0', o.weight_decay)
  _require(0 <= o.b1 < 1, 'optim.b1', 'in [0, 1)', o.b1)
  _require(0 < o.b2 < 1, 'optim.b2', 'in (0, 1)', o.b2)
  _require(o.clip_norm >= 0, 'optim.clip_norm', '>= 0 (0 = off)', o.clip_norm)
  _require(0 <= o.label_smoothing < 1, 'optim.label_smoothing', 'in [0, 1)', o.label_smoothing)
  _require(o.z_loss >= 0, 'optim.z_loss', '>= 0', o.z_loss)
  for field, path in (('model.init_from', m.init_from), ('data.distill_from', d.distill_from)):
    if path and (path.startswith(('.', '/', '~')) or path.count('/') > 1):
      _require(os.path.isfile(os.path.join(os.path.expanduser(path), 'config.json')), field,
               'a checkpoint directory with config.json (or a hub id)', path)


