"""Fine-tuning configs: a ConfigDict becomes a frozen, validated FinetuneSpec here, once.

Every field is documented in configs/finetune/common.py; `specjax.configuring` reads the ConfigDict
into these dataclasses (unknown, missing and unreadable keys), every check here raises a one-line
`ConfigError` naming the field, before anything is loaded or compiled.
"""


from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from specjax import configuring
from specjax.configuring import require
from specjax.errors import ConfigError
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
  dropout_rate: float       # T5 dropout during training (0 = off); never at inference


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
  cache_dir: str = ''       # tokenised-data cache ('' = workdir/cache); runs that share it
                            # decode a teacher's outputs once


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
class HeadSpec:
  """config.head: train a feature head (specjax.models.head) for the frozen model.init_from."""
  d_model: int              # the head's width (its cost: c grows with it)
  num_heads: int            # self-attention heads of the head
  d_kv: int
  d_ff: int
  feature_weight: float     # weight of the smooth-L1 regression onto the target's features
  distribution_weight: float  # weight of KL(p_target || q_head) (the target's T = 1 law)
  feature_noise: float      # uniform noise on the input features, times their RMS (EAGLE)
  unroll: int               # passes per step; pass k > 1 reads the features pass k-1 predicted
  include_references: bool  # train on the references too, beside the target's own outputs
  feature_taps: tuple[int, ...] = ()  # target decoder layers fused beside its final state
  unroll_decay: float = 1.0  # pass k's loss weight is unroll_decay ** (k - 1) (EAGLE-3: 0.8)
  parallel_depth: int = 0   # P blocks that draft tokens 2 .. P + 1 from one pass (parallel mode)
  parallel_ff: int = 256    # their hidden width
  parallel_tokens: bool = False  # block k also reads draft k (a chain, Hydra-style)
  init_from: str = ''       # a head directory to start from (same architecture), e.g. the shipped
  freeze_trunk: bool = False  # train the parallel blocks only; the rest stays init_from's


ONPOLICY_DIVERGENCES = ('tvd', 'fkl')


@dataclasses.dataclass(frozen=True)
class OnPolicySpec:
  """config.onpolicy: on-policy distillation (DistillSpec) of model.init_from from a teacher."""
  teacher: str              # the frozen target whose distribution the draft learns
  divergence: str           # 'tvd' (total variation, 1 - alpha per position) or 'fkl' (KL(p||q))
  temperature: float        # the draft samples its training prefixes at this temperature
  max_new_tokens: int       # length of the sampled prefixes


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
  head: HeadSpec | None = None          # set: train a feature head instead of a T5
  onpolicy: OnPolicySpec | None = None  # set: on-policy distillation of a T5 draft


def finetune_spec(cfg) -> FinetuneSpec:
  """ConfigDict (configs/finetune/common.py) -> validated FinetuneSpec; else a ConfigError."""
  if isinstance(cfg, FinetuneSpec):
    return cfg
  top = configuring.read_fields(FinetuneSpec, cfg, skip=('model', 'head', 'onpolicy'))
  for name, cls in (('head', HeadSpec), ('onpolicy', OnPolicySpec)):
    if name in cfg and cfg[name] is not None:
      top[name] = configuring.read(cls, cfg[name], path=f'{name}.')
  if 'model' not in cfg:
    raise ConfigError('config.model: missing config key')
  m = configuring.read_fields(ModelSpec, cfg['model'], path='model.', skip=('t5', 'vocab_size'))
  t5, vocab = None, 0
  if not m['init_from']:
    if 't5' not in cfg['model']:
      raise ConfigError('config.model.t5: missing config key')
    t5, vocab = _scratch_t5(cfg['model']['t5'])
  spec = FinetuneSpec(model=ModelSpec(t5=t5, vocab_size=vocab, **m), **top)
  _validate(spec)
  return spec


