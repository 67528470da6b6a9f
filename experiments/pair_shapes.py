"""Which shapes make a CPU target step memory-bound and a draft cheap (the shipped pair's probe).

  python experiments/pair_shapes.py [--out=results/bench/pair_shapes.json]   # ~3 minutes, 2 cores
  python experiments/pair_shapes.py --smoke                                  # tests

For candidate target and draft shapes (vocabulary 4000, the shipped tokenizer; random float32
weights, which cost what trained ones cost) it times a compiled loop of decoder steps at batch 1
(`bench_bound.step_loop`: K tokens per row, the argmax fed back, caches carried) and prints, per
shape: parameters, the bytes one step must read (decoder weights except the cross-attention K/V
projections, whose products are cached, plus the head), the 1-token step, the K-token steps over
the 1-token step (the block cost Theorem 3.8 takes as 1), and for drafts c against each target.
On a CPU whose weights fit the L3 cache a (gamma+1)-token step costs ~2 steps; past it the step
is bandwidth-bound and the block cost falls towards 1. docs/tiny_pair.md quotes the run that
chose the shipped shapes.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position

V = 4000
_BASE = dict(vocab_size=V, d_kv=64, gated=True, tie_word_embeddings=False, scale_logits=False)
TARGETS = {
    # the shipped pair before this probe
    'old-target d256 2+4': dict(d_model=256, d_ff=512, num_heads=4, num_layers=2,
                                num_decoder_layers=4),
    'd512 ff1536 2+3': dict(d_model=512, d_ff=1536, num_heads=8, num_layers=2,
                            num_decoder_layers=3),
    'd512 ff2048 2+3': dict(d_model=512, d_ff=2048, num_heads=8, num_layers=2,
                            num_decoder_layers=3),
    'd512 ff2048 2+4': dict(d_model=512, d_ff=2048, num_heads=8, num_layers=2,
                            num_decoder_layers=4),
}
DRAFTS = {
    'old-draft d128 2+1': dict(d_model=128, d_ff=256, num_heads=2, num_layers=2,
                               num_decoder_layers=1),
    'd128 ff512 1+1': dict(d_model=128, d_ff=512, num_heads=2, num_layers=1, num_decoder_layers=1),
    'd192 ff512 1+1': dict(d_model=192, d_ff=512, num_heads=3, num_layers=1, num_decoder_layers=1),
    'd256 ff512 1+1': dict(d_model=256, d_ff=512, num_heads=4, num_layers=1, num_decoder_layers=1),
}
SMOKE_TARGETS = {'smoke-target': dict(d_model=32, d_ff=64, num_heads=2, num_layers=1,
                                      num_decoder_layers=2)}
SMOKE_DRAFTS = {'smoke-draft': dict(d_model=16, d_ff=32, num_heads=1, num_layers=1,
                                    num_decoder_layers=1)}
COLUMNS = [
    ('role', 'role', ''), ('shape', 'shape', ''), ('params_m', 'params M', '.2f'),
    ('step_mb', 'step reads MB (f32)', '.1f'), ('ms_1', '1-token step ms', '.3f'),
]


def step_bytes(config) -> int:
  """float32 bytes of the weights one decoder step reads: decoder blocks without the
  cross-attention K/V projections (their products are cached per source) plus the head."""
  d, inner, f = config.d_model, config.inner_dim, config.d_ff
  ffn = (3 if config.gated else 2) * d * f
  per_layer = 4 * d * inner + 2 * d * inner + ffn + 3 * d
  return 4 * (config.num_decoder_layers * per_layer + d * config.vocab_size)


def make_model(kw: dict, seed: int):
  import jax  # pylint: disable=import-outside-toplevel
  from specjax.models.t5 import (T5Config, T5Model,  # pylint: disable=import-outside-toplevel
                                 init_params)
  config = T5Config(**_BASE, **kw)
  return T5Model(params=init_params(config, jax.random.PRNGKey(seed)), config=config)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--ks', default='1,3,4,6,8', help='tokens per row of the timed target steps')
  p.add_argument('--src_len', type=int, default=48)
  p.add_argument('--length', type=int, default=32, help='cache offset the steps run at')
  p.add_argument('--steps', type=int, default=32, help='steps per compiled loop')
  p.add_argument('--repeats', type=int, default=7)
  p.add_argument('--out', default='')
  p.add_argument('--smoke', action='store_true')
  bc.add_load_args(p)
  a = p.parse_args(argv)
  if a.smoke:
    a.ks, a.steps, a.repeats = '1,3', 2, 1
  gate = bc.load_gate(a)
  import bench_bound  # pylint: disable=import-outside-toplevel
  from gpu_step import synthetic_cache  # pylint: disable=import-outside-toplevel
  ks = sorted({1, *(int(k) for k in a.ks.split(','))})
  targets, drafts = (SMOKE_TARGETS, SMOKE_DRAFTS) if a.smoke else (TARGETS, DRAFTS)
  cache_len = a.length + max(ks) + 2
  rows, fns = [], {}
  for role, shapes in (('target', targets), ('draft', drafts)):
    for i, (name, kw) in enumerate(shapes.items()):
      model = make_model(kw, seed=i)
      cache = synthetic_cache(model, 1, a.src_len, cache_len)
      from specjax.models.t5 import param_count  # pylint: disable=import-outside-toplevel
      rows.append({'role': role, 'shape': name, 'params_m': param_count(model.config) / 1e6,
                   'step_mb': step_bytes(model.config) / 1e6})
      for k in (ks if role == 'target' else [1]):
        fns[(name, k)] = bench_bound.step_loop(model, cache, k, a.length, a.steps)
  times = bc.interleave({f'{n}|{k}': fn for (n, k), fn in fns.items()}, repeats=a.repeats)
  ms = {tuple(key.split('|')): 1e3 * t['median_s'] / a.steps for key, t in times.items()}
  cols = list(COLUMNS)
  for k in ks[1:]:
    cols.append((f'x_{k}', f'{k}-token / 1-token', '.2f'))
  target_names = list(targets)
  for t in target_names:
    cols.append((f'c_{t}', f'c vs {t}', '.3f'))
  for r in rows:
    r['ms_1'] = ms[(r['shape'], '1')]
    if r['role'] == 'target':
      for k in ks[1:]:
        r[f'x_{k}'] = ms[(r['shape'], str(k))] / r['ms_1']
    else:
      for t in target_names:
        r[f'c_{t}'] = r['ms_1'] / ms[(t, '1')]
  print(f'batch 1, float32, source {a.src_len} tokens, cache offset {a.length}, '
        f'{a.steps} steps per compiled loop, median of {a.repeats}')
  print(bc.markdown_table(rows, [c for c in cols if any(c[0] in r for r in rows)]))
  result = {'machine': bc.machine_info(), 'args': vars(a), 'rows': rows}
  bc.finish_load(gate, result, a.out)
  return result


if __name__ == '__main__':
  main()
