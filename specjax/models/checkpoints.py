"""Hugging Face T5 checkpoints <-> specjax params.

`load_t5(path_or_hub_id)` reads a Hugging Face T5 directory (config.json plus model.safetensors,
sharded safetensors with model.safetensors.index.json, pytorch_model.bin, or sharded .bin with
pytorch_model.bin.index.json) into a `T5Model`; `save_t5` writes one back that both `load_t5` and
transformers' `T5ForConditionalGeneration.from_pretrained` read.

Names: Hugging Face tensor names are mapped to params paths by one explicit table, `RULES`
(regex on the name -> params path, plus the transform: 'linear' transposes PyTorch's [out, in]
to our [in, out]; 'embedding' ([V, D] tables, [NB, H] relative-bias tables) and 'vector'
(norm weights [D]) are kept as stored). `save_t5` walks the same table backwards.

Streaming: tensors are read one at a time (safetensors `safe_open` per tensor; torch.load with
mmap for .bin), converted on the host, placed with `jax.device_put(x, sharding)` and the host copy
dropped, so the float32 host copy of the whole model never exists at once. With `mesh`, each
tensor goes straight to its `NamedSharding` (specjax.models.sharding's partition rules).

Tying: the head is tied iff `lm_head.weight` is absent or bit-equal to `shared.weight`; the
logit scaling flag (`scale_decoder_outputs`, else `tie_word_embeddings` is not False) comes from
config.json independently. transformers 5 always writes `tie_word_embeddings: true` (it forces it)
and keeps untied v1.1 heads by saving a distinct `lm_head.weight`, so the tensors are the only
reliable signal. `encoder.embed_tokens.weight` / `decoder.embed_tokens.weight` (aliases written
by transformers 4) must equal `shared.weight`.

Every check names the tensor or file: unknown name, tensor that does not fit config.json, missing
tensors, wrong shape, alias that differs from `shared`, corrupt file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import cpu_kernels
from specjax.models.t5 import T5Config, T5Model, bf16_exact, init_params

__all__ = ['RULES', 'load_t5', 'load_tokenizer', 'save_t5', 'read_config', 'checkpoint_tensors',
           'convert_state_dict', 'resolve_checkpoint', 'to_hf_state_dict']

CONFIG_NAME = 'config.json'
SAFETENSORS_NAME = 'model.safetensors'
SAFETENSORS_INDEX = 'model.safetensors.index.json'
BIN_NAME = 'pytorch_model.bin'
BIN_INDEX = 'pytorch_model.bin.index.json'
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'spiece.model',
                   'special_tokens_map.json', 'added_tokens.json')
HUB_PATTERNS = ['config.json', 'generation_config.json', '*.safetensors',
                'model.safetensors.index.json', 'pytorch_model*.bin',
                'pytorch_model.bin.index.json', *TOKENIZER_FILES]

WEIGHT_FILES = (SAFETENSORS_INDEX, SAFETENSORS_NAME, BIN_INDEX, BIN_NAME)  # in order of preference

SHARED = 'shared.weight'
LM_HEAD = 'lm_head.weight'
ALIASES = ('encoder.embed_tokens.weight', 'decoder.embed_tokens.weight')
# Present in some old checkpoints; transformers ignores it too (cross-attention has no bias).
IGNORED = ('decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight',)


# ----------------------------------------------------------------------------- the rule table


@dataclasses.dataclass(frozen=True)
class Rule:
  """One family of tensors: `template` ({i}: layer index), its regex, its params path."""
  template: str  # Hugging Face name, e.g. 'encoder.block.{i}.layer.0.SelfAttention.q.weight'
  path: Callable[..., tuple]  # layer index (if any) -> params path
  transform: str  # 'linear' | 'embedding' | 'vector'

  @property
  def regex(self) -> re.Pattern:
    return re.compile('^' + re.escape(self.template).replace(r'\{i\}', r'(\d+)') + '$')

  @property
  def per_layer(self) -> bool:
    return '{i}' in self.template


def _layer_rules(stack: str, hf_sub: str, ours: str, transform: str) -> Rule:
  return Rule(f'{stack}.block.{{i}}.{hf_sub}', lambda i, s=stack, o=ours: (s, 'layers', i, o),
              transform)


def _build_rules() -> list[Rule]:
  rules = [
      Rule(SHARED, lambda: ('shared',), 'embedding'),  # [V, D]
      Rule(LM_HEAD, lambda: ('lm_head',), 'linear'),  # [V, D] -> [D, V]
      Rule('encoder.final_layer_norm.weight', lambda: ('encoder', 'final_norm'), 'vector'),
      Rule('decoder.final_layer_norm.weight', lambda: ('decoder', 'final_norm'), 'vector'),
      # [NB, H] as stored in HF (an nn.Embedding), only in block 0.
      Rule('encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight',
           lambda: ('encoder', 'rel_bias'), 'embedding'),
      Rule('decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight',
           lambda: ('decoder', 'rel_bias'), 'embedding'),
  ]
  for x in 'qkvo':
    rules.append(_layer_rules('encoder', f'layer.0.SelfAttention.{x}.weight', x, 'linear'))
    rules.append(_layer_rules('decoder', f'layer.0.SelfAttention.{x}.weight', f'self_{x}',
                              'linear'))
    rules.append(_layer_rules('decoder', f'layer.1.EncDecAttention.{x}.weight', f'cross_{x}',
                              'linear'))
  rules += [
      _layer_rules('encoder', 'layer.0.layer_norm.weight', 'attn_norm', 'vector'),
      _layer_rules('encoder', 'layer.1.layer_norm.weight', 'ffn_norm', 'vector'),
      _layer_rules('decoder', 'layer.0.layer_norm.weight', 'self_norm', 'vector'),
      _layer_rules('decoder', 'layer.1.layer_norm.weight', 'cross_norm', 'vector'),
      _layer_rules('decoder', 'layer.2.layer_norm.weight', 'ffn_norm', 'vector'),
  ]
  for w in ('wi', 'wi_0', 'wi_1', 'wo'):
    rules.append(_layer_rules('encoder', f'layer.1.DenseReluDense.{w}.weight', w, 'linear'))
    rules.append(_layer_rules('decoder', f'layer.2.DenseReluDense.{w}.weight', w, 'linear'))
  return rules


RULES: list[Rule] = _build_rules()
_COMPILED = [(rule.regex, rule) for rule in RULES]


def match_rule(name: str) -> tuple[Rule, tuple] | None:
  """The rule and params path of a Hugging Face tensor name (None if no rule matches)."""
  hits = []
  for regex, rule in _COMPILED:
    m = regex.match(name)
    if m:
      hits.append((rule, rule.path(*(int(g) for g in m.groups()))))
  if len(hits) > 1:  # a bug in the table, not in the checkpoint
    raise ValueError(f'tensor {name!r} matches {len(hits)} rules: {[r.template for r, _ in hits]}')
  return hits[0] if hits else None


def _expected_shapes(config: T5Config) -> dict[tuple, tuple]:
  """params path -> shape for every param the config calls for (lm_head included)."""
  untied = dataclasses.replace(config, tie_word_embeddings=False)
  tree = jax.eval_shape(lambda: init_params(untied, jax.random.PRNGKey(0)))
  return {path: tuple(leaf.shape) for path, leaf in _flatten(tree)}


def _flatten(tree, prefix=()) -> Iterable[tuple[tuple, Any]]:
  if isinstance(tree, dict):
    for k, v in tree.items():
      yield from _flatten(v, prefix + (k,))
  elif isinstance(tree, (list, tuple)):
    for i, v in enumerate(tree):
      yield from _flatten(v, prefix + (i,))
  else:
    yield prefix, tree


def _hf_name(path: tuple) -> str:
  """Inverse of the table: params path -> Hugging Face name."""
  for rule in RULES:
    if rule.per_layer:
      if len(path) == 4 and path[:2] == rule.path(0)[:2] and path[3] == rule.path(0)[3]:
        return rule.template.format(i=path[2])
    elif rule.path() == path:
      return rule.template
  raise KeyError(f'no Hugging Face name for params path {path}')


def _hf_shape(shape: tuple, transform: str) -> tuple:
  return tuple(reversed(shape)) if transform == 'linear' else tuple(shape)


# ----------------------------------------------------------------------------- tensor sources


def _one_line(err: BaseException) -> str:
  return ' '.join(str(err).split()) or type(err).__name__


class TensorSource:
  """Lazy name -> tensor mapping: shapes without reading data, one tensor read at a time."""

  def keys(self) -> list[str]:
    raise NotImplementedError

  def shape(self, name: str) -> tuple:
    raise NotImplementedError

  def load(self, name: str) -> np.ndarray:
    raise NotImplementedError

  def close(self):
    pass

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


class DictSource(TensorSource):
  """In-memory tensors (numpy, jax or torch arrays)."""

  def __init__(self, tensors: dict[str, Any]):
    self._tensors = tensors

  def keys(self):
    return list(self._tensors)

  def shape(self, name):
    return tuple(self._tensors[name].shape)

  def load(self, name):
    return _to_numpy(self._tensors[name])


class SafetensorsSource(TensorSource):
  """One or more .safetensors files; `files` maps tensor name -> file (from the index)."""

  def __init__(self, files: dict[str, Path]):
    from safetensors import safe_open
    self._files = files
    self._handles = {}
    for file in sorted(set(files.values())):
      if not file.is_file():
        raise FileNotFoundError(f'checkpoint shard not found: {file}')
      try:
        self._handles[file] = safe_open(str(file), framework='np')
      except Exception as e:  # SafetensorError, OSError
        raise ValueError(f'corrupt safetensors file {file}: {_one_line(e)}') from e
    for file, handle in self._handles.items():
      listed = {n for n, f in files.items() if f == file}
      have = set(handle.keys())
      if listed - have:
        name = sorted(listed - have)[0]
        raise ValueError(f'tensor {name!r} is listed in the index for {file} but not stored there')

  @classmethod
  def from_dir(cls, directory: Path, index: str | None):
    if index is None:
      from safetensors import safe_open
      file = directory / SAFETENSORS_NAME
      try:
        with safe_open(str(file), framework='np') as f:
          names = list(f.keys())
      except Exception as e:
        raise ValueError(f'corrupt safetensors file {file}: {_one_line(e)}') from e
      return cls({n: file for n in names})
    return cls({n: directory / f for n, f in _read_index(directory / index).items()})

  def keys(self):
    return list(self._files)

  def shape(self, name):
    return tuple(self._handles[self._files[name]].get_slice(name).get_shape())

  def load(self, name):
    file = self._files[name]
    try:
      return self._handles[file].get_tensor(name)
    except Exception as e:
      raise ValueError(f'corrupt safetensors file {file} (tensor {name!r}): {_one_line(e)}') from e

  def close(self):
    self._handles.clear()


class TorchBinSource(TensorSource):
  """pytorch_model.bin (or shards): torch.load(weights_only=True), memory-mapped when possible."""

  def __init__(self, files: dict[str, Path] | None, single: Path | None = None):
    self._torch = _import_torch()
    self._shards: dict[Path, dict] = {}
    if single is not None:
      sd = self._open(single)
      files = {n: single for n in sd}
    self._files = files

  @classmethod
  def from_dir(cls, directory: Path, index: str | None):
    if index is None:
      return cls(None, single=directory / BIN_NAME)
    return cls({n: directory / f for n, f in _read_index(directory / index).items()})

  def _open(self, file: Path) -> dict:
    if file not in self._shards:
      torch = self._torch
      if not file.is_file():
        raise FileNotFoundError(f'checkpoint shard not found: {file}')
      try:
        try:
          sd = torch.load(str(file), map_location='cpu', weights_only=True, mmap=True)
        except RuntimeError as e:  # legacy (pre-zipfile) format cannot be memory-mapped
          if 'mmap' not in str(e):
            raise
          sd = torch.load(str(file), map_location='cpu', weights_only=True)
      except Exception as e:
        raise ValueError(f'corrupt PyTorch checkpoint {file}: {_one_line(e)}') from e
      if not isinstance(sd, dict):
        raise ValueError(f'corrupt PyTorch checkpoint {file}: expected a state dict, got '
                         f'{type(sd).__name__}')
      self._shards[file] = sd
    return self._shards[file]

  def _tensor(self, name):
    sd = self._open(self._files[name])
    if name not in sd:
      raise ValueError(f'tensor {name!r} is listed in the index for {self._files[name]} but '
                       'not stored there')
    return sd[name]

  def keys(self):
    return list(self._files)

  def shape(self, name):
    return tuple(self._tensor(name).shape)

  def load(self, name):
    return _to_numpy(self._tensor(name))

  def close(self):
    self._shards.clear()


def _import_torch():
  try:
    import torch
  except ImportError as e:
    raise ImportError('reading pytorch_model.bin checkpoints needs PyTorch (pip install torch); '
                      'safetensors checkpoints do not') from e
  return torch


def _to_numpy(x) -> np.ndarray:
  if type(x).__module__.startswith('torch'):
    import ml_dtypes
    import torch
    x = x.detach().cpu()
    if x.dtype == torch.bfloat16:
      return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.numpy()
  return np.asarray(x)


def _read_json(file: Path) -> dict:
  try:
    with open(file) as f:
      data = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f'invalid JSON in {file}: {_one_line(e)}') from e
  except UnicodeDecodeError as e:
    raise ValueError(f'invalid JSON in {file}: {_one_line(e)}') from e
  if not isinstance(data, dict):
    raise ValueError(f'invalid JSON in {file}: expected an object, got {type(data).__name__}')
  return data


def _read_index(file: Path) -> dict[str, str]:
  weight_map = _read_json(file).get('weight_map')
  if not isinstance(weight_map, dict) or not weight_map:
    raise ValueError(f'invalid index {file}: no "weight_map"')
  return weight_map


def checkpoint_tensors(directory) -> TensorSource:
  """The tensors of a checkpoint directory, preferring safetensors over .bin, index over single."""
  directory = Path(directory)
  for name, index, source in ((SAFETENSORS_INDEX, SAFETENSORS_INDEX, SafetensorsSource),
                              (SAFETENSORS_NAME, None, SafetensorsSource),
                              (BIN_INDEX, BIN_INDEX, TorchBinSource),
                              (BIN_NAME, None, TorchBinSource)):
    if (directory / name).is_file():
      return source.from_dir(directory, index)
  raise FileNotFoundError(f'no weights in {directory}: expected {SAFETENSORS_NAME}, '
                          f'{SAFETENSORS_INDEX}, {BIN_NAME} or {BIN_INDEX}')


def read_config(directory) -> T5Config:
  """T5Config from a checkpoint's config.json (tying decided later, from the tensors)."""
  file = Path(directory) / CONFIG_NAME
  if not file.is_file():
    raise FileNotFoundError(f'{file} not found')
  hf = _read_json(file)
  if hf.get('model_type', 't5') not in ('t5', 'mt5'):  # mT5 is T5 v1.1 with a bigger vocab
    raise ValueError(f'{file}: model_type={hf.get("model_type")!r} is not a T5 checkpoint')
  try:
    return T5Config.from_hf(hf)
  except (ValueError, TypeError) as e:
    msg = _one_line(e).removeprefix('config.json: ')
    raise ValueError(f'{file}: {msg}') from e