def _scratch_t5(t5_cd) -> tuple[T5Config, int]:
  """config.model.t5 (any subset of T5Config's fields) -> (T5Config, vocab_size as configured)."""
  known = {f.name: f for f in dataclasses.fields(T5Config)}
  kw = {}
  for key in t5_cd.keys():
    if key not in known:
      raise configuring.unknown_key('model.t5.', key, known)
    value = t5_cd[key]
    cast = {bool: configuring.to_bool, float: float}.get(type(known[key].default),
                                                         configuring.to_int)
    try:
      kw[key] = cast(value)
    except (TypeError, ValueError):
      raise ConfigError(f'config.model.t5.{key}: cannot read {value!r}') from None
  vocab = kw.get('vocab_size', 0)
  require(vocab >= 0, 'model.t5.vocab_size', '>= 0 (0 = the tokenizer\'s size)', vocab)
  kw['vocab_size'] = vocab or 1  # placeholder: ModelSpec.vocab_size = 0 means the tokenizer's
  try:
    return T5Config(**kw), vocab
  except TypeError as e:
    raise ConfigError(f'config.model.t5: {e}') from None
  except ValueError as e:  # 'T5Config.<field> must be positive, got 0'
    field, _, why = str(e).split('.', 1)[1].partition(' ')
    raise ConfigError(f'config.model.t5.{field}: {why}') from None


def _validate(s: FinetuneSpec):
  require(bool(s.workdir), 'workdir', 'a directory', s.workdir)
  for field in ('steps', 'log_every', 'checkpoint_every', 'keep_checkpoints', 'bleu_batch_size'):
    require(getattr(s, field) > 0, field, '> 0', getattr(s, field))
  require(s.eval_every >= 0, 'eval_every', '>= 0', s.eval_every)
  require(s.throttle_s >= 0, 'throttle_s', '>= 0', s.throttle_s)
  require(len(s.mesh_shape) == 2, 'mesh_shape', '(data, model), e.g. (-1, 1)', s.mesh_shape)
  m, d, o = s.model, s.data, s.optim
  require(m.param_dtype in DTYPES, 'model.param_dtype', f'one of {DTYPES}', m.param_dtype)
  require(0 <= m.dropout_rate < 1, 'model.dropout_rate', 'in [0, 1)', m.dropout_rate)
  require(m.export_dtype in DTYPES, 'model.export_dtype', f'one of {DTYPES}', m.export_dtype)
  require(bool(d.task), 'data.task', 'a task name', d.task)
  require(bool(d.tokenizer or m.init_from), 'data.tokenizer',
           "set (it may be '' only with model.init_from)", d.tokenizer)
  for field in ('source_buckets', 'target_buckets'):
    b = getattr(d, field)
    require(len(b) > 0 and all(x > 1 for x in b) and list(b) == sorted(set(b)), f'data.{field}',
             'increasing lengths > 1', b)
  require(len(d.source_buckets) == len(d.target_buckets), 'data.target_buckets',
           f'as many buckets as data.source_buckets ({len(d.source_buckets)})', d.target_buckets)
  require(d.long_examples in LONG_EXAMPLES, 'data.long_examples', f'one of {LONG_EXAMPLES}',
           d.long_examples)
  require(d.batch_size > 0, 'data.batch_size', '> 0', d.batch_size)
  for field in ('train_examples', 'eval_examples', 'bleu_examples'):
    require(getattr(d, field) >= 0, f'data.{field}', '>= 0', getattr(d, field))
  require(o.name in OPTIMIZERS, 'optim.name', f'one of {OPTIMIZERS}', o.name)
  require(o.schedule in SCHEDULES, 'optim.schedule', f'one of {SCHEDULES}', o.schedule)
  require(o.learning_rate > 0, 'optim.learning_rate', '> 0', o.learning_rate)
  require(o.warmup_steps >= 0, 'optim.warmup_steps', '>= 0', o.warmup_steps)
  require(0 <= o.end_lr_fraction <= 1, 'optim.end_lr_fraction', 'in [0, 1]', o.end_lr_fraction)
  require(o.weight_decay >= 0, 'optim.weight_decay', '>= 0', o.weight_decay)
  require(0 <= o.b1 < 1, 'optim.b1', 'in [0, 1)', o.b1)
  require(0 < o.b2 < 1, 'optim.b2', 'in (0, 1)', o.b2)
  require(o.clip_norm >= 0, 'optim.clip_norm', '>= 0 (0 = off)', o.clip_norm)
  require(0 <= o.label_smoothing < 1, 'optim.label_smoothing', 'in [0, 1)', o.label_smoothing)
  require(o.z_loss >= 0, 'optim.z_loss', '>= 0', o.z_loss)
  if s.head is not None:
    _validate_head(s.head, m)
  if s.onpolicy is not None:
    o2 = s.onpolicy
    require(o2.divergence in ONPOLICY_DIVERGENCES, 'onpolicy.divergence',
            f'one of {ONPOLICY_DIVERGENCES}', o2.divergence)
    require(o2.temperature > 0, 'onpolicy.temperature', '> 0', o2.temperature)
    require(o2.max_new_tokens > 0, 'onpolicy.max_new_tokens', '> 0', o2.max_new_tokens)
    require(bool(o2.teacher), 'onpolicy.teacher', 'a checkpoint', o2.teacher)
    require(bool(m.init_from), 'model.init_from', 'the draft to distil (a checkpoint)',
            m.init_from)
    require(s.head is None, 'onpolicy', 'unset when config.head is set', 'set')
  for field, path in (('model.init_from', m.init_from), ('data.distill_from', d.distill_from),
                      ('onpolicy.teacher', s.onpolicy.teacher if s.onpolicy else '')):
    if path and (path.startswith(('.', '/', '~')) or path.count('/') > 1):
      require(os.path.isfile(os.path.join(os.path.expanduser(path), 'config.json')), field,
               'a checkpoint directory with config.json (or a hub id)', path)


