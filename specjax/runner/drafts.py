"""The runner's draft builders: a draft name -> its builder; a name registered with the decoding
draft registry (specjax.decoding.drafts.register, built by the class's `from_target`); any other
name is a feature-head directory (specjax.models.head), optionally with options after a colon
('.../head:vocab=1000', `head_spec`), or a T5 checkpoint.

Read by config validation (`check_name`, the known names) and by the sweep (`build`). A draft
that needs only the target is one class registered in decoding; one that needs the run (its task
data, its output folder: the n-gram drafts) is one `register` call here. A builder gets a
`DraftContext` and returns a draft object for `speculative_decode` (a T5Model or anything
implementing specjax.decoding.protocol.Draft).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Callable

from specjax import configuring
from specjax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DraftContext:
  """What a builder may use: the run's spec, the loaded target and its tokenizer, the task, the
  device mesh, and `identity` (a string that changes whenever the built draft would)."""
  spec: Any
  target: Any
  tokenizer: Any
  task: str
  mesh: Any
  identity: str


Builder = Callable[[DraftContext], Any]
REGISTRY: dict[str, Builder] = {}
# Settings a builder reads besides the task and target: they enter the cell identity (resume).
SETTINGS: dict[str, tuple[str, ...]] = {}


def register(name: str, settings: tuple[str, ...] = ()):
  """Decorator: `@register('bigram', settings=('ngram_data', 'ngram_examples'))`."""
  def wrap(builder: Builder) -> Builder:
    REGISTRY[name] = builder
    SETTINGS[name] = settings
    return builder
  return wrap


def decoding_drafts() -> dict[str, Any]:
  """The drafts registered in decoding (imports the draft modules, hence JAX: called only for a
  name that is neither a builder here nor a path)."""
  from specjax.decoding import drafts  # pylint: disable=import-outside-toplevel
  return drafts.DRAFTS


def is_known(name: str) -> bool:
  """A builder here or a draft registered in decoding (not a path or hub id)."""
  return name in REGISTRY or (not os.path.exists(os.path.expanduser(name))
                              and not is_head_dir(name) and name in decoding_drafts())


def check_name(field: str, name: str):
  """A name that is no registered draft and no existing path but close to a registered name is
  a typo ('unigrm'), not a hub id: ConfigError with the suggestion."""
  if name in REGISTRY or os.path.exists(os.path.expanduser(name)) or is_head_dir(name):
    return
  hint = configuring.did_you_mean(name, REGISTRY)
  if hint:
    raise ConfigError(f'config.{field}: unknown draft {name!r}{hint}')
  if name not in decoding_drafts():
    hint = configuring.did_you_mean(name, decoding_drafts())
    if hint:
      raise ConfigError(f'config.{field}: unknown draft {name!r}{hint}')


# A feature head's options in its draft name, 'DIR:vocab=1000' (FeatureHeadDraft.for_target).
HEAD_OPTIONS = {'vocab': 'the V_d most frequent target ids (a truncated draft vocabulary, '
                         "read from the head's vocab.json)",
                'parallel': '1: one head pass drafts the whole block (a head trained with '
                            'parallel blocks)',
                'weights': "how the CPU kernels store the head's matrices: float32, bfloat16 or "
                           'int8 (a cheaper pass; q changes, the output law does not)'}
# The storage formats `weights=` accepts (specjax.models.cpu_kernels.WEIGHTS; spelled out here so
# that parsing a config imports no JAX).
HEAD_WEIGHTS = ('float32', 'bfloat16', 'int8')


def _head_files(path: str) -> bool:
  return os.path.isfile(os.path.join(os.path.expanduser(path), 'head_config.json'))


def head_path(name: str) -> str | None:
  """The feature-head directory a draft name refers to ('DIR' or 'DIR:OPTIONS'), else None."""
  if _head_files(name):
    return name
  path, sep, _ = name.rpartition(':')
  return path if sep and path and _head_files(path) else None


def is_head_dir(name: str) -> bool:
  """A feature-head directory (head_config.json, specjax.models.head.save_head), with or
  without options."""
  return head_path(name) is not None


def head_spec(name: str) -> tuple[str, dict[str, int | str]]:
  """(directory, options) of a feature-head draft name: 'DIR' -> (DIR, {}), 'DIR:vocab=1000' ->
  (DIR, {'vocab': 1000}); options are `key=value` pairs separated by commas. A one-line
  ValueError naming the option for an unknown key or a bad value (`weights` one of
  HEAD_WEIGHTS, the others positive integers)."""
  path = head_path(name)
  if path is None:
    raise ValueError(f'{name!r} is not a feature-head directory')
  options: dict[str, int | str] = {}
  for item in filter(None, name[len(path) + 1:].split(',')):
    key, _, value = item.partition('=')
    if key not in HEAD_OPTIONS:
      hint = configuring.did_you_mean(key, HEAD_OPTIONS) or f' (known: {", ".join(HEAD_OPTIONS)})'
      raise ValueError(f'unknown feature-head option {key!r} in {name!r}{hint}')
    if key == 'weights':
      if value not in HEAD_WEIGHTS:
        raise ValueError(f'feature-head option weights={value!r} in {name!r}: one of '
                         f'{", ".join(HEAD_WEIGHTS)}')
      options[key] = value
      continue
    try:
      options[key] = int(value)
    except ValueError:
      options[key] = 0
    if options[key] < 1:
      raise ValueError(f'feature-head option {key}={value!r} in {name!r}: a positive integer')
    if key == 'parallel' and options[key] != 1:
      raise ValueError(f'feature-head option parallel={value!r} in {name!r}: 1 or left out')
  return path, options


def build(spec, name: str, target, tokenizer, task: str, mesh=None, identity: str = ''):
  """The draft called `name` for this target and task (a registered strategy, a feature-head
  directory, which reads this target, or a T5 checkpoint)."""
  ctx = DraftContext(spec, target, tokenizer, task, mesh, identity)
  if name in REGISTRY:
    return REGISTRY[name](ctx)
  if is_known(name):
    return decoding_drafts()[name].from_target(target)
  if is_head_dir(name):
    try:
      return head_draft(target, name)
    except ValueError as e:
      raise ConfigError(f'config.drafts: {e}') from None
  return _checkpoint(ctx, name)


def head_draft(target, name: str):
  """The FeatureHeadDraft a head draft name ('DIR:vocab=2582,weights=int8') makes for `target`,
  every option applied (the runner and the experiments build heads here). ValueError for a bad
  name or option."""
  from specjax.decoding.feature_head import FeatureHeadDraft  # pylint: disable=import-outside-toplevel
  path, options = head_spec(name)
  return FeatureHeadDraft.for_target(target, os.path.expanduser(path), vocab=options.get('vocab'),
                                     weights=options.get('weights'),
                                     parallel=bool(options.get('parallel')))


def _checkpoint(ctx: DraftContext, path: str):
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.models.checkpoints import load_t5  # pylint: disable=import-outside-toplevel
  dtype = jnp.bfloat16 if ctx.spec.dtype == 'bfloat16' else jnp.float32
  # 'lossless': a bf16-saved draft streams bf16 on the CPU kernels -- the same q, half the bytes.
  model = load_t5(path, dtype=dtype, mesh=ctx.mesh, quantize='lossless')
  if model.config.vocab_size != ctx.target.config.vocab_size:
    raise ConfigError(
        f'config.drafts: {path} has vocab_size {model.config.vocab_size}, the target has '
        f'{ctx.target.config.vocab_size}; the draft must share the target vocabulary')
  return model


# Listed here too so that config validation knows the name without importing the drafts (JAX).
register('prompt_lookup')(lambda ctx: decoding_drafts()['prompt_lookup'].from_target(ctx.target))


def _ngram(kind: str, ctx: DraftContext):
  """Fitted once per (task, data, target, size); cached next to the results under a name that
  hashes what it was fitted from, so a changed setting never reuses a stale fit."""
  from specjax.decoding import drafts  # pylint: disable=import-outside-toplevel
  spec = ctx.spec
  tag = hashlib.sha256(ctx.identity.encode()).hexdigest()[:12]
  cache = os.path.join(spec.output_dir, f'{kind}_{ctx.task}_{spec.ngram_examples}_{tag}.npz')
  if os.path.exists(cache):
    return drafts.load_ngram(cache)
  token_lists = [ctx.tokenizer(t)['input_ids'] for t in _ngram_texts(spec, ctx.task)]
  fit = drafts.fit_unigram if kind == 'unigram' else drafts.fit_bigram
  fitted = fit(token_lists, ctx.target.config.vocab_size)
  os.makedirs(spec.output_dir, exist_ok=True)
  tmp = cache + '.tmp.npz'
  drafts.save_ngram(fitted, tmp)
  os.replace(tmp, cache)
  return fitted


register('unigram', ('ngram_data', 'ngram_examples'))(lambda ctx: _ngram('unigram', ctx))
register('bigram', ('ngram_data', 'ngram_examples'))(lambda ctx: _ngram('bigram', ctx))


def _ngram_texts(spec, task: str) -> list[str]:
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