# ----------------------------------------------------------------------------- conversion


def convert_state_dict(config: T5Config, tensors, dtype=jnp.float32, sharding_fn=None):
  """Hugging Face tensors -> params pytree, tensor by tensor.

  `tensors`: a TensorSource or a dict name -> array ([out, in] PyTorch layout).
  `sharding_fn(params_path, shape) -> Sharding | None`: where each converted array goes (None: default
  device). Returns (params, used_names): `used_names` lists every tensor name consumed, in order,
  one entry per read (a test asserts it is the checkpoint's names, each exactly once). Whether
  'lm_head' is in params says whether the head is untied.
  """
  source = tensors if isinstance(tensors, TensorSource) else DictSource(dict(tensors))
  names = source.keys()
  expected = _expected_shapes(config)

  # 1. Every name has a rule and fits the config; nothing lands twice on one params path.
  assigned: dict[tuple, str] = {}
  kinds: dict[str, tuple[tuple, str]] = {}  # name -> (path, transform)
  aliases, ignored = [], []
  if len(set(names)) != len(names):
    dup = next(n for n in names if names.count(n) > 1)
    raise ValueError(f'tensor {dup!r} appears twice in the checkpoint')
  for name in names:
    if name in ALIASES:
      aliases.append(name)
      continue
    if name in IGNORED:
      ignored.append(name)
      continue
    hit = match_rule(name)
    if hit is None:
      raise ValueError(f'unknown tensor {name!r} in the checkpoint (no rule maps it to a T5 param)')
    rule, path = hit
    if path not in expected:
      raise ValueError(
          f'tensor {name!r} does not fit config.json (feed_forward_proj='
          f'{"gated-gelu" if config.gated else "relu"}, num_layers={config.num_layers}, '
          f'num_decoder_layers={config.num_decoder_layers})')
    if path in assigned:
      raise ValueError(f'tensors {assigned[path]!r} and {name!r} both map to params {path}')
    assigned[path] = name
    kinds[name] = (path, rule.transform)

  # 2. shared.weight may be missing when an alias carries the embedding.
  if ('shared',) not in assigned and aliases:
    name = aliases.pop(0)
    assigned[('shared',)] = name
    kinds[name] = (('shared',), 'embedding')

  # 3. Missing tensors (lm_head is optional: absent means tied).
  def natural(name):
    return [(0, int(t), '') if t.isdigit() else (1, 0, t) for t in name.split('.')]
  missing = sorted((_hf_name(p) for p in expected if p not in assigned and p != ('lm_head',)),
                   key=natural)
  if missing:
    more = f' (and {len(missing) - 5} more)' if len(missing) > 5 else ''
    raise ValueError(f'missing tensors: {", ".join(missing[:5])}{more}')

  # 4. Shapes, before any data is read.
  for name, (path, transform) in kinds.items():
    want = _hf_shape(expected[path], transform)
    got = tuple(source.shape(name))
    if got != want:
      raise ValueError(f'tensor {name!r} has shape {got}, expected {want}')
  for name in aliases:
    want = _hf_shape(expected[('shared',)], 'embedding')
    if tuple(source.shape(name)) != want:
      raise ValueError(f'tensor {name!r} has shape {tuple(source.shape(name))}, expected {want}')

  # 5. Stream: shared first (kept on the host only while the aliases and lm_head are compared).
  used: list[str] = []
  leaves: dict[tuple, jax.Array] = {}

  def place(path, raw, transform):
    x = raw.T if transform == 'linear' else raw
    # A fresh C-ordered copy: never alias a memory-mapped checkpoint into a device array.
    x = np.array(x, dtype=jnp.dtype(dtype), order='C', copy=True)
    sharding = sharding_fn(path, x.shape) if sharding_fn else None
    if sharding is None:
      leaves[path] = jax.device_put(x)
    else:  # make_array_from_callback: on several hosts each process places only its shards
      from specjax.models.sharding import put_sharded  # pylint: disable=import-outside-toplevel
      leaves[path] = put_sharded(x, sharding)

  shared_name = assigned[('shared',)]
  shared_VxD = source.load(shared_name)
  used.append(shared_name)
  place(('shared',), shared_VxD, 'embedding')
  for name in aliases:
    raw = source.load(name)
    used.append(name)
    if not _same(raw, shared_VxD):
      raise ValueError(f'tensor {name!r} differs from {shared_name!r}: T5 ties the token '
                       'embeddings, so the checkpoint is inconsistent')
    del raw
  tied = True
  head_name = assigned.get(('lm_head',))
  if head_name is not None:
    head_VxD = source.load(head_name)
    used.append(head_name)
    tied = _same(head_VxD, shared_VxD)
    if not tied:
      place(('lm_head',), head_VxD, 'linear')  # -> [D, V]
    del head_VxD
  del shared_VxD
  for name in ignored:
    used.append(name)  # not read: transformers ignores it as well
  for name, (path, transform) in kinds.items():
    if path in (('shared',), ('lm_head',)):
      continue
    raw = source.load(name)
    used.append(name)
    place(path, raw, transform)
    del raw

  final_config = dataclasses.replace(config, tie_word_embeddings=tied)
  shapes = jax.eval_shape(lambda: init_params(final_config, jax.random.PRNGKey(0)))
  params = _unflatten(shapes, leaves)
  return params, used


