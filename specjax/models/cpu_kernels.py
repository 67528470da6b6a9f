"""CPU kernels of the decode step (cpu_kernels.cc): a small-M matmul over packed weights,
attention of a few query rows against a cache, the inverse-CDF draw of a token, the lookup of a
few embedding rows and the argmax over the vocabulary.

Shape legend: M rows (batch x tokens fed), K input features, N output features, P panels of
panel_width() output columns; B batch, Q query rows, H heads, T keys, Dk head width.

A decode step multiplies a few token rows by every weight of the decoder. On XLA:CPU that cost
1.4-2.6 one-token steps for a gamma+1-token verification block; `matmul` streams each packed
weight once for any M up to `MAX_ROWS`, so a block costs about one step (docs/performance.md).
The kernel is C++ against XLA's FFI, compiled on first use with the host's C++ compiler for the
host's CPU (`-march=native`; AVX2+FMA or AVX-512) and cached in ~/.cache/specjax/kernels. Without
a compiler, on another CPU architecture, or with SPECJAX_CPU_KERNEL=0, `available()` is False and
models keep XLA's dots (one notice per process says why); SPECJAX_CPU_KERNEL=1 makes that an error.

Why C++ of our own: no maintained library offers a weight-streaming small-M matmul callable from
inside a compiled XLA:CPU loop (XLA's own dot and YNNPACK paths are what we measured against).

Quantized weights (`pack(w, 'int8' | 'bfloat16')`) stream 4x / 2x fewer bytes; the arithmetic
stays float32, so the model computes exactly `x @ unpack(w)`: exactness is then with respect to
the quantized target (`quantize` returns the weights it stands for).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax import ops

MAX_ROWS = 512     # larger M (long prefill, teacher forcing) uses XLA's GEMM; measured
                   # ahead of it up to 512 rows (457 against 408 GFLOP/s on 2 AVX-512 cores)
TARGET = 'specjax_packed_matmul'
TARGET_ROWS = 'specjax_packed_matmul_rows'
ATTENTION = 'specjax_attention'
SAMPLE = 'specjax_sample_cdf'
TAKE = 'specjax_take_rows'
ARGMAX = 'specjax_argmax'
ENV = 'SPECJAX_CPU_KERNEL'
CFLAGS_ENV = 'SPECJAX_CPU_KERNEL_CFLAGS'
WEIGHTS = ('float32', 'bfloat16', 'int8')
SOURCE = Path(__file__).with_name('cpu_kernels.cc')


@struct.dataclass
class Packed:
  """One weight matrix W [K, N] in the kernel's layout.

  data [P, K, C]: data[p, k, j] = W[k, p*C + j] / scale (zero past N), float32, bfloat16 or
                  int8; C = panel_width() when packed (the built kernel's)
  scale [P*C]:    float32 per output column (ones unless int8)
  """
  data: jax.Array
  scale: jax.Array
  n: int = struct.field(pytree_node=False)

  @property
  def k(self) -> int:
    return self.data.shape[1]

  @property
  def weights(self) -> str:
    return {jnp.dtype(jnp.int8): 'int8', jnp.dtype(jnp.bfloat16): 'bfloat16'}.get(
        jnp.dtype(self.data.dtype), 'float32')


def quantize(w_KxN, weights: str = 'float32'):
  """(stored values [K, N], scale [N]) with W' = stored * scale the weights that will be used.

  int8: symmetric per output column, scale = max|W[:, n]| / 127; bfloat16: W rounded to bf16."""
  w = jnp.asarray(w_KxN, jnp.float32)
  n = w.shape[1]
  if weights == 'int8':
    scale_N = jnp.max(jnp.abs(w), axis=0) / 127.0
    scale_N = jnp.where(scale_N > 0, scale_N, 1.0)
    return jnp.clip(jnp.round(w / scale_N), -127, 127).astype(jnp.int8), scale_N
  if weights == 'bfloat16':
    return w.astype(jnp.bfloat16), jnp.ones((n,), jnp.float32)
  if weights == 'float32':
    return w, jnp.ones((n,), jnp.float32)
  raise ValueError(f'weights={weights!r}: expected one of {WEIGHTS}')


def pack(w_KxN, weights: str = 'float32') -> Packed:
  """W [K, N] in the kernel's panel layout, quantized as `weights` says."""
  stored_KxN, scale_N = quantize(w_KxN, weights)
  k, n = stored_KxN.shape
  c = panel_width()
  p = -(-n // c)
  pad = p * c - n
  stored_KxN = jnp.pad(stored_KxN, ((0, 0), (0, pad)))
  data = stored_KxN.reshape(k, p, c).transpose(1, 0, 2)
  scale = jnp.pad(scale_N, (0, pad), constant_values=1.0)
  return Packed(data=data, scale=scale.astype(jnp.float32), n=n)


def unpack(w: Packed):
  """The float32 W [K, N] that `w` stands for (stored * scale): the XLA reference of `matmul`."""
  p, k, c = w.data.shape
  full = w.data.astype(jnp.float32).transpose(1, 0, 2).reshape(k, p * c) * w.scale
  return full[:, :w.n]


def matmul(x_xK, w: Packed, rows_B=None):
  """x [..., K] @ W -> float32 [..., N]: the kernel when built and M <= MAX_ROWS, else XLA.

  `rows_B` (int32 [B], x then [B, S, K]): only rows s < rows_B[b] are multiplied, the others are
  zero (an encoder's padded source positions, which everything downstream masks out)."""
  *lead, k = x_xK.shape
  m = int(np.prod(lead)) if lead else 1
  if k != w.k:
    raise ValueError(f'matmul: x has {k} features, the packed weight {w.k}')
  if rows_B is not None and x_xK.ndim != 3:
    raise ValueError(f'matmul: rows_B needs x [B, S, K], got {x_xK.shape}')
  if m > MAX_ROWS or not available():
    out = jnp.einsum('...k,kn->...n', x_xK.astype(jnp.float32), unpack(w))
    return out if rows_B is None else jnp.where(_row_mask(rows_B, x_xK.shape[1]), out, 0.0)
  if rows_B is not None:
    return _kernel_rows(x_xK.astype(jnp.float32), w.data, w.scale,
                        jnp.asarray(rows_B, jnp.int32), w.n, TARGET_ROWS)
  out = _kernel(x_xK.reshape(m, k).astype(jnp.float32), w.data, w.scale, w.n, TARGET)
  return out.reshape(*lead, w.n)


def _row_mask(rows_B, s: int):
  return (jnp.arange(s, dtype=jnp.int32)[None, :] < jnp.asarray(rows_B)[:, None])[..., None]


# The XLA target name is a static argument (`variant` swaps it), so traces of two builds differ.
@functools.partial(jax.custom_jvp, nondiff_argnums=(4, 5))
def _kernel_rows(x_BxSxK, data, scale, rows_B, n, target):
  b, s, _ = x_BxSxK.shape
  call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((b, s, n), jnp.float32),
                          vmap_method='sequential')
  return call(x_BxSxK, data, scale, rows_B)


@_kernel_rows.defjvp
def _kernel_rows_jvp(n, target, primals, tangents):
  """`_kernel_jvp`'s tangent with the skipped rows zero."""
  x, data, scale, rows = primals
  tangent = _tangent(n, (x, data, scale), tangents[:3])
  return (_kernel_rows(x, data, scale, rows, n, target),
          jnp.where(_row_mask(rows, x.shape[1]), tangent, 0.0))


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _kernel(x_MxK, data, scale, n, target):
  call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((x_MxK.shape[0], n), jnp.float32),
                          vmap_method='expand_dims')
  return call(x_MxK, data, scale)


