"""JAX setup for a run: compilation cache, matmul precision, dtype, the device mesh."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from specjax.errors import ConfigError


def setup_jax(spec):
  """Persistent compilation cache (a second run of the same sweep skips XLA compilation) and the
  matmul precision (on accelerators the default runs float32 matmuls in TF32 / bf16 passes)."""
  if spec.matmul_precision:
    jax.config.update('jax_default_matmul_precision', spec.matmul_precision)
  if spec.compilation_cache:
    path = os.path.expanduser(spec.compilation_cache)
    os.makedirs(path, exist_ok=True)
    jax.config.update('jax_compilation_cache_dir', path)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)


def dtype(spec):
  return jnp.bfloat16 if spec.dtype == 'bfloat16' else jnp.float32


def make_mesh(spec):
  """The device mesh of config.mesh_shape, or None for one device; a shape that does not fit the
  devices is a ConfigError (before anything is loaded)."""
  if not spec.mesh_shape:
    return None
  from specjax.models import sharding  # pylint: disable=import-outside-toplevel
  sharding.initialize_distributed()
  try:
    return sharding.make_mesh(spec.mesh_shape)
  except ValueError as e:
    raise ConfigError(f'config.mesh_shape: {e}') from None


def device_label(mesh) -> str:
  """The hardware a cell ran on, for its identity: device kind x count in use."""
  n = mesh.devices.size if mesh is not None else 1
  return f'{jax.devices()[0].device_kind} x{n}'
