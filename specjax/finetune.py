"""Training and fine-tuning T5 models with optax, bucketed batches and orbax checkpoints.

  python -m specjax.finetune --config=configs/finetune/bible_target.py
  python -m specjax.finetune --config=configs/finetune/wmt_ende_v11.py:base --config.workdir=runs/x

`train(config)` is the library entry (a ConfigDict or a FinetuneSpec; notebooks call it too); `main`
only parses flags. Re-running the same command resumes from the newest checkpoint in
`workdir/checkpoints` and stops at the same total number of steps.

Flow: the ConfigDict becomes a frozen `FinetuneSpec` (validated in `finetune_spec`, one-line
`ConfigError`s naming the field) -> examples tokenised once (cached in `workdir/cache`; optionally
the targets replaced by a teacher's greedy outputs, i.e. sequence-level distillation) -> a model
from scratch (`init_params`) or from a Hugging Face checkpoint (`load_t5`) -> jit'd train steps
with donated state -> orbax `CheckpointManager` saves (params, opt_state, step and the data
position) -> dev loss every `eval_every` steps, BLEU on a dev subset at the end -> `save_t5`
export (atomic).

Batches: example i goes to the smallest bucket b with len(source) <= source_buckets[b] and
len(target) <= target_buckets[b] and is padded to those lengths, so the train step compiles once
per bucket. Longer examples are dropped or truncated (`data.long_examples`). Epoch e's order comes
from a numpy Generator seeded with (seed, e); the data position (epoch, batch index) and that
Generator's state are saved with every checkpoint, so a resumed run sees exactly the batches an
uninterrupted one would have.

Shape legend: B batch, S source length, T target length, V vocab.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax import sharding as sharding_lib
from specjax.checkpoints import load_t5, load_tokenizer, resolve_checkpoint, save_t5
from specjax.config import ConfigError
from specjax.decoding import autoregressive_decode
from specjax.t5 import T5Config, T5Model, init_params, shift_right, teacher_forced_logits

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


# ----------------------------------------------------------------------------- data


def load_examples(d: DataSpec, split: str) -> tuple[list[str], list[str]]:
  """(sources, targets) of a split: the shipped corpus by field names, else specjax.data.load_task
  (which adds the task's own prefix); `d.prefix` is prepended on top."""
  from specjax import data as data_lib
  if d.task == 'bible_en_es':
    records = data_lib.load_pairs(split)
    sources, targets = [r[d.source_field] for r in records], [r[d.target_field] for r in records]
  else:
    sources, targets = data_lib.load_task(d.task, split)
  return [d.prefix + s for s in sources], list(targets)


def get_tokenizer(spec: FinetuneSpec):
  name = spec.data.tokenizer or spec.model.init_from
  if name == 'bible':
    from specjax import data as data_lib
    return data_lib.bible_tokenizer()
  tok = load_tokenizer(name)
  if tok is None:
    raise FileNotFoundError(f'config.data.tokenizer: no tokenizer files in {name}')
  return tok


def encode_texts(tokenizer, texts, max_len: int | None, eos_id: int) -> list[np.ndarray]:
  """Token ids ending with EOS; longer than max_len: first max_len - 1 tokens + EOS."""
  ids = tokenizer(list(texts), add_special_tokens=False).input_ids
  out = []
  for x in ids:
    x = list(x)
    if max_len is not None and len(x) > max_len - 1:
      x = x[:max_len - 1]
    out.append(np.asarray(x + [eos_id], np.int32))
  return out


def _bucket_of(src_lens, tgt_lens, d: DataSpec) -> np.ndarray:
  """Smallest bucket holding both sides (-1: longer than the last bucket)."""
  sb, tb = np.asarray(d.source_buckets), np.asarray(d.target_buckets)
  fits = (np.asarray(src_lens)[:, None] <= sb[None]) & (np.asarray(tgt_lens)[:, None] <= tb[None])
  return np.where(fits.any(1), np.argmax(fits, axis=1), -1)


def pad_batch(seqs, length: int, rows: int | None = None) -> np.ndarray:
  out = np.zeros((rows or len(seqs), length), np.int32)
  for i, s in enumerate(seqs):
    out[i, :len(s)] = s
  return out


@dataclasses.dataclass
class Tokenized:
  """One split, tokenised: sources[i] / targets[i] int32 ids ending with EOS; texts for BLEU."""
  sources: list[np.ndarray]
  targets: list[np.ndarray]
  target_texts: list[str]


def _flat(seqs):
  lens = np.asarray([len(s) for s in seqs], np.int64)
  flat = np.concatenate(seqs) if seqs else np.zeros((0,), np.int32)
  return flat.astype(np.int32), lens


def _unflat(flat, lens):
  return list(np.split(flat, np.cumsum(lens)[:-1])) if len(lens) else []


def tokenize_split(spec: FinetuneSpec, tokenizer, split: str, limit: int = 0,
                   distill_from: str = '', log=print) -> Tokenized:
  """Tokenises a split once; later calls (and resumed runs) read workdir/cache/<split>-<key>.npz.

  The key covers the texts, the tokenizer's vocabulary and the length settings. With
  `distill_from` (a checkpoint) the targets are that model's greedy outputs (sequence-level
  distillation); examples whose source is too long, or whose output does not end within the last
  target bucket, keep their reference.
  """
  d = spec.data
  sources, targets = load_examples(d, split)
  if limit and limit < len(sources):  # a seeded random subset, in corpus order
    keep = np.sort(np.random.default_rng(spec.seed).choice(len(sources), limit, replace=False))
    sources, targets = [sources[i] for i in keep], [targets[i] for i in keep]
  eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 1
  sha = lambda x: hashlib.sha1(x.encode()).hexdigest()
  key = json.dumps([sha('\0'.join(sources + targets)),
                    sha(json.dumps(sorted(tokenizer.get_vocab().items()))),
                    d.source_buckets[-1], d.target_buckets[-1], d.long_examples, split,
                    _fingerprint(distill_from) if distill_from else ''])
  cache = Path(spec.workdir) / 'cache' / f'{split}-{sha(key)[:12]}.npz'
  if cache.is_file():
    z = np.load(cache, allow_pickle=False)
    return Tokenized(_unflat(z['src'], z['src_len']), _unflat(z['tgt'], z['tgt_len']), targets)
  truncate = d.long_examples == 'truncate'
  src = encode_texts(tokenizer, sources, d.source_buckets[-1] if truncate else None, eos)
  tgt = encode_texts(tokenizer, targets, d.target_buckets[-1] if truncate else None, eos)
  if distill_from:
    t0 = time.time()
    fits = [i for i, s in enumerate(src) if len(s) <= d.source_buckets[-1]]
    log(f'distillation: decoding {len(fits)} {split} sources greedily with {distill_from}')
    out = greedy_ids(load_t5(distill_from), [src[i] for i in fits], d, spec.bleu_batch_size,
                     progress=spec.progress)
    done = [(i, o) for i, o in zip(fits, out) if len(o) and o[-1] == eos]
    for i, o in done:
      tgt[i] = o
    log(f'distillation: {len(done)}/{len(src)} targets from the teacher in '
        f'{time.time() - t0:.0f}s')
  cache.parent.mkdir(parents=True, exist_ok=True)
  s_flat, s_len = _flat(src)
  t_flat, t_len = _flat(tgt)
  tmp = cache.with_name(cache.name + f'.tmp{os.getpid()}.npz')
  np.savez(tmp, src=s_flat, src_len=s_len, tgt=t_flat, tgt_len=t_len)
  os.replace(tmp, cache)
  return Tokenized(src, tgt, targets)


def _fingerprint(path: str) -> str:
  p = resolve_checkpoint(path)
  st = [(f.name, f.stat().st_size, int(f.stat().st_mtime)) for f in sorted(p.glob('*.safetensors'))]
  return f'{p}:{st}'


class Batches:
  """Shuffled, length-bucketed training batches of one split, restartable from `state()`.

  Each epoch, every bucket's examples are permuted and cut into batches of `batch_size` (a
  remainder below batch_size sits the epoch out); the batches of all buckets are then shuffled.
  """

  def __init__(self, data: Tokenized, d: DataSpec, seed: int, train: bool = True):
    self.data, self.d, self.seed = data, d, seed
    bucket = _bucket_of([len(s) for s in data.sources], [len(t) for t in data.targets], d)
    self.kept = np.flatnonzero(bucket >= 0)
    self.bucket = bucket
    self.batches_per_epoch = sum(
        int(np.sum(bucket == b)) // d.batch_size for b in range(len(d.source_buckets)))
    if train and self.batches_per_epoch == 0:
      raise ConfigError(f'config.data.batch_size: {d.batch_size} is larger than every bucket '
                        f'({len(self.kept)} training examples fit the buckets)')
    self.epoch, self.position = 0, 0
    self._order = None

  def _rng(self, epoch: int) -> np.random.Generator:
    return np.random.default_rng([self.seed, epoch])

  def _epoch_order(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    rng = self._rng(epoch)
    batches = []
    for b in range(len(self.d.source_buckets)):
      idx = rng.permutation(np.flatnonzero(self.bucket == b))
      n = len(idx) // self.d.batch_size
      batches += [(b, idx[i * self.d.batch_size:(i + 1) * self.d.batch_size]) for i in range(n)]
    perm = rng.permutation(len(batches))
    return [batches[i] for i in perm]

  def state(self) -> dict[str, Any]:
    """JSON-able position: epoch, batch index, seed and the epoch Generator's initial state."""
    return {'epoch': self.epoch, 'position': self.position, 'seed': self.seed,
            'rng_state': self._rng(self.epoch).bit_generator.state}

  def restore(self, state: dict[str, Any]):
    if int(state['seed']) != self.seed:
      raise ValueError(f'checkpoint data seed {state["seed"]} != config.seed {self.seed}')
    if state['rng_state'] != self._rng(int(state['epoch'])).bit_generator.state:
      raise ValueError('checkpoint data RNG state does not match this numpy version\'s Generator')
    self.epoch, self.position, self._order = int(state['epoch']), int(state['position']), None

  def __next__(self) -> dict[str, np.ndarray]:
    if self._order is None:
      self._order = self._epoch_order(self.epoch)
    b, idx = self._order[self.position]
    self.position += 1
    if self.position == len(self._order):
      self.epoch, self.position, self._order = self.epoch + 1, 0, None
    return self.make_batch(b, idx)

  def make_batch(self, b: int, idx, rows: int | None = None) -> dict[str, np.ndarray]:
    src, tgt = self.data.sources, self.data.targets
    return {'inputs': pad_batch([src[i] for i in idx], self.d.source_buckets[b], rows),
            'labels': pad_batch([tgt[i] for i in idx], self.d.target_buckets[b], rows)}

  def eval_batches(self, batch_size: int):
    """Every kept example once, in bucket order; last batch of a bucket padded with empty rows."""
    for b in range(len(self.d.source_buckets)):
      idx = np.flatnonzero(self.bucket == b)
      for i in range(0, len(idx), batch_size):
        yield self.make_batch(b, idx[i:i + batch_size], rows=batch_size)


# ----------------------------------------------------------------------------- decoding / BLEU


def greedy_ids(model: T5Model, sources: list[np.ndarray], d: DataSpec, batch_size: int,
               progress: bool = False) -> list[np.ndarray]:
  """Greedy outputs (ids ending with EOS, or cut at the last target bucket) for every source."""
  max_new = d.target_buckets[-1]
  order = np.argsort([len(s) for s in sources], kind='stable')
  out: list[np.ndarray | None] = [None] * len(sources)
  chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
  bar = _bar(len(chunks), 'decode', progress)
  for idx in chunks:
    longest = max(len(sources[i]) for i in idx)
    length = next((b for b in d.source_buckets if b >= longest), -(-longest // 16) * 16)
    ids = pad_batch([sources[i] for i in idx], length, rows=batch_size)
    res = autoregressive_decode(model, ids, max_new_tokens=max_new)
    toks, lens = np.asarray(res.tokens), np.asarray(res.lengths)
    for row, i in enumerate(idx):
      out[i] = toks[row, :lens[row]].astype(np.int32)
    bar.update(1)
  bar.close()
  return out


def bleu(model: T5Model, tokenizer, data: Tokenized, d: DataSpec, n: int, batch_size: int,
         progress: bool = False) -> tuple[float, list[str]]:
  """sacrebleu corpus BLEU of greedy outputs on the first n examples, and the hypotheses."""
  import sacrebleu
  n = min(n, len(data.sources))
  ids = greedy_ids(model, data.sources[:n], d, batch_size, progress)
  hyps = tokenizer.batch_decode([list(x) for x in ids], skip_special_tokens=True)
  return sacrebleu.corpus_bleu(hyps, [data.target_texts[:n]]).score, hyps


# ----------------------------------------------------------------------------- model, optimiser


def build_model(spec: FinetuneSpec, tokenizer, key) -> T5Model:
  dtype = jnp.dtype(spec.model.param_dtype)
  if spec.model.init_from:
    with jax.default_device(jax.local_devices(backend='cpu')[0]):  # the host, then shard
      return load_t5(spec.model.init_from, dtype=dtype)
  config = scratch_config(spec, tokenizer)
  return T5Model(params=init_params(config, key, dtype), config=config)


def scratch_config(spec: FinetuneSpec, tokenizer) -> T5Config:
  c = spec.model.t5
  vocab = spec.model.vocab_size or len(tokenizer)
  if vocab < len(tokenizer):
    raise ConfigError(f'config.model.t5.vocab_size: {vocab} is smaller than the tokenizer '
                      f'({len(tokenizer)} tokens)')
  eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 1
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  return dataclasses.replace(c, vocab_size=vocab, eos_token_id=eos, pad_token_id=pad,
                             decoder_start_token_id=pad)


def make_schedule(o: OptimSpec, steps: int):
  lr, warm = o.learning_rate, o.warmup_steps
  if o.schedule == 'constant':
    main = optax.constant_schedule(lr)
  elif o.schedule == 'cosine':
    main = optax.cosine_decay_schedule(lr, max(steps - warm, 1), alpha=o.end_lr_fraction)
  elif o.schedule == 'linear':
    main = optax.linear_schedule(lr, lr * o.end_lr_fraction, max(steps - warm, 1))
  else:  # rsqrt (T5X pre-training): lr * sqrt(warmup / step) after the warmup
    w = max(warm, 1)
    return lambda step: lr * jnp.minimum(1.0, (step + 1) / w) * jax.lax.rsqrt(
        jnp.maximum(step + 1.0, w) / w)
  if warm == 0:
    return main
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warm), main], [warm])


def make_optimizer(o: OptimSpec, steps: int):
  schedule = make_schedule(o, steps)
  if o.name == 'adafactor':  # as T5X: factored second moments, update clipping, param-scaled lr
    opt = optax.adafactor(learning_rate=schedule, momentum=o.b1 or None,
                          weight_decay_rate=o.weight_decay or None)
  else:
    opt = optax.adamw(schedule, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay)
  if o.clip_norm > 0:
    opt = optax.chain(optax.clip_by_global_norm(o.clip_norm), opt)
  return opt, schedule


def loss_fn(params, config: T5Config, batch, label_smoothing=0.0, z_loss=0.0):
  """Teacher-forced token cross-entropy, mean over non-pad label tokens; (loss, (sum, count))."""
  labels_BxT = batch['labels']
  logits_BxTxV = teacher_forced_logits(params, config, batch['inputs'],
                                       shift_right(labels_BxT, config))
  mask_BxT = (labels_BxT != config.pad_token_id).astype(jnp.float32)
  if label_smoothing:
    targets = optax.smooth_labels(jax.nn.one_hot(labels_BxT, logits_BxTxV.shape[-1]),
                                  label_smoothing)
    ce_BxT = optax.softmax_cross_entropy(logits_BxTxV, targets)
  else:
    ce_BxT = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, labels_BxT)
  total_BxT = ce_BxT
  if z_loss:
    total_BxT = ce_BxT + z_loss * jnp.square(jax.nn.logsumexp(logits_BxTxV, axis=-1))
  n = jnp.sum(mask_BxT)
  loss = jnp.sum(total_BxT * mask_BxT) / jnp.maximum(n, 1.0)
  return loss, (jnp.sum(ce_BxT * mask_BxT), n)


def make_steps(spec: FinetuneSpec, config: T5Config, optimizer, state_shardings, batch_sharding):
  """jit'd (train_step(state, batch) -> state, metrics; eval_step(params, batch) -> sums)."""
  o = spec.optim

  def train_step(state, batch):
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (loss, (ce_sum, n)), grads = grad_fn(state['params'], config, batch, o.label_smoothing,
                                         o.z_loss)
    updates, opt_state = optimizer.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    grad_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32)))
                             for g in jax.tree.leaves(grads)))
    metrics = {'loss': loss, 'ce_sum': ce_sum, 'tokens': n, 'grad_norm': grad_norm}
    return {'params': params, 'opt_state': opt_state, 'step': state['step'] + 1}, metrics

  def eval_step(params, batch):
    _, (ce_sum, n) = loss_fn(params, config, batch)
    return ce_sum, n

  batch_in = {'inputs': batch_sharding, 'labels': batch_sharding}
  train = jax.jit(train_step, donate_argnums=0, in_shardings=(state_shardings, batch_in),
                  out_shardings=(state_shardings, None))
  evaluate = jax.jit(eval_step, in_shardings=(state_shardings['params'], batch_in))
  return train, evaluate