@_kernel.defjvp
def _kernel_jvp(n, target, primals, tangents):
  """Bilinear: the tangent is dx @ W + x @ dW through XLA's dots (so reverse mode transposes it),
  W = stored * scale, dW = d(stored) * scale + stored * d(scale); int8 storage has no tangent."""
  return _kernel(*primals, n, target), _tangent(n, primals, tangents)


def _tangent(n, primals, tangents):
  x, data, scale = primals
  dx, ddata, dscale = tangents
  tangent = dx @ unpack(Packed(data=data, scale=scale, n=n))
  if jnp.issubdtype(data.dtype, jnp.floating):
    tangent = tangent + x @ unpack(Packed(data=ddata, scale=scale, n=n))
  return tangent + x @ unpack(Packed(data=data, scale=dscale, n=n))


def attention(q_BxQxHxDk, k_BxHxTxDk, v_BxHxTxDk, bias_xHxQxT):
  """T5 attention (no 1/sqrt(d) scaling) of few query rows, float32 -> [B, Q, H*Dk].

  bias [B|1, H|1, Q|1, T] (relative positions plus masks; size-1 dims broadcast). The same math
  as `t5.attend`, in one kernel call for all heads (the softmax's exp is a ~1-ulp polynomial)."""
  if not available():
    raise RuntimeError(f'cpu_kernels.attention: {status()}')
  b, q, h, d = q_BxQxHxDk.shape
  bias = bias_xHxQxT.astype(jnp.float32)
  bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
  call = jax.ffi.ffi_call(ATTENTION, jax.ShapeDtypeStruct((b, q, h, d), jnp.float32),
                          vmap_method='sequential')
  out = call(q_BxQxHxDk.astype(jnp.float32), k_BxHxTxDk.astype(jnp.float32),
             v_BxHxTxDk.astype(jnp.float32), bias)
  return out.reshape(b, q, h * d)


