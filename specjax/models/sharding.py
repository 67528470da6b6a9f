"""SPMD sharding of T5 params, KV caches and batches over a ('data', 'model') device mesh.

Nothing here distributes work by hand: arrays are placed with `jax.sharding.NamedSharding`s and
`jax.jit` (GSPMD / Shardy) propagates the layout through the decoding programs and inserts the
collectives. The same jit'd `speculative_decode` / `autoregressive_decode` run single-device or
sharded; only where the arguments live differs:

    mesh = make_mesh((2, 4))                      # 2-way data parallel x 4-way tensor parallel
    target, draft = shard_model(target, mesh), shard_model(draft, mesh)
    ids = put_sharded(np.asarray(input_ids, np.int32), batch_sharding(mesh, len(input_ids)))
    out = speculative_decode(target, draft, ids, gamma=4, max_new_tokens=64)

No mesh context is needed (`with jax.set_mesh(mesh):` and the deprecated `with mesh:` work too):
the inputs are committed to their shardings and jit follows them. `make_mesh` builds the mesh
with `AxisType.Auto` axes on purpose: `jax.make_mesh` defaults to `Explicit` axes since JAX 0.7,
and explicit ("sharding in types") mode rejects contractions over a sharded dimension (the `o`
and `wo` matmuls, the vocab-sharded embedding gather) unless every op names its output sharding.

Partition rules (T5X style): each params path matches exactly one entry of `PARAM_RULES`, which
names a *logical* axis per dimension; `LOGICAL_AXIS_RULES` maps logical axes to mesh axes:

    shared   [V, D]     ('vocab', 'embed')        -> rows over 'model'
    lm_head  [D, V]     ('embed', 'vocab')        -> columns over 'model'
    q/k/v    [D, H*Dk]  ('embed', 'heads')        -> output (heads) axis over 'model'
    o        [H*Dk, D]  ('heads', 'embed')        -> input (heads) axis over 'model'
    wi*      [D, F]     ('embed', 'mlp')          -> d_ff over 'model'
    wo       [F, D]     ('mlp', 'embed')          -> d_ff over 'model'
    rel_bias [NB, H]    ('buckets', 'rel_heads')  -> heads over 'model'
    norms    [D]        ('embed',)                -> replicated
    batch axes of input_ids and caches            -> 'data'
    caches   [B, H, T|S, Dk]  ('batch', 'kv_heads', 'length', 'kv')

Divisibility fallback: a dimension is sharded only if it divides evenly over its mesh axis,
otherwise that dimension is replicated (the rest of the spec is kept). For the three heads axes
('heads', 'rel_heads', 'kv_heads') the test is on `num_heads`, not on H*Dk: a shard must hold
whole heads so that the [.., H*Dk] -> [.., H, Dk] reshape in attention stays local. Examples on a
model axis of 8: t5-base (12 heads) keeps its attention replicated but shards d_ff and vocab;
a vocab of 32100 (not a multiple of 8) keeps `shared`/`lm_head` replicated. The batch axis falls
back the same way (`batch_sharding(mesh, batch_size)`).

Streaming loaders place one tensor at a time: `sharding_for_tensor(path, shape, config, mesh)`
then `put_sharded(array_or_callback, sharding)`, which goes through
`jax.make_array_from_callback`, so on a multi-host mesh each process only materialises (and with a
callback, only reads) the shards its own devices hold. Call `initialize_distributed()` first thing
on every host of a pod; it is a no-op on one host.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from specjax.models.t5 import DecoderCache, T5Config, T5Model

__all__ = [
    'DATA', 'MODEL', 'MESH_AXES', 'LOGICAL_AXIS_RULES', 'PARAM_RULES', 'make_mesh',
    'logical_axes_for', 'param_partition_specs', 'param_shardings', 'shard_params', 'shard_model',
    'sharding_for_tensor', 'put_sharded', 'cache_partition_spec', 'cache_shardings',
    'constrain_cache', 'batch_sharding', 'shard_batch', 'initialize_distributed',
    'is_multi_host_env',
]

DATA = 'data'
MODEL = 'model'
MESH_AXES = (DATA, MODEL)

# Logical axis -> mesh axis (None: replicated).
LOGICAL_AXIS_RULES: dict[str, str | None] = {
    'batch': DATA,
    'vocab': MODEL,
    'heads': MODEL,      # the joint H*Dk axis of q/k/v (output) and o (input)
    'rel_heads': MODEL,  # H of the relative-position bias tables
    'kv_heads': MODEL,   # H of the KV caches
    'mlp': MODEL,        # d_ff
    'embed': None,       # d_model
    'buckets': None,
    'length': None,
    'kv': None,          # d_kv
}

_LAYER = r'layers/\d+/'
# (regex on the '/'-joined params path, full match) -> logical axis per dimension.
# Every params leaf must match exactly one rule (checked: none or several is an error).
PARAM_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (r'shared', ('vocab', 'embed')),
    (r'lm_head', ('embed', 'vocab')),
    (r'(encoder|decoder)/rel_bias', ('buckets', 'rel_heads')),
    (r'(encoder|decoder)/final_norm', ('embed',)),
    (r'encoder/' + _LAYER + r'(attn_norm|ffn_norm)', ('embed',)),
    (r'decoder/' + _LAYER + r'(self_norm|cross_norm|ffn_norm)', ('embed',)),
    (r'encoder/' + _LAYER + r'[qkv]', ('embed', 'heads')),
    (r'decoder/' + _LAYER + r'(self|cross)_[qkv]', ('embed', 'heads')),
    (r'encoder/' + _LAYER + r'o', ('heads', 'embed')),
    (r'decoder/' + _LAYER + r'(self|cross)_o', ('heads', 'embed')),
    (r'(encoder|decoder)/' + _LAYER + r'(wi|wi_0|wi_1)', ('embed', 'mlp')),
    (r'(encoder|decoder)/' + _LAYER + r'wo', ('mlp', 'embed')),
)
_COMPILED_RULES = tuple((re.compile(r), axes) for r, axes in PARAM_RULES)


# ----------------------------------------------------------------------------- mesh


def make_mesh(mesh_shape: Sequence[int], devices: Sequence[Any] | None = None) -> Mesh:
  """A ('data', 'model') mesh of shape `mesh_shape`; one entry may be -1 ("the rest").

  The product must equal the number of devices (all of `jax.devices()` unless `devices` is
  given). Axes are `AxisType.Auto` (see the module docstring).
  """
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  try:
    shape = [int(s) for s in mesh_shape]
    ok = len(shape) == 2 and all(float(s) == float(o) for s, o in zip(shape, mesh_shape))
  except (TypeError, ValueError):
    ok = False
  if not ok:
    raise ValueError(f'mesh_shape={mesh_shape!r} must be two integers (data, model)')
  if any(s == 0 or s < -1 for s in shape) or shape.count(-1) > 1:
    raise ValueError(f'mesh_shape={tuple(shape)} must be positive integers, at most one of them -1')
  if -1 in shape:
    known = math.prod(s for s in shape if s != -1)
    if n % known:
      raise ValueError(f'mesh_shape={tuple(shape)}: {n} devices do not divide by {known}')
    shape[shape.index(-1)] = n // known
  if math.prod(shape) != n:
    raise ValueError(f'mesh_shape={tuple(shape)} has {math.prod(shape)} devices but there are {n} '
                     f'(the product must equal the device count)')
  axis_types = (AxisType.Auto,) * 2
  try:  # topology-aware device order (TPU rings); plain reshape elsewhere
    return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=axis_types, devices=devices)
  except Exception:  # e.g. an unusual subset of TPU devices: fall back to the given order
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES, axis_types=axis_types)


# ----------------------------------------------------------------------------- rules -> specs


def _path_str(path) -> str:
  if isinstance(path, str):
    return path.strip('/')
  parts = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey):
      k = k.key
    elif isinstance(k, jax.tree_util.SequenceKey):
      k = k.idx
    elif isinstance(k, (jax.tree_util.GetAttrKey,)):
      k = k.name
    parts.append(str(k))
  return '/'.join(parts)


def logical_axes_for(path) -> tuple[str, ...]:
  """The logical axes of the params leaf at `path` (tuple of keys or 'a/b/0/c'); exactly one rule."""
  name = _path_str(path)
  hits = [(pattern.pattern, axes) for pattern, axes in _COMPILED_RULES if pattern.fullmatch(name)]
  if not hits:
    raise ValueError(f'no partition rule matches params path {name!r} (add one to PARAM_RULES)')
  if len(hits) > 1:
    raise ValueError(f'params path {name!r} matches {len(hits)} partition rules: '
                     f'{[h[0] for h in hits]}')
  return hits[0][1]


def _divisor_units(logical: str, dim: int, config: T5Config | None) -> int:
  """The count that must divide over the mesh axis: whole heads for heads axes, else the dim."""
  if logical in ('heads', 'rel_heads', 'kv_heads') and config is not None:
    return config.num_heads
  return dim


def _check_mesh(mesh) -> None:
  names = tuple(mesh.axis_names)
  if not set(MESH_AXES) <= set(names):
    raise ValueError(f'mesh axes {names} must include {MESH_AXES} (build it with make_mesh)')
  explicit = [n for n, t in zip(names, mesh.axis_types) if t == AxisType.Explicit]
  if explicit:
    raise ValueError(f'mesh axes {explicit} are AxisType.Explicit (the default of jax.make_mesh): '
                     'the T5 code relies on sharding propagation, build the mesh with '
                     'specjax.models.sharding.make_mesh or axis_types=(AxisType.Auto,) * 2')


def _spec(logical_axes: Sequence[str | None], shape: Sequence[int], config: T5Config | None,
          mesh: Mesh, what: str) -> P:
  _check_mesh(mesh)
  if len(logical_axes) != len(shape):
    raise ValueError(f'{what}: shape {tuple(shape)} has {len(shape)} dims but the partition rule '
                     f'names {len(logical_axes)} axes {tuple(logical_axes)}')
  out, used = [], set()
  for logical, dim in zip(logical_axes, shape):
    axis = LOGICAL_AXIS_RULES[logical] if logical is not None else None
    if axis is not None:
      size = mesh.shape[axis]
      if size == 1 or axis in used or _divisor_units(logical, dim, config) % size:
        axis = None  # replicate: trivial axis, axis already used, or not divisible
    if axis is not None:
      used.add(axis)
    out.append(axis)
  return P(*out)


def sharding_for_tensor(path, shape: Sequence[int], config: T5Config, mesh: Mesh) -> NamedSharding:
  """The NamedSharding of one params tensor (for streaming loaders): path e.g. ('decoder', 'layers', 3, 'self_q')."""
  spec = _spec(logical_axes_for(path), tuple(shape), config, mesh, f'params {_path_str(path)!r}')
  return NamedSharding(mesh, spec)


def param_partition_specs(params, config: T5Config, mesh: Mesh):
  """A PartitionSpec per params leaf (same tree). Leaves may be arrays or ShapeDtypeStructs."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: _spec(logical_axes_for(path), x.shape, config, mesh,
                            f'params {_path_str(path)!r}'), params)