def _same(a: np.ndarray, b: np.ndarray) -> bool:
  return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))


def _unflatten(skeleton, leaves: dict[tuple, Any], prefix=()):
  if isinstance(skeleton, dict):
    return {k: _unflatten(v, leaves, prefix + (k,)) for k, v in skeleton.items()}
  if isinstance(skeleton, (list, tuple)):
    return [_unflatten(v, leaves, prefix + (i,)) for i, v in enumerate(skeleton)]
  return leaves[prefix]


# ----------------------------------------------------------------------------- locating checkpoints

_HUB_ID = re.compile(r'^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$')


def _offline() -> bool:
  return os.environ.get('HF_HUB_OFFLINE', '').strip().upper() in ('1', 'ON', 'YES', 'TRUE')


def _looks_like_hub_id(s: str) -> bool:
  # 'google/t5-v1_1-small' contains '/' (os.sep on POSIX), so a path is: absolute, ./ or ~,
  # more than one separator, '..', or a Windows separator.
  return (bool(_HUB_ID.match(s)) and not s.startswith(('.', '/', '~')) and '..' not in s
          and (os.sep == '/' or os.sep not in s))


def resolve_checkpoint(path_or_hub_id, allow_patterns=None, need_weights=True) -> Path:
  """A local directory for `path_or_hub_id`: itself if it is a directory, else a hub snapshot.

  The local Hugging Face cache is tried first; offline (HF_HUB_OFFLINE=1) nothing else is, so a
  model that is not cached fails at once. A cached snapshot without weights (e.g. only the
  tokenizer was fetched) does not count when `need_weights`.
  """
  s = os.fspath(path_or_hub_id)
  p = Path(s).expanduser()
  if p.is_dir():
    return p
  if p.exists():
    raise NotADirectoryError(f'checkpoint path is not a directory: {s}')
  if not _looks_like_hub_id(s):
    raise FileNotFoundError(f'checkpoint directory not found: {s}')
  try:
    from huggingface_hub import snapshot_download
  except ImportError:
    raise FileNotFoundError(f'checkpoint directory not found: {s} (and huggingface_hub is not '
                            'installed to fetch it as a hub id)') from None
  patterns = allow_patterns or HUB_PATTERNS
  try:  # the local cache first: no network, no retries
    cached = Path(snapshot_download(s, allow_patterns=patterns, local_files_only=True))
    if not need_weights or any((cached / n).is_file() for n in WEIGHT_FILES):
      return cached
  except Exception:
    pass
  if _offline():
    raise FileNotFoundError(f'{s!r} is not a local directory and hub model {s!r} is not available '
                            'offline (HF_HUB_OFFLINE=1 and it is not in the local Hugging Face '
                            'cache)') from None
  try:
    return Path(snapshot_download(s, allow_patterns=patterns, etag_timeout=10))
  except Exception as e:
    raise FileNotFoundError(f'{s!r} is not a local directory and hub model {s!r} could not be '
                            f'downloaded (not available offline): {_one_line(e)[:300]}') from None