# ----------------------------------------------------------------------------- checkpoints


def checkpoint_manager(spec: FinetuneSpec):
  import orbax.checkpoint as ocp
  options = ocp.CheckpointManagerOptions(save_interval_steps=spec.checkpoint_every,
                                         max_to_keep=spec.keep_checkpoints, create=True)
  return ocp.CheckpointManager(os.path.abspath(os.path.join(spec.workdir, 'checkpoints')),
                               options=options, item_names=('state', 'data'))


def _save(mngr, step: int, state, data_state, force=False) -> bool:
  import orbax.checkpoint as ocp
  return mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                 data=ocp.args.JsonSave(data_state)), force=force)


def _restore(mngr, step: int, abstract_state):
  import orbax.checkpoint as ocp
  out = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                                   data=ocp.args.JsonRestore()))
  return out['state'], out['data']


# ----------------------------------------------------------------------------- the loop


class _Log:
  """Lines to stdout (above the progress bar) and to workdir/train.log."""

  def __init__(self, workdir: str):
    self.file = open(os.path.join(workdir, 'train.log'), 'a', buffering=1)

  def __call__(self, msg: str):
    from tqdm import tqdm
    tqdm.write(msg, file=sys.stdout)
    sys.stdout.flush()
    self.file.write(f'{time.strftime("%H:%M:%S")} {msg}\n')

  def close(self):
    self.file.close()