def param_shardings(params, config: T5Config, mesh: Mesh):
  """A NamedSharding per params leaf (same tree)."""
  return jax.tree.map(lambda s: NamedSharding(mesh, s), param_partition_specs(params, config, mesh))


def shard_params(params, config: T5Config, mesh: Mesh):
  """params placed on `mesh` (each leaf through `put_sharded`, so multi-host safe)."""
  shardings = param_shardings(params, config, mesh)
  return jax.tree.map(lambda x, s: put_sharded(x, s), params, shardings)


def shard_model(model: T5Model, mesh: Mesh) -> T5Model:
  """The same T5Model with its params sharded over `mesh`."""
  return model.replace(params=shard_params(model.params, model.config, mesh))


# ----------------------------------------------------------------------------- placing arrays


def put_sharded(x, sharding: jax.sharding.Sharding, shape: Sequence[int] | None = None,
                dtype=None) -> jax.Array:
  """A global jax.Array with `sharding`, built shard by shard with `jax.make_array_from_callback`.

  `x` is an array (numpy or jax; only the addressable shards are sliced out of it) or a callback
  `index -> array` (index: a tuple of slices into the global array, as make_array_from_callback
  passes) together with the global `shape` (and optionally `dtype`). On a multi-host mesh every
  process calls this with the same arguments and only its own devices' shards are requested, so a
  callback that reads a slice from a checkpoint file reads only that host's part.
  """
  if callable(x) and not hasattr(x, 'shape'):
    if shape is None:
      raise ValueError('put_sharded: a callback needs the global `shape`')
    return jax.make_array_from_callback(tuple(shape), sharding, x, dtype=dtype)
  if isinstance(x, jax.Array):
    if dtype is not None:
      x = x.astype(dtype)
    if x.is_fully_addressable:
      return jax.device_put(x, sharding)  # device-to-device, no host round trip
  arr = np.asarray(x) if dtype is None else np.asarray(x, dtype=dtype)
  if shape is not None and tuple(shape) != arr.shape:
    raise ValueError(f'put_sharded: array shape {arr.shape} != shape {tuple(shape)}')
  return jax.make_array_from_callback(arr.shape, sharding, lambda index: arr[index])