# ----------------------------------------------------------------------------- public API


def load_t5(path_or_hub_id, dtype=jnp.float32, mesh=None, *, quantize: str | None = None,
            cpu_kernel: bool | None = None) -> T5Model:
  """Loads a Hugging Face T5 checkpoint (directory or hub id): a T5Model with params in `dtype`.

  With `mesh` (specjax.models.sharding.make_mesh), params are placed sharded as they are read.
  `cpu_kernel` (None: on a single CPU device when the kernel builds): also keep the decoder's
  weights packed for the CPU decode kernel (`T5Model.pack`, specjax.models.cpu_kernels).
  `quantize` ('bfloat16' or 'int8'): the decoder's matrices and head hold quantized values (the
  model is then the quantized target, on every path); the packed copy streams them as stored.
  'lossless': 'bfloat16' where that changes no weight (`t5.bf16_exact`: a checkpoint saved in
  bf16, as the shipped pair), else the params as loaded -- the same model, fewer bytes a step
  (what drafts use: a draft's cost is pure overhead of the speculative loop).
  """
  if quantize not in (None, 'float32', 'bfloat16', 'int8', 'lossless'):
    raise ValueError(f"load_t5: quantize={quantize!r}: expected None, 'bfloat16', 'int8' or "
                     "'lossless'")
  directory = resolve_checkpoint(path_or_hub_id)
  config = read_config(directory)
  sharding_fn = None
  if mesh is not None:
    from specjax.models import sharding as sharding_lib  # pylint: disable=import-outside-toplevel

    def sharding_fn(path, shape):
      return sharding_lib.sharding_for_tensor(path, shape, config, mesh)
  with checkpoint_tensors(directory) as source:
    params, _ = convert_state_dict(config, source, dtype=dtype, sharding_fn=sharding_fn)
  config = dataclasses.replace(config, tie_word_embeddings='lm_head' not in params)
  model = T5Model(params=params, config=config)
  if cpu_kernel is None:
    cpu_kernel = mesh is None and jax.default_backend() == 'cpu' and cpu_kernels.available()
  if cpu_kernel and not cpu_kernels.available():
    raise ValueError(f'load_t5: cpu_kernel=True but {cpu_kernels.status()}')
  if quantize == 'lossless':  # only the packed copy's storage can change; XLA's path keeps dtype
    lossless = cpu_kernel and (dtype == jnp.bfloat16 or bf16_exact(params))
    quantize = 'bfloat16' if lossless else None
  if cpu_kernel:
    return model.pack(quantize)
  return model if quantize in (None, 'float32') else model.pack(quantize).unpack()