def sample_cdf(u_x, weights_xV):
  """The inverse-CDF draw per row (int32 [...]) from non-negative weights [..., V] given a
  uniform u [...] in [0, 1): the first t with w_0 + .. + w_t > u * sum(w) (summed in double), the
  last positive-weight token if rounding runs past the end. On the CPU only (the kernel); callers
  choose it with `jax.lax.platform_dependent` (sampling.sample_uniform)."""
  call = jax.ffi.ffi_call(SAMPLE, jax.ShapeDtypeStruct(u_x.shape, jnp.int32),
                          vmap_method='broadcast_all')
  return call(weights_xV.astype(jnp.float32), u_x.astype(jnp.float32))


SMALL_OPS = ('take_rows', 'argmax')
_XLA_OPS: set[str] = set()


def small_ops(name: str) -> bool:
  """Whether the kernel `name` (of SMALL_OPS) stands in for XLA's operations on the decode path:
  the kernels built, and not inside `xla_small_ops` naming it."""
  return name not in _XLA_OPS and available()


@contextlib.contextmanager
def xla_small_ops(*names: str):
  """Inside the block, programs traced keep XLA's operations instead of the kernels `names` (all
  of SMALL_OPS by default): 'take_rows' (t5.embed's gather), 'argmax' (ops.argmax). The
  baseline of experiments/bench_variant.py --variant=xla_small_ops, side by side in one
  process."""
  names = names or SMALL_OPS
  unknown = set(names) - set(SMALL_OPS)
  if unknown:
    raise ValueError(f'xla_small_ops: unknown {sorted(unknown)}; known: {SMALL_OPS}')
  saved = set(_XLA_OPS)
  _XLA_OPS.update(names)
  try:
    yield
  finally:
    _XLA_OPS.clear()
    _XLA_OPS.update(saved)


def take_rows(table_VxD, ids):
  """table[ids] ([*ids.shape, D], the table's dtype) for a few ids, as jnp indexing does it (a
  negative id counts from the end, the rest clamp to [0, V)): one copy per row on the calling
  thread. XLA:CPU splits a gather of a few thousand elements over its own thread pool,
  whose threads wake slowly while the kernels' workers hold the cores (+20 us for 6 rows of 512
  after a kernel call, measured). Differentiable (the tangent is XLA's gather)."""
  return _take(table_VxD, jnp.asarray(ids, jnp.int32))