# ----------------------------------------------------------------------------- caches and batches


def _batch_axis(mesh: Mesh, batch_size: int | None):
  size = mesh.shape[DATA]
  if size == 1 or (batch_size is not None and batch_size % size):
    return None
  return DATA


def cache_partition_spec(config: T5Config, mesh: Mesh, batch_size: int | None = None) -> DecoderCache:
  """A DecoderCache of PartitionSpecs: [B, H, T|S, Dk] -> ('data', 'model', None, None), enc_mask [B, S] -> ('data', None).

  Heads fall back to replicated when num_heads does not divide over 'model', the batch when
  `batch_size` does not divide over 'data'.
  """
  _check_mesh(mesh)
  b = _batch_axis(mesh, batch_size)
  h = MODEL if mesh.shape[MODEL] > 1 and config.num_heads % mesh.shape[MODEL] == 0 else None
  kv = P(b, h, None, None)
  n = config.num_decoder_layers
  return DecoderCache(self_k=(kv,) * n, self_v=(kv,) * n, cross_k=(kv,) * n, cross_v=(kv,) * n,
                      enc_mask=P(b, None))


def cache_shardings(config: T5Config, mesh: Mesh, batch_size: int | None = None) -> DecoderCache:
  """cache_partition_spec as NamedShardings."""
  return jax.tree.map(lambda s: NamedSharding(mesh, s),
                      cache_partition_spec(config, mesh, batch_size))