def load_tokenizer(path_or_hub_id):
  """transformers.AutoTokenizer for a checkpoint, or None if it has no tokenizer files."""
  directory = resolve_checkpoint(path_or_hub_id, allow_patterns=[CONFIG_NAME, *TOKENIZER_FILES],
                                 need_weights=False)
  if not any((directory / f).is_file() for f in TOKENIZER_FILES):
    return None
  from transformers import AutoTokenizer
  return AutoTokenizer.from_pretrained(str(directory))


def to_hf_state_dict(model: T5Model) -> dict[str, np.ndarray]:
  """Host numpy tensors with PyTorch names and [out, in] layout (lm_head only when untied)."""
  out = {}
  for path, leaf in _flatten(model.params):
    name = _hf_name(path)
    transform = match_rule(name)[0].transform
    x = np.asarray(jax.device_get(leaf))
    out[name] = np.ascontiguousarray(x.T if transform == 'linear' else x)
  if model.config.tie_word_embeddings:
    out.pop(LM_HEAD, None)
  return out


def save_t5(model: T5Model, directory, tokenizer=None) -> Path:
  """Writes config.json + model.safetensors (+ tokenizer files) atomically to `directory`.

  Loads back with `load_t5` and with transformers' T5ForConditionalGeneration.from_pretrained.
  An existing `directory` is replaced.
  """
  from safetensors.numpy import save_file
  directory = Path(directory)
  parent = directory.parent
  parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f'.{directory.name}.tmp-', dir=parent))
  try:
    os.chmod(tmp, 0o755)  # mkdtemp makes it private
    with open(tmp / CONFIG_NAME, 'w') as f:
      json.dump(model.config.to_hf(), f, indent=2, sort_keys=True)
    save_file(to_hf_state_dict(model), str(tmp / SAFETENSORS_NAME), metadata={'format': 'pt'})
    os.chmod(tmp / SAFETENSORS_NAME, 0o644)  # safetensors creates it 0600
    if tokenizer is not None:
      tokenizer.save_pretrained(str(tmp))
    if directory.exists():
      old = Path(tempfile.mkdtemp(prefix=f'.{directory.name}.old-', dir=parent))
      os.rename(directory, old / 'x')
      os.rename(tmp, directory)
      shutil.rmtree(old, ignore_errors=True)
    else:
      os.rename(tmp, directory)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return directory