@jax.custom_jvp
def _take(table_VxD, ids):
  call = jax.ffi.ffi_call(TAKE, jax.ShapeDtypeStruct(ids.shape + table_VxD.shape[1:],
                                                     table_VxD.dtype),
                          vmap_method='sequential')
  return call(table_VxD, ids)


@_take.defjvp
def _take_jvp(primals, tangents):
  table, ids = primals
  return _take(table, ids), tangents[0][ids]


def _argmax_kernel():
  return argmax if small_ops('argmax') else None


ops.ARGMAX_KERNEL[:] = [_argmax_kernel]  # ops.argmax asks at trace time


def argmax(x_xV):
  """The first index of the maximum over the last axis (of the first NaN if any, as jnp.argmax),
  int32 [...], for float32 x: one pass per row instead of XLA:CPU's two tree reductions."""
  call = jax.ffi.ffi_call(ARGMAX, jax.ShapeDtypeStruct(x_xV.shape[:-1], jnp.int32),
                          vmap_method='broadcast_all')
  return call(x_xV.astype(jnp.float32))


# ----------------------------------------------------------------------------- build and load


def _cpu_flags() -> set[str]:
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      for line in f:
        if line.startswith('flags'):
          return set(line.split(':', 1)[1].split())
  except OSError:
    pass
  return set()


def cache_dir() -> Path:
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return Path(base) / 'specjax' / 'kernels'


def _compiler() -> str | None:
  for name in (os.environ.get('CXX'), 'c++', 'g++', 'clang++'):
    if name and shutil.which(name):
      return shutil.which(name)
  return None


def build(extra_flags: str = '') -> Path:
  """Compiles cpu_kernels.cc for this host (once; cached by source, jaxlib, compiler, CPU and
  flags), with $SPECJAX_CPU_KERNEL_CFLAGS and `extra_flags` (a `variant`'s) after the defaults."""
  cxx = _compiler()
  if cxx is None:
    raise RuntimeError('no C++ compiler found (set CXX, or install g++)')
  flags = _cpu_flags()
  if not ({'avx2', 'fma'} <= flags or 'avx512f' in flags):
    raise RuntimeError('the CPU has neither AVX2+FMA nor AVX-512')
  version = subprocess.run([cxx, '--version'], capture_output=True, text=True, check=False).stdout
  # e.g. -march=x86-64-v3 (tests the AVX2 path)
  extra = os.environ.get(CFLAGS_ENV, '').split() + extra_flags.split()
  key = hashlib.sha256('\0'.join([
      SOURCE.read_text(), jax.__version__, importlib.metadata.version('jaxlib'), version,
      ' '.join(sorted(flags)), platform.machine(), ' '.join(extra)]).encode()).hexdigest()[:16]
  out = cache_dir() / f'cpu_kernels-{key}.so'
  if out.is_file():
    return out
  out.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix='.cpu_kernels-', suffix='.so', dir=out.parent)
  os.close(fd)
  cmd = [cxx, '-O3', '-march=native', '-std=c++17', '-shared', '-fPIC', '-w', *extra,
         '-I', jax.ffi.include_dir(), str(SOURCE), '-o', tmp]
  done = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if done.returncode != 0:
    os.unlink(tmp)
    first = (done.stderr.strip().splitlines() or ['(no output)'])[0]
    raise RuntimeError(f'compiling {SOURCE.name} failed: {first}')
  os.replace(tmp, out)
  return out


