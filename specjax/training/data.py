"""Fine-tuning data: examples, tokenisation (cached), bucketed and resumable batches, and the
greedy decoding behind distillation targets and BLEU.

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

import numpy as np

from specjax.models.checkpoints import load_t5, load_tokenizer, resolve_checkpoint
from specjax.errors import ConfigError
from specjax.decoding.loop import autoregressive_decode
from specjax.training.spec import DataSpec, FinetuneSpec
from specjax.models.t5 import T5Model

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
  cache = Path(d.cache_dir or Path(spec.workdir) / 'cache') / f'{split}-{sha(key)[:12]}.npz'
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
  bar = progress_bar(len(chunks), 'decode', progress)
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


def progress_bar(total: int, desc: str, enabled: bool, initial: int = 0):
  """A tqdm progress bar on stderr (off when not `enabled`)."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True,
              file=sys.stderr, mininterval=1.0)