def _bar(total: int, desc: str, enabled: bool, initial: int = 0):
  from tqdm import tqdm
  return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True,
              file=sys.stderr, mininterval=1.0)


def _write_json(path: Path, obj):
  tmp = path.with_name(path.name + f'.tmp{os.getpid()}')
  tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
  os.replace(tmp, path)


def _model_for_run(spec: FinetuneSpec, tokenizer, key, resuming: bool):
  """(model or None when a checkpoint will replace its params, config); the architecture is
  fixed by the first run in workdir/model_config.json, so resuming never re-reads `init_from`."""
  saved = Path(spec.workdir) / 'model_config.json'
  if resuming and saved.is_file():
    return None, T5Config.from_hf(json.loads(saved.read_text()))
  model = build_model(spec, tokenizer, key)
  _write_json(saved, model.config.to_hf())
  return model, model.config


def train(cfg) -> dict[str, Any]:
  """Trains (or resumes) the run described by `cfg`; returns the final metrics and export path."""
  spec = finetune_spec(cfg)
  t_start = time.time()
  Path(spec.workdir).mkdir(parents=True, exist_ok=True)
  log = _Log(spec.workdir)
  mngr = checkpoint_manager(spec)
  try:
    return _train(spec, mngr, log, t_start)
  finally:
    mngr.close()  # waits for a save in flight, also when training failed
    log.close()


