"""Decode-step time and block cost for K = 1..8 tokens per row, lever by lever, beside the
host's memory-bandwidth floor.

  python experiments/bench_block.py                               # all models, batches 1 and 8
  python experiments/bench_block.py --models=shipped --batches=1 --levers=xla,kernel
  python experiments/bench_block.py --smoke                       # seconds (tests)

Speculative decoding assumes that the target scores gamma + 1 tokens for about the price of one:
the *block cost* (the K-token step over the 1-token step, what the runner's block-cost prediction
divides by) is that assumption measured. Each step runs inside one compiled loop of `--steps`
steps (`specjax.runner.metrics.step_loop`: the cache carried, the argmax fed back), every lever and
K of a (model, batch) interleaved in one process after a warm-up (compile time apart).

Levers (the same weights; `T5Model.pack`, specjax/models/cpu_kernels):
  xla           XLA's dots and attention (the model without packed weights)
  kernel        what load_t5 picks: packed float32 weights streamed once per step for any K,
                and the decode attention kernel
  kernel-bf16   bfloat16 storage: lossless where the weights are bf16 values already (the
                shipped pair's are: `lossless` in the JSON), else a bf16-rounded target
  kernel-int8   int8 storage with a float32 scale per output column (the int8 target)
  kernel-p32    float32, a second build of the kernel with the AVX2 tile it had before
                16-column panels (32-column panels, 2-row tiles: cpu_kernels.variant); AVX2
                hosts only (where the built panel is 16 columns)
A storage lever whose storage equals `kernel`'s is skipped.

Models: `shipped` (specjax/assets/tiny_pair/target, 24.3M params), `t5-small` and `t5-base`
(random targets with those shapes, untied 32128-wide head). The floor is the bytes a step must
stream (decoder matrices and head in the lever's storage, plus the caches it reads) over the
host's measured bandwidth (`machine.host_record`); a target that partly fits the L3 cache can beat
it. `--plot=FILE.png` draws ms vs K per lever and model.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position

LEVERS = ('xla', 'kernel', 'kernel-bf16', 'kernel-int8', 'kernel-p32')
P32_FLAGS = '-DSPECJAX_PANEL=32 -DSPECJAX_ROWS=2 -DSPECJAX_PAIR_ROWS=0'
SHAPES = {  # T5Config keyword arguments of the random targets (untied heads, as bench_common)
    't5-small': dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6,
                     num_decoder_layers=6, num_heads=8, tie_word_embeddings=False,
                     scale_logits=False),
    't5-base': dict(vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12,
                    num_decoder_layers=12, num_heads=12, tie_word_embeddings=False,
                    scale_logits=False),
    'smoke': dict(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=1,
                  num_decoder_layers=2, num_heads=4, tie_word_embeddings=False,
                  scale_logits=False),
}
CACHE_LEN = {1: 46, 8: 104}  # the default run's shapes (one verse; eight verses of 96 tokens)
SRC_LEN = 32


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--models', default='shipped,t5-small,t5-base')
  p.add_argument('--batches', default='1,8')
  p.add_argument('--tokens', default='1,2,3,4,5,6,7,8', help='K values (1 must be among them)')
  p.add_argument('--levers', default=','.join(LEVERS))
  p.add_argument('--steps', type=int, default=32, help='decoder steps per compiled loop')
  p.add_argument('--repeats', type=int, default=7)
  p.add_argument('--plot', default='', help="PNG of ms per step vs K (one panel per model); "
                 "'auto': docs/figures/block_cost-<host id>.png (the docs link the newest)")
  args = bc.parse_bench_args(p, argv, smoke_help='a random tiny target, K = 1, 2, batch 1')
  if args.smoke:
    args.models, args.batches, args.tokens, args.steps, args.repeats = 'smoke', '1', '1,2', 4, 2
  ks = [int(k) for k in args.tokens.split(',')]
  if 1 not in ks:
    p.error('--tokens must include 1 (block costs are relative to the 1-token step)')
  bad = sorted(set(args.levers.split(',')) - set(LEVERS))
  if bad:
    p.error(f'--levers: unknown {bad[0]!r} (known: {", ".join(LEVERS)})')
  return args


def load_model(name: str):
  """The float32 model on XLA's dots (levers derive from it) and its description."""
  import jax  # pylint: disable=import-outside-toplevel
  from specjax.models import checkpoints, t5  # pylint: disable=import-outside-toplevel
  if name == 'shipped':
    dirs = bc.tiny_pair_dirs()
    if dirs is None:
      raise SystemExit('bench_block: the shipped pair (specjax/assets/tiny_pair) is missing')
    return (checkpoints.load_t5(str(dirs[0]), cpu_kernel=False),
            'shipped EN->ES target (specjax/assets/tiny_pair/target)')
  if name not in SHAPES:
    raise SystemExit(f'bench_block: unknown model {name!r} (shipped, t5-small, t5-base)')
  config = t5.T5Config(**SHAPES[name])
  params = t5.init_params(config, jax.random.PRNGKey(0))
  return t5.T5Model(params=params, config=config), f'random {name}-shaped target'


