"""Array operations whose textbook form XLA:CPU compiles slowly on the decode path.

`jnp.argmax` lowers to a variadic (value, index) reduction that XLA:CPU does not vectorise:
over a [K, V] block of logits it cost ~54 us at K = 6, V = 4000 (the target's whole 1-token
step is ~700 us) and ~1 ms at 64 rows. `argmax` below is two plain reductions (a max, then the
smallest index holding it), which vectorise: ~10 us for the same block. Same result, including
the first index on ties and the first NaN when a row holds one.
"""

from __future__ import annotations

import jax.numpy as jnp


def argmax(x, axis: int = -1):
  """jnp.argmax(x, axis) as int32 (first index of the maximum; first NaN wins, as jnp's)."""
  axis = axis % x.ndim
  m = jnp.max(x, axis=axis, keepdims=True)
  hit = (x == m) | (jnp.isnan(x) & jnp.isnan(m)) if jnp.issubdtype(x.dtype, jnp.floating) else (
      x == m)
  n = x.shape[axis]
  shape = [1] * x.ndim
  shape[axis] = n
  iota = jnp.arange(n, dtype=jnp.int32).reshape(shape)
  return jnp.min(jnp.where(hit, iota, n), axis=axis).astype(jnp.int32)