def _train(spec: FinetuneSpec, mngr, log, t_start) -> dict[str, Any]:
  workdir = Path(spec.workdir)
  tokenizer = get_tokenizer(spec)
  key = jax.random.PRNGKey(spec.seed)
  latest = mngr.latest_step()
  model, config = _model_for_run(spec, tokenizer, key, resuming=latest is not None)
  if config.vocab_size < len(tokenizer):
    raise ConfigError(f'config.data.tokenizer: {len(tokenizer)} tokens do not fit the model '
                      f'vocabulary ({config.vocab_size})')

  train_data = tokenize_split(spec, tokenizer, 'train', spec.data.train_examples,
                              spec.data.distill_from, log)
  dev_data = tokenize_split(spec, tokenizer, 'dev',
                            max(spec.data.eval_examples, spec.data.bleu_examples))
  batches = Batches(train_data, spec.data, spec.seed)
  n_eval = spec.data.eval_examples
  dev_eval = Batches(Tokenized(dev_data.sources[:n_eval], dev_data.targets[:n_eval], []),
                     spec.data, 0, train=False)
  log(f'{spec.name}: {len(batches.kept)}/{len(train_data.sources)} training examples fit the '
      f'buckets {list(zip(spec.data.source_buckets, spec.data.target_buckets))}; '
      f'{batches.batches_per_epoch} batches of {spec.data.batch_size} per epoch')

  # Shardings of the whole train state, from the compiled init (nothing allocated).
  mesh = sharding_lib.make_mesh(spec.mesh_shape)
  optimizer, schedule = make_optimizer(spec.optim, spec.steps)
  abstract_params = jax.eval_shape(
      lambda: model.params if model is not None else
      init_params(config, key, jnp.dtype(spec.model.param_dtype)))
  p_shard = sharding_lib.param_shardings(abstract_params, config, mesh)
  init_fn = jax.jit(lambda p: {'params': p, 'opt_state': optimizer.init(p),
                               'step': jnp.zeros((), jnp.int32)}, in_shardings=(p_shard,))
  state_shardings = init_fn.lower(abstract_params).compile().output_shardings
  batch_sharding = sharding_lib.batch_sharding(mesh, spec.data.batch_size)

  if latest is not None:
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            jax.eval_shape(init_fn, abstract_params), state_shardings)
    state, data_state = _restore(mngr, latest, abstract)
    batches.restore(data_state)
    log(f'resumed from checkpoint step {int(state["step"])} (epoch {batches.epoch}, '
        f'batch {batches.position})')
  else:
    state = init_fn(jax.device_put(model.params, p_shard))
    log(f'{spec.name}: new run, {sum(x.size for x in jax.tree.leaves(state["params"])):,} params')
  del model
  _write_json(workdir / 'config.json',
              json.loads(json.dumps(dataclasses.asdict(spec), default=str)))
  train_step, eval_step = make_steps(spec, config, optimizer, state_shardings, batch_sharding)

  def dev_loss(params) -> float:
    sums = [eval_step(params, b) for b in dev_eval.eval_batches(spec.data.batch_size)]
    sums = jax.device_get(sums)
    return float(sum(s for s, _ in sums) / max(sum(n for _, n in sums), 1.0))

  step = int(state['step'])
  bar = _bar(spec.steps, spec.name, spec.progress, initial=step)
  window, t_window = [], time.time()
  with open(workdir / 'metrics.jsonl', 'a', buffering=1) as metrics_file:
    while step < spec.steps:
      state, metrics = train_step(state, next(batches))
      step += 1
      window.append(metrics)
      if spec.throttle_s:
        time.sleep(spec.throttle_s)
      bar.update(1)
      if step % spec.log_every == 0 or step == spec.steps:
        m = jax.device_get(window)
        loss = float(sum(x['ce_sum'] for x in m) / max(sum(x['tokens'] for x in m), 1.0))
        rate = len(window) / max(time.time() - t_window, 1e-9)
        bar.set_postfix(loss=f'{loss:.3f}', steps_s=f'{rate:.2f}')
        log(f'step {step} loss {loss:.4f} lr {float(schedule(step)):.2e} '
            f'grad_norm {float(m[-1]["grad_norm"]):.2f} {rate:.2f} steps/s')
        metrics_file.write(json.dumps({'step': step, 'train_loss': loss,
                                       'steps_per_s': rate}) + '\n')
        window, t_window = [], time.time()
      if spec.eval_every and step % spec.eval_every == 0 and step < spec.steps and n_eval:
        loss = dev_loss(state['params'])
        log(f'step {step} dev_loss {loss:.4f}')
        metrics_file.write(json.dumps({'step': step, 'dev_loss': loss}) + '\n')
      if step % spec.checkpoint_every == 0 and _save(mngr, step, state, batches.state()):
        log(f'step {step} checkpoint saving')
    bar.close()
    if mngr.latest_step() != step:
      _save(mngr, step, state, batches.state(), force=True)
    mngr.wait_until_finished()
    results: dict[str, Any] = {'name': spec.name, 'steps': step,
                               'train_wall_s': time.time() - t_start}
    if n_eval:
      results['dev_loss'] = dev_loss(state['params'])
      log(f'step {step} final dev_loss {results["dev_loss"]:.4f}')
      metrics_file.write(json.dumps({'step': step, 'dev_loss': results['dev_loss']}) + '\n')

  model = T5Model(params=state['params'], config=config)
  if spec.data.bleu_examples:
    results['dev_bleu'], hyps = bleu(model, tokenizer, dev_data, spec.data,
                                     spec.data.bleu_examples, spec.bleu_batch_size, spec.progress)
    log(f'dev BLEU {results["dev_bleu"]:.2f} on {min(spec.data.bleu_examples, len(hyps))} '
        f'examples; e.g. {hyps[0]!r}')
  export = Path(spec.export_dir or workdir / 'export')
  dtype = jnp.dtype(spec.model.export_dtype)
  host = jax.tree.map(lambda x: np.asarray(jax.device_get(x)).astype(dtype), state['params'])
  save_t5(T5Model(params=host, config=config), export, tokenizer)
  results['export_dir'] = str(export)
  results['wall_s'] = time.time() - t_start
  log(f'exported {export} ({sum(f.stat().st_size for f in export.iterdir()) / 1e6:.1f} MB); '
      f'done in {results["wall_s"]:.0f}s')
  _write_json(workdir / 'results.json', results)
  return results


# ----------------------------------------------------------------------------- entry point

_CONFIG = None


def main(argv):
  from absl import app, logging
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  try:
    train(_CONFIG.value)
  except ConfigError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  from absl import app
  from ml_collections import config_flags
  _CONFIG = config_flags.DEFINE_config_file('config', None, 'configs/finetune/<run>.py[:arg]',
                                            lock_config=True)
  app.run(main)