def lever_model(base, lever: str):
  """The model a lever runs: XLA's dots, or packed weights in the lever's storage."""
  if lever == 'xla':
    return base
  with lever_context(lever):
    return base.pack({'kernel': None, 'kernel-bf16': 'bfloat16', 'kernel-int8': 'int8',
                      'kernel-p32': None}[lever])


def lever_context(lever: str):
  """The kernel build a lever's programs are traced with (cpu_kernels.variant for kernel-p32)."""
  import contextlib  # pylint: disable=import-outside-toplevel
  from specjax.models import cpu_kernels  # pylint: disable=import-outside-toplevel
  if lever == 'kernel-p32':
    return cpu_kernels.variant(P32_FLAGS, 'p32')
  return contextlib.nullcontext()


def lever_runs_here(lever: str) -> bool:
  """kernel-p32 only where the built kernel has other panels (AVX2) and can be built."""
  from specjax.models import cpu_kernels  # pylint: disable=import-outside-toplevel
  return lever != 'kernel-p32' or (cpu_kernels.available() and cpu_kernels.panel_width() != 32)


def step_bytes(model, batch: int, cache_len: int, k: int) -> int:
  """Bytes one step must read: the decoder's matrices and head as stored (float32 on XLA), the
  self-attention caches up to the block and the cross-attention keys/values."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  cfg = model.config
  if model.packed is not None:  # the decoder's packed matrices and head (not the encoder's)
    step = {'layers': model.packed['layers'], 'lm_head': model.packed['lm_head']}
    weights = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(step))
  else:
    dec = model.params['decoder']['layers']
    weights = sum(int(np.prod(w.shape)) * 4 for layer in dec for n, w in layer.items()
                  if w.ndim == 2 and n not in ('cross_k', 'cross_v'))
    weights += cfg.d_model * cfg.vocab_size * 4
  kv = 2 * cfg.num_decoder_layers * cfg.num_heads * cfg.d_kv * 4 * batch
  return weights + kv * (cache_len // 2 + k) + kv * SRC_LEN


def run_model(name: str, args, gate, floor_of) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.runner import metrics  # pylint: disable=import-outside-toplevel
  base, desc = load_model(name)
  from specjax.models import t5  # pylint: disable=import-outside-toplevel
  lossless = t5.bf16_exact(base.params)
  models = {}
  for lever in args.levers.split(','):
    if not lever_runs_here(lever):
      from specjax.models import cpu_kernels  # pylint: disable=import-outside-toplevel
      why = ('the built kernel has 32-column panels already' if cpu_kernels.available()
             else f'no CPU kernel here: {cpu_kernels.status()}')
      print(f'{name}: lever {lever} skipped ({why})')
      continue
    m = lever_model(base, lever)
    if (lever not in ('kernel', 'kernel-p32') and 'kernel' in models
        and m.weights == models['kernel'].weights):
      continue  # the same storage as load_t5's pick
    models[lever] = m
  if any(m.packed is None for lv, m in models.items() if lv != 'xla'):
    print(f'{name}: the CPU kernel is unavailable here; kernel levers run on XLA too')
  ks = [int(k) for k in args.tokens.split(',')]
  out = {'model': name, 'description': desc, 'batches': []}
  for batch in [int(b) for b in args.batches.split(',')]:
    cache_len = max(CACHE_LEN.get(batch, 104), 2 * max(ks) + 2)
    ids = jnp.full((batch, SRC_LEN), 7, jnp.int32)
    cache = jax.jit(base.init_cache, static_argnums=1)(ids, cache_len)
    lengths = jnp.full((batch,), cache_len // 2 - max(ks) - 1, jnp.int32)
    fns = {}
    for lever, model in models.items():
      for k in ks:
        toks = jnp.full((batch, k), 5, jnp.int32)
        fns[(lever, k)] = _stepper(lever, model, cache, toks, lengths, args.steps)
    timing = metrics.time_interleaved(fns, repeats=args.repeats)
    rows = []
    for lever, model in models.items():
      ms = {k: timing[(lever, k)].median_s / args.steps * 1e3 for k in ks}
      floor = floor_of(step_bytes(model, batch, cache_len, 1))
      row = {'lever': lever, 'weights': model.weights, 'batch': batch, 'ms': ms,
             'lossless': (lever in ('xla', 'kernel', 'kernel-p32')
                          or (lever == 'kernel-bf16' and lossless)),
             'block_cost': {k: ms[k] / ms[1] for k in ks},
             'compile_s': {k: timing[(lever, k)].compile_s for k in ks},
             'floor_ms': floor, 'step_over_floor': None if not floor else ms[1] / floor,
             'bytes_per_step': step_bytes(model, batch, cache_len, 1)}
      rows.append(row)
    load_rec, load_line = bc.table_load(gate)
    out['batches'].append({'batch': batch, 'cache_len': cache_len, 'rows': rows,
                           'load': load_rec})
    print(f'\n{desc}, batch {batch}, cache {cache_len}: ms per step (block cost = K-token step / '
          f'1-token step)')
    print(bc.markdown_table([_table_row(r, ks) for r in rows], _columns(ks)))
    print(load_line)
  return out


def _stepper(lever, model, cache, toks, lengths, steps):
  """One timed call: `steps` steps inside one compiled loop, traced with the lever's build."""
  from specjax.runner import metrics  # pylint: disable=import-outside-toplevel

  def run():
    with lever_context(lever):
      return metrics.step_loop(model, cache, toks, lengths, steps=steps)
  return run