@functools.cache
def _load() -> str | None:
  """None when the kernel is registered with XLA, else the reason it is not (once a process)."""
  setting = os.environ.get(ENV, '').strip()
  if setting == '0':
    return f'{ENV}=0'
  reason = None
  if platform.machine().lower() not in ('x86_64', 'amd64'):
    reason = f'{platform.machine()} is not an x86-64 CPU'
  else:
    try:
      lib = ctypes.cdll.LoadLibrary(str(build()))
      jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.SpecjaxPackedMatmul),
                                  platform='cpu')
      jax.ffi.register_ffi_target(TARGET_ROWS, jax.ffi.pycapsule(lib.SpecjaxPackedMatmulRows),
                                  platform='cpu')
      jax.ffi.register_ffi_target(ATTENTION, jax.ffi.pycapsule(lib.SpecjaxAttention),
                                  platform='cpu')
      jax.ffi.register_ffi_target(SAMPLE, jax.ffi.pycapsule(lib.SpecjaxSampleCdf),
                                  platform='cpu')
      jax.ffi.register_ffi_target(TAKE, jax.ffi.pycapsule(lib.SpecjaxTakeRows), platform='cpu')
      jax.ffi.register_ffi_target(ARGMAX, jax.ffi.pycapsule(lib.SpecjaxArgmax), platform='cpu')
      lib.SpecjaxPanelWidth.restype = ctypes.c_int64
      _PANEL[0] = int(lib.SpecjaxPanelWidth())
    except (OSError, RuntimeError, AttributeError) as e:
      reason = str(e).splitlines()[0]
  if reason is not None and setting == '1':
    raise RuntimeError(f'specjax CPU kernel unavailable ({ENV}=1): {reason}')
  if reason is not None:
    print(f'specjax: CPU decode kernel off ({reason}); using XLA dots', file=sys.stderr)
  return reason


_PANEL = [32]  # the loaded kernel's panel width (_load sets it)


def panel_width() -> int:
  """Output columns per panel of the packed layout: the built kernel's (16 on AVX2, 32 on
  AVX-512: the row tile that fits the ISA's registers, cpu_kernels.cc); 32 without a kernel."""
  _load()
  return _PANEL[0]


@contextlib.contextmanager
def variant(cflags: str, suffix: str = 'variant'):
  """Inside the block, `pack`, `matmul` and `attention` use a second build of the kernels with
  extra flags (e.g. '-DSPECJAX_PANEL=32 -DSPECJAX_ROWS=2 -DSPECJAX_PAIR_ROWS=0': another tile;
  -DSPECJAX_ATTENTION_SERIAL=N: another threshold for splitting attention over threads), its
  products registered as their own XLA targets. For benchmarks of the kernel's own settings side
  by side in one process: programs traced inside the block keep calling that build. Pack inside
  the block (panel widths may differ) and trace inside it: a jitted function compiled outside
  for the same shapes is not retraced."""
  if not available():
    raise RuntimeError(f'cpu_kernels.variant: {status()}')
  names = (f'{TARGET}_{suffix}', f'{TARGET_ROWS}_{suffix}', f'{ATTENTION}_{suffix}')
  width = _load_variant(cflags, *names)
  saved = (TARGET, TARGET_ROWS, ATTENTION, _PANEL[0])
  g = globals()
  g['TARGET'], g['TARGET_ROWS'], g['ATTENTION'], _PANEL[0] = (*names, width)
  try:
    yield width
  finally:
    g['TARGET'], g['TARGET_ROWS'], g['ATTENTION'], _PANEL[0] = saved


@functools.cache
def _load_variant(cflags: str, target: str, target_rows: str, attention_target: str) -> int:
  """Builds (cached as `build`) and registers a variant's products; its panel width."""
  lib = ctypes.cdll.LoadLibrary(str(build(cflags)))
  jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(lib.SpecjaxPackedMatmul), platform='cpu')
  jax.ffi.register_ffi_target(target_rows, jax.ffi.pycapsule(lib.SpecjaxPackedMatmulRows),
                              platform='cpu')
  jax.ffi.register_ffi_target(attention_target, jax.ffi.pycapsule(lib.SpecjaxAttention),
                              platform='cpu')
  lib.SpecjaxPanelWidth.restype = ctypes.c_int64
  return int(lib.SpecjaxPanelWidth())


def available() -> bool:
  """Whether `matmul` runs the packed kernel (builds and registers it on first call)."""
  return _load() is None


def status() -> str:
  """One line for run records: 'packed kernel (avx512)' or why XLA's dots are used."""
  reason = _load()
  if reason is not None:
    return f'xla ({reason})'
  return 'packed kernel (' + ('avx512' if 'avx512f' in _cpu_flags() else 'avx2') + ')'
