"""Array operations whose textbook form XLA:CPU compiles slowly on the decode path.

`jnp.argmax` lowers to a variadic (value, index) reduction that XLA:CPU does not vectorise:
over a [K, V] block of logits it cost ~54 us at K = 6, V = 4000 (the target's whole 1-token
step is ~700 us) and ~1 ms at 64 rows. `argmax` below is two plain reductions (a max, then the
smallest index holding it), which vectorise: ~10 us for the same block. Same result, including
the first index on ties; the first NaN of a row only where the max reduction propagates NaN
(XLA:CPU's need not; the kernel below always returns it). Where the CPU kernels are built,
a float argmax over the last axis on the CPU is one kernel call (cpu_kernels.argmax): XLA:CPU
rewrites each of those two reductions into three thunks, ~10 us per draft token on the decode path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def argmax(x, axis: int = -1):
  """jnp.argmax(x, axis) as int32 (first index of the maximum; first NaN wins, as jnp's, on the
  kernel; see the module docstring for the fallback)."""
  axis = axis % x.ndim
  if (ARGMAX_KERNEL and axis == x.ndim - 1 and jnp.issubdtype(x.dtype, jnp.floating)
      and x.shape[-1] > 0):
    kernel = ARGMAX_KERNEL[0]()
    if kernel is not None:
      return jax.lax.platform_dependent(x, cpu=kernel, default=_argmax)
  return _argmax(x, axis)


# specjax.models.cpu_kernels registers here a callable that returns its argmax kernel while it
# is built and wanted (None otherwise); this module stays below the models in the layering.
ARGMAX_KERNEL: list = []


def _argmax(x, axis: int = -1):
  axis = axis % x.ndim
  m = jnp.max(x, axis=axis, keepdims=True)
  hit = (x == m) | (jnp.isnan(x) & jnp.isnan(m)) if jnp.issubdtype(x.dtype, jnp.floating) else (
      x == m)
  n = x.shape[axis]
  shape = [1] * x.ndim
  shape[axis] = n
  iota = jnp.arange(n, dtype=jnp.int32).reshape(shape)
  return jnp.min(jnp.where(hit, iota, n), axis=axis).astype(jnp.int32)