def constrain_cache(cache: DecoderCache, config: T5Config, mesh: Mesh | None = None) -> DecoderCache:
  """Inside jit: pins the cache layout with `with_sharding_constraint` (no-op without a mesh).

  `mesh=None` uses the mesh set by `jax.set_mesh` if any (read inside jit as the abstract mesh);
  with no mesh at all (single device, or sharded arguments without a mesh context) the cache is
  returned unchanged and the layout is left to propagation.
  """
  if mesh is None:
    mesh = jax.sharding.get_abstract_mesh()  # the mesh of `jax.set_mesh`, visible inside jit
    if mesh.empty or not set(MESH_AXES) <= set(mesh.axis_names):
      return cache
  specs = cache_partition_spec(config, mesh, cache.enc_mask.shape[0])
  return jax.tree.map(lambda x, s: jax.lax.with_sharding_constraint(x, NamedSharding(mesh, s)),
                      cache, specs)


def batch_sharding(mesh: Mesh, batch_size: int | None = None, ndim: int = 2) -> NamedSharding:
  """Sharding of a [B, ...] batch (input_ids): rows over 'data', replicated if B does not divide."""
  return NamedSharding(mesh, P(_batch_axis(mesh, batch_size), *([None] * (ndim - 1))))


def shard_batch(x, mesh: Mesh) -> jax.Array:
  """A [B, ...] host batch (e.g. int32 input_ids) placed with `batch_sharding`."""
  arr = np.asarray(x)
  return put_sharded(arr, batch_sharding(mesh, arr.shape[0], arr.ndim))


# ----------------------------------------------------------------------------- multi-host


def _int_env(name: str) -> int | None:
  try:
    return int(os.environ[name])
  except (KeyError, ValueError):
    return None


def is_multi_host_env(environ=None) -> str | None:
  """Names the multi-host launcher detected from the environment, or None (one host).

  Looks only at environment variables (never at devices: JAX must not be initialised yet).
  """
  env = os.environ if environ is None else environ

  def count(name):
    try:
      return int(env.get(name, ''))
    except ValueError:
      return None

  if env.get('JAX_COORDINATOR_ADDRESS'):
    return 'JAX_COORDINATOR_ADDRESS'
  for name in ('TPU_PROCESS_ADDRESSES', 'TPU_WORKER_HOSTNAMES'):
    hosts = [h for h in env.get(name, '').split(',') if h.strip()]
    if len(hosts) > 1:
      return f'TPU pod ({name})'
  if env.get('MEGASCALE_COORDINATOR_ADDRESS'):
    return 'TPU multislice (MEGASCALE_COORDINATOR_ADDRESS)'
  if (count('SLURM_NTASKS') or 0) > 1 and env.get('SLURM_JOB_ID'):
    return 'SLURM (SLURM_NTASKS)'
  if (count('OMPI_COMM_WORLD_SIZE') or 0) > 1 and env.get('OMPI_MCA_orte_hnp_uri'):
    return 'Open MPI (OMPI_COMM_WORLD_SIZE)'
  return None


def initialize_distributed(**kwargs) -> bool:
  """Calls `jax.distributed.initialize()` when running multi-host; a no-op on one host.

  Call it first, before anything touches JAX devices. Multi-host is detected from the environment
  (see `is_multi_host_env`): JAX_COORDINATOR_ADDRESS (with JAX_NUM_PROCESSES and JAX_PROCESS_ID,
  unless passed as kwargs), a TPU pod slice (more than one TPU worker host; JAX finds the
  coordinator itself), SLURM or Open MPI with more than one task. Explicit kwargs
  (coordinator_address, num_processes, process_id, ...) force initialisation. Returns True if
  this call initialised the distributed runtime (False if one host or already initialised).
  """
  if jax.distributed.is_initialized():
    return False
  if not kwargs and is_multi_host_env() is None:
    return False
  if os.environ.get('JAX_COORDINATOR_ADDRESS'):
    for key, env in (('num_processes', 'JAX_NUM_PROCESSES'), ('process_id', 'JAX_PROCESS_ID')):
      if key not in kwargs and _int_env(env) is not None:
        kwargs[key] = _int_env(env)
  jax.distributed.initialize(**kwargs)
  return True

