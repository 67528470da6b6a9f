"""Memory plan for target + draft pairs on TPU / GPU hosts: which pair fits where, on which mesh.

Everything is computed from the T5 configs (specjax.models.presets) and the partition rules of
specjax.models.sharding, by shape evaluation: nothing is materialised, nothing is downloaded, no
accelerator is needed.

  python scripts/memory_plan.py                       # the tables in docs/scaling.md
  python scripts/memory_plan.py --batch 32 --src-len 1024 --max-new 128 --gamma 5

Per device, for a ('data', 'model') mesh:
  params   bf16, each leaf's shard under `param_partition_specs` (model-sharded dims / model,
           replicated dims whole; the data axis replicates params);
  caches   bf16 K and V of every decoder layer, both models: the self-attention cache holds
           max_new + gamma + 1 positions per row (the size speculative_decode allocates for the
           target and the draft alike), the cross-attention cache src_len positions per row;
           rows / data (if the batch divides, else all rows), heads / model (if num_heads divides);
  work     an estimate of the largest transient: the encoder's FFN hidden and float32 attention
           scores at init, or the float32 verification logits/probabilities in the loop.
A mesh fits if params + caches + work <= (1 - headroom) x device memory. The chosen mesh is the
smallest 'model' axis that fits (the rest of the devices go to 'data'); `max batch` is the largest
batch (a multiple of the data axis) that still fits on that mesh.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AbstractMesh  # noqa: E402

from specjax.models import sharding as sh  # noqa: E402
from specjax.models.presets import PRESETS, preset  # noqa: E402
from specjax.models.t5 import T5Config, init_params  # noqa: E402

GIB = 2 ** 30
BF16 = 2


@dataclass(frozen=True)
class Hardware:
  name: str
  devices: int  # JAX devices
  gib_per_device: float  # memory one JAX device can use
  note: str


HARDWARE = (
    Hardware('TPU v4-8', 4, 32.0, '4 chips x 32 GiB HBM; one JAX device per chip (megacore)'),
    Hardware('TPU v5e-8', 8, 16.0, '8 chips x 16 GiB HBM'),
    Hardware('Colab TPU v2-8', 8, 8.0, '4 chips x 2 cores; one JAX device per core, 8 GiB each'),
    Hardware('1x H200', 1, 139.0, '141 GB HBM3e, ~139 GiB usable (see XLA_PYTHON_CLIENT_MEM_FRACTION)'),
)

PAIRS = (
    ('t5-11b', 't5-small'),
    ('t5-11b', 't5-large'),
    ('google/t5-v1_1-xxl', 'google/t5-v1_1-small'),
)


@dataclass(frozen=True)
class Workload:
  batch: int
  src_len: int
  max_new: int
  gamma: int

  @property
  def self_len(self) -> int:
    return self.max_new + self.gamma + 1


def _short(name: str) -> str:
  return name.replace('google/t5-v1_1-', 'v1.1-')


_SHAPES: dict[T5Config, object] = {}


def _shapes(config: T5Config):
  if config not in _SHAPES:
    _SHAPES[config] = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0),
                                                         jnp.bfloat16))
  return _SHAPES[config]


def param_bytes(config: T5Config, data: int = 1, model: int = 1) -> int:
  """bf16 param bytes on one device of a (data, model) mesh, by the sharding rules."""
  shapes = _shapes(config)
  mesh = AbstractMesh((data, model), sh.MESH_AXES)
  specs = sh.param_partition_specs(shapes, config, mesh)
  total = 0
  for x, spec in zip(jax.tree.leaves(shapes), jax.tree.leaves(specs)):
    n = math.prod(x.shape) * BF16
    for axis in spec:
      if axis is not None:
        n //= mesh.shape[axis]
    total += n
  return total


def _rows(w: Workload, data: int) -> int:
  return w.batch // data if w.batch % data == 0 else w.batch


def _heads(config: T5Config, model: int) -> int:
  return config.num_heads // model if config.num_heads % model == 0 else config.num_heads


def _kv_per_position(config: T5Config, model: int = 1) -> int:
  return 2 * config.num_decoder_layers * _heads(config, model) * config.d_kv * BF16


def self_cache_bytes(config: T5Config, w: Workload, data: int = 1, model: int = 1) -> int:
  """Self-attention K+V cache (max_new + gamma + 1 positions per row), bf16, one device."""
  return _rows(w, data) * w.self_len * _kv_per_position(config, model)


def cross_cache_bytes(config: T5Config, w: Workload, data: int = 1, model: int = 1) -> int:
  """Cross-attention K+V cache (src_len positions per row), bf16, one device."""
  return _rows(w, data) * w.src_len * _kv_per_position(config, model)


def cache_bytes(config: T5Config, w: Workload, data: int = 1, model: int = 1) -> int:
  return self_cache_bytes(config, w, data, model) + cross_cache_bytes(config, w, data, model)


def work_bytes(config: T5Config, w: Workload, data: int = 1, model: int = 1) -> int:
  """Estimate of the largest transient buffer set (not exact: XLA may fuse or reuse buffers)."""
  rows = _rows(w, data)
  f = config.d_ff // model if config.d_ff % model == 0 else config.d_ff
  ffn = rows * w.src_len * f * BF16 * (3 if config.gated else 2)
  scores = rows * _heads(config, model) * w.src_len * w.src_len * 4 * 2  # f32 scores + softmax
  v = config.vocab_size // model if config.vocab_size % model == 0 else config.vocab_size
  loop = rows * (w.gamma + 1) * (v * 4 * 3 + config.vocab_size * 4 * 2)  # logits/probs (+gathered)
  return max(ffn, scores, loop)


@dataclass
class Fit:
  data: int
  model: int
  params: int
  caches: int
  work: int

  @property
  def total(self) -> int:
    return self.params + self.caches + self.work


def footprint(target: T5Config, draft: T5Config, w: Workload, data: int, model: int) -> Fit:
  return Fit(data, model,
             param_bytes(target, data, model) + param_bytes(draft, data, model),
             cache_bytes(target, w, data, model) + cache_bytes(draft, w, data, model),
             max(work_bytes(target, w, data, model), work_bytes(draft, w, data, model)))


def plan(target: T5Config, draft: T5Config, w: Workload, hw: Hardware, headroom: float):
  """(smallest-model-axis Fit that fits or None, list of all candidate Fits)."""
  budget = (1 - headroom) * hw.gib_per_device * GIB
  fits = []
  for model in [m for m in range(1, hw.devices + 1) if hw.devices % m == 0]:
    fits.append(footprint(target, draft, w, hw.devices // model, model))
  ok = [f for f in fits if f.total <= budget]
  return (ok[0] if ok else None), fits


def max_batch(target, draft, w: Workload, fit: Fit, hw: Hardware, headroom: float) -> int:
  budget = (1 - headroom) * hw.gib_per_device * GIB

  def ok(b):
    wb = Workload(b, w.src_len, w.max_new, w.gamma)
    return footprint(target, draft, wb, fit.data, fit.model).total <= budget

  step = fit.data
  if not ok(step):
    return 0
  lo, hi = 1, 2
  while ok(hi * step) and hi < 1 << 16:
    lo, hi = hi, hi * 2
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if ok(mid * step) else (lo, mid)
  return lo * step


def _g(n: int) -> str:
  return f'{n / GIB:.2f}'


def models_table(names) -> str:
  rows = ['| model | params | bf16 params | K+V cache per position per row (self and cross alike) |',
          '|---|---:|---:|---:|']
  for name in names:
    c = preset(name)
    n = sum(math.prod(x.shape) for x in jax.tree.leaves(_shapes(c)))
    kv = _kv_per_position(c)
    rows.append(f'| {_short(name)} | {n / 1e6:,.0f}M | {_g(n * BF16)} GiB | {kv / 1024:,.0f} KiB |')
  return '\n'.join(rows)


def pairs_table(w: Workload) -> str:
  rows = ['| target / draft | params (GiB) | self caches (GiB) | cross caches (GiB) | total, one device (GiB) |',
          '|---|---:|---:|---:|---:|']
  for t_name, d_name in PAIRS:
    t, d = preset(t_name), preset(d_name)
    p = param_bytes(t) + param_bytes(d)
    s = self_cache_bytes(t, w) + self_cache_bytes(d, w)
    x = cross_cache_bytes(t, w) + cross_cache_bytes(d, w)
    rows.append(f'| {_short(t_name)} / {_short(d_name)} | {_g(p)} | {_g(s)} | {_g(x)} | '
                f'{_g(p + s + x)} |')
  return '\n'.join(rows)


def fit_table(w: Workload, headroom: float) -> str:
  rows = ['| target / draft | hardware | mesh (data, model) | per device: params + caches + work = total (GiB) | '
          'capacity (GiB) | fits | max batch on that mesh | max batch on (1, all) |',
          '|---|---|---|---|---:|---|---:|---:|']
  for t_name, d_name in PAIRS:
    t, d = preset(t_name), preset(d_name)
    for hw in HARDWARE:
      best, fits = plan(t, d, w, hw, headroom)
      f = best or fits[-1]  # the most sharded mesh, to show by how much it misses
      verdict = 'yes' if best else 'no'
      mb = max_batch(t, d, w, best, hw, headroom) if best else 0
      mb_tp = max_batch(t, d, w, fits[-1], hw, headroom)
      rows.append(f'| {_short(t_name)} / {_short(d_name)} | {hw.name} | ({f.data}, {f.model}) | '
                  f'{_g(f.params)} + {_g(f.caches)} + {_g(f.work)} = {_g(f.total)} | '
                  f'{hw.gib_per_device:g} | {verdict} | {mb if best else "-"} | '
                  f'{mb_tp or "-"} |')
  return '\n'.join(rows)


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--batch', type=int, default=8)
  ap.add_argument('--src-len', type=int, default=512)
  ap.add_argument('--max-new', type=int, default=256)
  ap.add_argument('--gamma', type=int, default=4)
  ap.add_argument('--headroom', type=float, default=0.15,
                  help='fraction of device memory kept free (runtime, fragmentation, XLA temps)')
  args = ap.parse_args(argv)
  w = Workload(args.batch, args.src_len, args.max_new, args.gamma)
  names = sorted({n for pair in PAIRS for n in pair}, key=list(PRESETS).index)
  print('### Models (bf16)\n')
  print(models_table(names))
  print(f'\n### Pairs, whole footprint (batch {w.batch}, source {w.src_len} tokens, '
        f'max_new {w.max_new}, gamma {w.gamma}: self cache {w.self_len} positions per row)\n')
  print(pairs_table(w))
  print(f'\n### Where each pair fits (same workload; headroom {args.headroom:.0%}; smallest '
        "'model' axis that fits)\n")
  print(fit_table(w, args.headroom))
  print('\nHardware: ' + '; '.join(f'{h.name}: {h.note}' for h in HARDWARE) + '.')


if __name__ == '__main__':
  main()