def summary_rows(result) -> list[dict]:
  """What the docs' per-host table shows: the first model's batch-1 `kernel` lever (what load_t5
  runs), one row per K: step ms, the floor, the block cost."""
  first = result['models'][0]
  b1 = next((b for b in first['batches'] if b['batch'] == 1), first['batches'][0])
  row = next((r for r in b1['rows'] if r['lever'] == 'kernel'), b1['rows'][0])
  return [{'tokens': int(k), 'step_ms': ms, 'floor_ms': row['floor_ms'], 'lever': row['lever'],
           'weights': row['weights'], 'model': first['model']} for k, ms in row['ms'].items()]


def _columns(ks):
  cols = [('lever', 'lever', ''), ('weights', 'weights', '')]
  cols += [(f'ms{k}', f'K={k} ms', '.3f') for k in ks]
  cols += [(f'bc{k}', f'cost K={k}', '.2f') for k in ks if k > 1]
  cols += [('floor', 'floor ms', '.3f'), ('over', '1-step / floor', '.2f')]
  return cols


def _table_row(r, ks):
  row = {'lever': r['lever'], 'weights': r['weights'], 'floor': r['floor_ms'],
         'over': r['step_over_floor']}
  row.update({f'ms{k}': r['ms'][k] for k in ks})
  row.update({f'bc{k}': r['block_cost'][k] for k in ks if k > 1})
  return row


def plot(result, path):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  models = result['models']
  fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.4), squeeze=False)
  for ax, m in zip(axes[0], models):
    for b in m['batches']:
      for r in b['rows']:
        ks = sorted(int(k) for k in r['ms'])
        ax.plot(ks, [r['ms'][k] for k in ks], marker='o', ms=3,
                ls='-' if b['batch'] == 1 else '--', label=f"{r['lever']}, B={b['batch']}")
      if b['rows'][0]['floor_ms']:
        ax.axhline(b['rows'][0]['floor_ms'], color='gray', lw=0.8, ls=':')
    ax.set_title(m['model'], fontsize=9)
    ax.set_xlabel('tokens per row K')
    ax.set_ylabel('ms per step')
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=130)
  print(f'plot: {path}')


def main(argv=None) -> dict:
  args = parse_args(argv)
  gate = bc.load_gate(args)
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  from specjax.models import cpu_kernels  # pylint: disable=import-outside-toplevel
  info = bc.print_machine()
  host = bc.run_host()
  print(f"bandwidth: {host.get('mem_bw_gbs') or 0:.1f} GB/s (XLA streaming probe); "
        f'kernels: {cpu_kernels.status()}')
  result = {'machine': info, 'host': host, 'args': vars(args), 'kernels': cpu_kernels.status(),
            'models': []}
  for name in args.models.split(','):
    result['models'].append(run_model(name.strip(), args, gate,
                                      lambda b: machine.bandwidth_floor_ms(b, host)))
    result['rows'] = summary_rows(result)
    bc.write_json(args.out, result)
  if args.plot:
    path = args.plot if args.plot != 'auto' else str(
        bc.REPO / 'docs' / 'figures' / f"block_cost-{host['host_id']}.png")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    plot(result, path)
    result['plot'] = os.path.relpath(path, bc.REPO)
  bc.finish_load(gate, result, args.out)
  return result


if __name__ == '__main__':
  main()