def _validate_head(h: HeadSpec, m) -> None:
  """config.head's fields (and model.init_from, the target the head reads)."""
  for field in ('d_model', 'num_heads', 'd_kv', 'd_ff', 'unroll'):
    require(getattr(h, field) > 0, f'head.{field}', '> 0', getattr(h, field))
  for field in ('feature_weight', 'distribution_weight', 'feature_noise'):
    require(getattr(h, field) >= 0, f'head.{field}', '>= 0', getattr(h, field))
  require(0 < h.unroll_decay <= 1, 'head.unroll_decay', 'in (0, 1]', h.unroll_decay)
  require(len(set(h.feature_taps)) == len(h.feature_taps) and min(h.feature_taps, default=0)
          >= 0, 'head.feature_taps', 'distinct decoder layer indices >= 0', h.feature_taps)
  require(bool(m.init_from), 'model.init_from', 'the target the head reads (a checkpoint)',
          m.init_from)
  require(h.parallel_depth >= 0, 'head.parallel_depth', '>= 0', h.parallel_depth)
  require(h.parallel_ff > 0, 'head.parallel_ff', '> 0', h.parallel_ff)
  if h.freeze_trunk:
    require(bool(h.init_from) and h.parallel_depth > 0, 'head.freeze_trunk',
            'set only with head.init_from and head.parallel_depth > 0', h.freeze_trunk)
  if h.init_from:
    _check_head_start(h)


def _check_head_start(h: HeadSpec):
  """head.init_from: a head directory whose trunk has the architecture head.* asks for."""
  cfg = os.path.join(os.path.expanduser(h.init_from), 'head_config.json')
  try:
    with open(cfg, encoding='utf-8') as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise ConfigError(f'config.head.init_from: no readable head_config.json in {h.init_from} '
                      f'({type(e).__name__})') from None
  for field in ('d_model', 'num_heads', 'd_kv', 'd_ff', 'feature_taps'):
    want, have = getattr(h, field), saved.get(field, () if field == 'feature_taps' else None)
    if (tuple(want) if field == 'feature_taps' else want) != (
        tuple(have) if field == 'feature_taps' else have):
      raise ConfigError(f'config.head.{field}: {want!r}, but the head in {h.init_from} has '
                        f'{have!r}')
