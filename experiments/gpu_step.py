"""Decoder step costs on an accelerator: 1 vs gamma+1 tokens, the bandwidth floor, loop overhead.

  python experiments/gpu_step.py --shape=xxl [--out=gpu_step.json]     # one GPU, ~10 minutes
  python experiments/gpu_step.py --shape=tiny                          # CPU smoke test, a minute
  python experiments/gpu_step.py --smoke                               # tests: smaller still
  python experiments/gpu_step.py --shape=xxl --dry_run                 # compile-only check, any host

Target: a random T5-XXL-shaped (v1.1) model, bfloat16 -- d_model 4096, d_ff 10240 (gated-GELU),
64 heads x 64, 24 + 24 layers, vocab 32128, untied head: 11.3 B parameters, 22.6 GB. Parameters
are created on the device, one leaf at a time, by `jax.random` inside `jax.jit` (no host copy).
Draft: the target's own embedding, head, norms and first `--draft_layers` encoder/decoder blocks
(the same device arrays, no extra memory); the target's later blocks have their residual outputs
scaled by `--damp`, so the draft approximates it and acceptance is meaningful (random weights).

Stages (each writes the JSON when it finishes, so a run cut short keeps what it measured; a stage
that would not fit the remaining --budget_s is skipped and says so):

  bandwidth   a large on-device elementwise copy (y = x + 1: read + write) and a reduction (read)
  steps       decoder step, batch 1, K = 1, 2, 4, ..., tokens per row, compiled `fori_loop`
              of N steps with the argmax fed back, per-step median; ratio K-token / 1-token
              (goal <= 1.15 for K = gamma + 1 <= 8); the draft's 1-token step (c)
  floor       1-token step vs (decoder parameter bytes + lm_head bytes) / copy bandwidth
              (goal <= 1.5x); also vs the bytes a step must actually read (decoder weights except
              the cross-attention K/V projections, the head, and the K/V caches)
  loop        one `decoding.speculative_step` in a compiled loop vs gamma * draft step + target
              (gamma+1)-block step: the speculative loop's overhead outside the forward passes;
              and one autoregressive iteration vs the 1-token step
  end2end     `speculative_decode` vs `autoregressive_decode` on one prompt (batch 1, greedy):
              per-iteration time of the real while_loop programs, alpha, measured vs predicted
  end2end_t1  the same at temperature 1 (sampled; same-seed outputs differ, equal in law)
  adaptive    (opt-in: --stages=steps,adaptive) fixed gamma vs stop rules vs block verification,
              batch --batches, T --adaptive_temps: tokens/s, tokens per target call, draft passes,
              predicted speedup with c and the block cost measured (bench_adaptive.compare)
  identity    greedy speculative vs autoregressive tokens, bf16 and f32 params; the target's logits
              along the autoregressive path as 1-token steps vs one teacher-forced block (the
              verification's shape): block-vs-step |d logit| against the top-2 margin
  refill      (opt-in: --stages=steps,refill) slot refill: a queue of --refill_n random prompts
              through slots=B (--batches) vs the lockstep loop, autoregressive and speculative,
              fixed gammas --refill_gammas and gamma=auto, T --adaptive_temps: tokens/s, row
              utilisation, tokens per target call, auto / best fixed (bench_batch.refill_rows)
  tree        (opt-in: --stages=steps,tree) token trees (--trees) vs chains with the same number
              of verified tokens (--tree_gammas), batch 1, T --tree_temps: tokens per target call,
              tokens/s, accepted path lengths (bench_tree.compare)
  pair        (opt-in: --stages=pair) the shipped EN->ES pair end to end on this device: the
              default run (`python -m specjax.run`, configs/tiny.py; --pair_config) through the
              runner, into a temporary directory: per T and gamma alpha, tokens per target call,
              c, measured speedup and Theorem 3.8's prediction (does the default pair speed up
              here too?). Needs no --shape model; with --smoke, configs/tiny.py:smoke.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

T_START = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position

SHAPES = {
    # (target kwargs for specjax.models.t5.T5Config)
    'smoke': dict(vocab_size=256, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=2,
                  num_heads=4, gated=True, tie_word_embeddings=False, scale_logits=False),
    'tiny': dict(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=4,
                 num_heads=4, gated=True, tie_word_embeddings=False, scale_logits=False),
    'small': dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=1024, num_layers=8,
                  num_decoder_layers=8, num_heads=6, gated=True, tie_word_embeddings=False,
                  scale_logits=False),
    'xxl': dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24,
                num_decoder_layers=24, num_heads=64, gated=True, tie_word_embeddings=False,
                scale_logits=False),
}
STEP_COLUMNS = [
    ('model', 'model', ''), ('tokens', 'tokens / row', 'd'), ('step_ms', 'step ms', '.3f'),
    ('vs_1', 'vs 1 token', '.3f'), ('goal', 'goal', ''),
]
FLOOR_COLUMNS = [
    ('what', 'bytes counted', ''), ('gbytes', 'GB', '.3f'), ('floor_ms', 'floor ms', '.3f'),
    ('step_ms', '1-token step ms', '.3f'), ('x_floor', 'step / floor', '.2f'), ('goal', 'goal', ''),
]
LOOP_COLUMNS = [
    ('what', 'per iteration', ''), ('ms', 'ms', '.3f'), ('models_ms', 'forward passes ms', '.3f'),
    ('overhead_ms', 'overhead ms', '.3f'), ('overhead_frac', 'overhead', '.1%'),
]
E2E_COLUMNS = [
    ('batch', 'B', 'd'), ('temperature', 'T', 'g'), ('gamma', 'gamma', 'd'), ('alpha', 'alpha', '.3f'), ('tokens_per_iter', 'tokens / iter', '.2f'),
    ('ar_ms_per_token', 'AR ms / step', '.3f'), ('spec_ms_per_iter', 'spec ms / iter', '.3f'),
    ('ar_tokens_per_s', 'AR tok/s', '.0f'), ('spec_tokens_per_s', 'spec tok/s', '.0f'),
    ('c', 'c', '.3f'), ('speedup', 'speedup', '.2f'), ('predicted', 'predicted', '.2f'),
    ('measured_over_predicted', 'measured / predicted', '.2f'), ('identical', 'same tokens', ''),
]
PAIR_COLUMNS = [
    ('draft', 'draft', ''), ('temperature', 'T', 'g'), ('gamma', 'gamma', 'd'),
    ('alpha', 'alpha', '.3f'), ('tokens_per_target_call', 'tokens / call', '.2f'), ('c', 'c', '.3f'),
    ('speedup', 'measured', '.2f'), ('pred_improvement', 'Thm 3.8', '.2f'),
    ('measured_over_predicted', 'measured / predicted', '.2f'),
    ('identical_to_baseline', 'same tokens', ''), ('speculative_compile_s', 'spec compile s', '.1f'),
]
IDENTITY_COLUMNS = [
    ('dtype', 'params', ''), ('identical', 'same tokens', ''),
    ('first_divergence', 'first diff at', ''), ('ar_equals_step_argmax', 'AR = step argmax', 'd'),
    ('block_argmax_flips', 'argmax flips block vs step', 'd'),
    ('delta_median', 'abs dlogit median', '.3g'), ('delta_max', 'abs dlogit max', '.3g'),
    ('margin_median', 'top-2 margin median', '.3g'), ('margin_min', 'margin min', '.3g'),
    ('margin_below_delta', 'positions margin < abs dlogit', 'd'),
]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--shape', default='tiny', choices=sorted(SHAPES))
  p.add_argument('--dtype', default='bfloat16', choices=('bfloat16', 'float32'))
  p.add_argument('--ks', default='1,2,4,6,8', help='tokens per row of the timed decoder steps')
  p.add_argument('--gamma', type=int, default=5, help='gamma of the loop / end2end stages')
  p.add_argument('--gammas', default='', help='end2end stages: comma-separated gammas '
                 '(default: --gamma)')
  p.add_argument('--precision', default='', choices=('', 'default', 'high', 'highest'),
                 help="jax_default_matmul_precision (on GPUs 'default' runs float32 matmuls as TF32)")
  p.add_argument('--batches', default='1', help='end2end stages: comma-separated batch sizes')
  p.add_argument('--draft_layers', type=int, default=2)
  p.add_argument('--damp', type=float, default=0.1)
  p.add_argument('--src_len', type=int, default=128)
  p.add_argument('--max_new_tokens', type=int, default=128)
  p.add_argument('--steps', type=int, default=16, help='N of the compiled step loops')
  p.add_argument('--repeats', type=int, default=7)
  p.add_argument('--bw_gib', type=float, default=2.0, help='bandwidth buffer (GiB)')
  p.add_argument('--budget_s', type=float, default=540.0, help='skip stages past this wall time')
  p.add_argument('--stages',
                 default='bandwidth,steps,floor,loop,end2end,end2end_t1,identity')
  p.add_argument('--adaptive_gammas', default='1,2,3,5,8', help='adaptive stage: fixed gammas')
  p.add_argument('--adaptive_block_gammas', default='5,8',
                 help='adaptive stage: fixed gammas with block verification')
  p.add_argument('--adaptive_rules', default='confidence:0.4,entropy:2.5,alpha',
                 help='adaptive stage: stop rules (specjax.stopping.parse spelling)')
  p.add_argument('--adaptive_g_max', type=int, default=8, help='adaptive stage: rules\' block width')
  p.add_argument('--adaptive_temps', default='0,1', help='adaptive stage: temperatures')
  p.add_argument('--refill_n', type=int, default=256, help='refill stage: prompts in the queue')
  p.add_argument('--refill_gammas', default='1,2,3,5', help='refill stage: fixed gammas')
  p.add_argument('--trees', default='((2,1,1,1), (4,1), (2,3), (3,2,1))',
                 help='tree stage: trees as branching tuples')
  p.add_argument('--tree_gammas', default='7,8', help='tree stage: chain gammas')
  p.add_argument('--tree_temps', default='0,1', help='tree stage: temperatures')
  p.add_argument('--pair_config', default='',
                 help='pair stage: runner config (default configs/tiny.py, or its :smoke with '
                      '--smoke)')
  p.add_argument('--dry_run', action='store_true',
                 help='only lower + compile every program for abstract inputs of --shape (checks '
                      'the XXL shapes on a CPU without allocating them; compile times)')
  a = bc.parse_bench_args(p, argv, smoke_help='tiny sizes everywhere (CPU tests)')
  if a.smoke:
    a.shape, a.ks, a.gamma, a.src_len, a.max_new_tokens = 'smoke', '1,4', 3, 16, 12
    a.steps, a.repeats, a.bw_gib, a.draft_layers = 4, 2, 0.01, 1
  if a.shape == 'tiny' and not a.smoke:
    a.bw_gib = min(a.bw_gib, 0.25)
  return a


def elapsed() -> float:
  return time.perf_counter() - T_START


# ----------------------------------------------------------------------------- device params


def _std(path: str, shape) -> float:
  if path == 'shared':
    return 1.0
  return float(shape[0]) ** -0.5  # fan-in for [in, out] matrices and [buckets, heads] tables


@functools.lru_cache(maxsize=None)
def _rand_fn(shape, dtype, kind):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  @jax.jit
  def make(key, std):
    if kind == 'ones':
      return jnp.ones(shape, dtype)
    return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
  return make


def device_params(config, dtype, seed: int = 0):
  """Random params with init_params' tree structure, each leaf made on the device by a jitted
  jax.random call (one small compile per distinct leaf shape)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.models.t5 import init_params  # pylint: disable=import-outside-toplevel
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0), dtype))
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  key = jax.random.PRNGKey(seed)
  out = []
  for i, (path, sd) in enumerate(leaves):
    name = jax.tree_util.keystr(path).strip("[]'")
    kind = 'ones' if len(sd.shape) == 1 else 'normal'
    fn = _rand_fn(tuple(sd.shape), jnp.dtype(sd.dtype), kind)
    out.append(fn(jax.random.fold_in(key, i), jnp.float32(_std(name, sd.shape))))
  return jax.tree_util.tree_unflatten(treedef, out)


def make_pair(shape: str, dtype, draft_layers: int, damp: float):
  """(target, draft) T5Models; the draft shares the target's arrays (first blocks, head)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.models.t5 import T5Config, T5Model  # pylint: disable=import-outside-toplevel
  config = T5Config(**SHAPES[shape])
  params = device_params(config, dtype)
  scale = jax.jit(lambda w: (w.astype(jnp.float32) * damp).astype(w.dtype), donate_argnums=0)
  for stack in ('encoder', 'decoder'):
    for i, layer in enumerate(params[stack]['layers']):
      if i >= draft_layers:
        for name in list(layer):
          if name in ('o', 'self_o', 'cross_o', 'wo'):
            layer[name] = scale(layer[name])
  target = T5Model(params=params, config=config)
  return target, draft_view(target, draft_layers)


def draft_view(target, draft_layers: int):
  """The draft T5Model over the target's own arrays: embedding, head, first `draft_layers` blocks."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  from specjax.models.t5 import T5Model  # pylint: disable=import-outside-toplevel
  params = target.params
  dparams = dict(params)
  dparams['encoder'] = dict(params['encoder'], layers=params['encoder']['layers'][:draft_layers])
  dparams['decoder'] = dict(params['decoder'], layers=params['decoder']['layers'][:draft_layers])
  dconfig = dataclasses.replace(target.config, num_layers=draft_layers,
                                num_decoder_layers=draft_layers)
  return T5Model(params=dparams, config=dconfig)


def synthetic_cache(model, batch: int, src_len: int, cache_len: int, seed: int = 1):
  """A DecoderCache without running the encoder: zero self K/V, random cross K/V (on device)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.models.t5 import DecoderCache  # pylint: disable=import-outside-toplevel
  c = model.config
  dtype = model.dtype
  n = c.num_decoder_layers
  zeros = _rand_fn((batch, c.num_heads, cache_len, c.d_kv), jnp.dtype(dtype), 'ones')
  rnd = _rand_fn((batch, c.num_heads, src_len, c.d_kv), jnp.dtype(dtype), 'normal')
  key = jax.random.PRNGKey(seed)
  z = zeros(key, jnp.float32(0)) * 0
  cross_k = tuple(rnd(jax.random.fold_in(key, 2 * i), jnp.float32(1)) for i in range(n))
  cross_v = tuple(rnd(jax.random.fold_in(key, 2 * i + 1), jnp.float32(1)) for i in range(n))
  return DecoderCache(self_k=(z,) * n, self_v=(z,) * n, cross_k=cross_k, cross_v=cross_v,
                      enc_mask=jnp.ones((batch, src_len), bool))


def nbytes(tree) -> int:
  import jax  # pylint: disable=import-outside-toplevel
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


# ----------------------------------------------------------------------------- stages


def stage_bandwidth(args, res):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  n = int(args.bw_gib * 2 ** 30) // 2
  x = jax.jit(lambda: jnp.ones((n,), jnp.bfloat16), )()
  add = jax.jit(lambda x: x + jnp.bfloat16(1))
  red = jax.jit(lambda x: jnp.sum(x, dtype=jnp.float32))
  t = bc.interleave({'copy': lambda: add(x), 'read': lambda: red(x)}, repeats=args.repeats)
  res['bandwidth'] = {
      'bytes': 2 * n, 'copy_s': t['copy']['median_s'], 'read_s': t['read']['median_s'],
      'copy_gbps': 2 * (2 * n) / t['copy']['median_s'] / 1e9,  # read + write
      'read_gbps': (2 * n) / t['read']['median_s'] / 1e9,
  }
  del x
  b = res['bandwidth']
  print(f"bandwidth: copy {b['copy_gbps']:.1f} GB/s (read+write of {b['bytes'] / 2**30:.2f} GiB), "
        f"read {b['read_gbps']:.1f} GB/s", flush=True)


def stage_steps(args, res, target, draft):
  import bench_bound  # pylint: disable=import-outside-toplevel
  ks = [int(k) for k in args.ks.split(',')]
  if 1 not in ks:
    ks = [1] + ks
  cache_len = args.max_new_tokens + max(max(ks), args.gamma + 1) + 1
  length = cache_len // 2
  tc = synthetic_cache(target, 1, args.src_len, cache_len)
  dc = synthetic_cache(draft, 1, args.src_len, cache_len)
  rows = res.setdefault('steps', [])
  step_ms = {}
  for k in ks + ['draft']:
    if elapsed() > args.budget_s:
      res.setdefault('skipped', []).append(f'steps k={k}')
      continue
    if k == 'draft':
      fn = bench_bound.step_loop(draft, dc, 1, length, args.steps)
    else:
      fn = bench_bound.step_loop(target, tc, k, length, args.steps)
    t = bc.interleave({'x': fn}, repeats=args.repeats)['x']
    ms = 1e3 * t['median_s'] / args.steps
    step_ms[k] = ms
    rec = {'model': 'draft' if k == 'draft' else 'target', 'tokens': 1 if k == 'draft' else k,
           'step_ms': ms, 'first_call_s': t['first_s'],
           'vs_1': ms / step_ms[1] if k != 'draft' else None,
           'goal': '<= 1.15' if k != 'draft' and 1 < k <= 8 else ''}
    if k == 'draft':
      rec['c'] = ms / step_ms[1]
      rec['goal'] = f"c = {rec['c']:.3f}"
    rows.append(rec)
    print(f"  step {rec['model']} K={rec['tokens']}: {ms:.3f} ms "
          f"(first call {t['first_s']:.1f} s)", flush=True)
    bc.write_json(args.out, res)
  res['cache_len'] = cache_len
  res['step_length'] = length


def stage_floor(args, res, target):
  if 'bandwidth' not in res or not res.get('steps'):
    res.setdefault('skipped', []).append('floor (needs bandwidth and steps)')
    return
  p = target.params
  dec = nbytes(p['decoder'])
  head = nbytes(p['lm_head']) if 'lm_head' in p else nbytes(p['shared'])
  cross_kv = sum(nbytes(layer['cross_k']) + nbytes(layer['cross_v'])
                 for layer in p['decoder']['layers'])
  c = target.config
  itemsize = target.dtype.itemsize
  cache = (2 * c.num_decoder_layers * c.inner_dim * itemsize * (res['cache_len'] + args.src_len))
  bw = res['bandwidth']['copy_gbps'] * 1e9
  step = next(r['step_ms'] for r in res['steps'] if r['model'] == 'target' and r['tokens'] == 1)
  rows = []
  for what, b in (('decoder params + lm_head (goal)', dec + head),
                  ('must-read: decoder w/o cross K/V proj + head + K/V caches',
                   dec - cross_kv + head + cache)):
    floor_ms = 1e3 * b / bw
    rows.append({'what': what, 'gbytes': b / 1e9, 'floor_ms': floor_ms, 'step_ms': step,
                 'x_floor': step / floor_ms, 'goal': '<= 1.5' if 'goal' in what else ''})
  res['floor'] = rows
  print(f"floor: 1-token step {step:.3f} ms = {rows[0]['x_floor']:.2f}x the bandwidth floor "
        f"{rows[0]['floor_ms']:.3f} ms ({rows[0]['gbytes']:.2f} GB at "
        f"{res['bandwidth']['copy_gbps']:.0f} GB/s)", flush=True)


def stage_loop(args, res, target, draft, ids):
  import bench_bound  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop as decoding  # pylint: disable=import-outside-toplevel
  g, m = args.gamma, args.max_new_tokens
  sampling = decoding.make_sampling(0.0)
  # The steps stage's cache length when it ran: the same shapes reuse its compiled loops.
  cache_len = res.get('cache_len', m + g + 1)
  length = cache_len // 2
  tc = synthetic_cache(target, 1, ids.shape[1], cache_len)
  dc = synthetic_cache(draft, 1, ids.shape[1], cache_len)
  tc_ar = synthetic_cache(target, 1, ids.shape[1], m + 1)
  fns = {
      'target_1': bench_bound.step_loop(target, tc, 1, length, args.steps),
      'draft_1': bench_bound.step_loop(draft, dc, 1, length, args.steps),
      'target_block': bench_bound.step_loop(target, tc, g + 1, length, args.steps),
      'ar_iter': bench_bound.ar_loop(target, tc_ar, m // 2, args.steps, sampling, m),
      'spec_iter': bench_bound.spec_loop(target, draft, ids, g, m, length, args.steps, sampling),
  }
  t = bc.interleave(fns, repeats=args.repeats)
  ms = {k: 1e3 * v['median_s'] / args.steps for k, v in t.items()}
  models = g * ms['draft_1'] + ms['target_block']
  res['loop'] = {
      'gamma': g, 'ms': ms, 'first_call_s': {k: v['first_s'] for k, v in t.items()},
      'rows': [
          {'what': f'speculative_step (gamma={g})', 'ms': ms['spec_iter'], 'models_ms': models,
           'overhead_ms': ms['spec_iter'] - models,
           'overhead_frac': (ms['spec_iter'] - models) / ms['spec_iter']},
          {'what': 'autoregressive iteration', 'ms': ms['ar_iter'], 'models_ms': ms['target_1'],
           'overhead_ms': ms['ar_iter'] - ms['target_1'],
           'overhead_frac': (ms['ar_iter'] - ms['target_1']) / ms['ar_iter']},
      ]}
  r = res['loop']['rows'][0]
  print(f"loop: speculative_step {r['ms']:.3f} ms vs forward passes {r['models_ms']:.3f} ms "
        f"(overhead {r['overhead_frac']:.1%})", flush=True)


def stage_end2end(args, res, target, draft, ids, temperature: float = 0.0):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  for b in [int(x) for x in args.batches.split(',')]:
    if elapsed() > args.budget_s - 30:
      res.setdefault('skipped', []).append(f'end2end T={temperature:g} B={b}')
      continue
    # Batch 1 keeps the one prompt of the other stages; larger batches get b random prompts.
    ids_b = ids if b == 1 else jax.random.randint(
        jax.random.PRNGKey(100 + b), (b, ids.shape[1]), 2, target.config.vocab_size, jnp.int32)
    for g in _gammas(args):
      _end2end_one(args, res, target, draft, ids_b, temperature, g)


def _gammas(args):
  return [int(g) for g in args.gammas.split(',')] if args.gammas else [args.gamma]


def _end2end_one(args, res, target, draft, ids, temperature, g):
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop as decoding  # pylint: disable=import-outside-toplevel
  from specjax.runner import metrics  # pylint: disable=import-outside-toplevel
  m = args.max_new_tokens
  out = {}
  kw = dict(max_new_tokens=m, eos_id=-1, temperature=temperature, rng=jax.random.PRNGKey(7))

  def spec():
    out['spec'] = decoding.speculative_decode(target, draft, ids, gamma=g, **kw)
    return out['spec'].tokens

  def ar():
    out['ar'] = decoding.autoregressive_decode(target, ids, **kw)
    return out['ar'].tokens

  t = bc.interleave({'ar': ar, 'spec': spec}, repeats=max(3, args.repeats // 2))
  s = out['spec'].stats
  iters = int(s.iterations)
  alpha = s.alpha
  c = None
  for r in res.get('steps', []):
    if r['model'] == 'draft':
      c = r['c']
  speedup = t['ar']['median_s'] / t['spec']['median_s']
  predicted = metrics.walltime_improvement(alpha, g, c) if c else None
  b = ids.shape[0]
  rec = {
      'batch': b, 'temperature': temperature, 'gamma': g, 'max_new_tokens': m,
      'ar_tokens_per_s': b * m / t['ar']['median_s'], 'spec_tokens_per_s': b * m / t['spec']['median_s'],
      'ar_s': t['ar']['median_s'], 'spec_s': t['spec']['median_s'],
      'ar_first_s': t['ar']['first_s'], 'spec_first_s': t['spec']['first_s'],
      'speedup': speedup, 'alpha': alpha,
      'iterations': iters, 'tokens_per_iter': s.tokens_per_target_call,
      'ar_ms_per_token': 1e3 * t['ar']['median_s'] / m,
      'spec_ms_per_iter': 1e3 * t['spec']['median_s'] / max(iters, 1),
      # Greedy output must be token-identical; sampled output only equal in law (not compared).
      'identical': (bool(np.array_equal(np.asarray(out['ar'].tokens),
                                        np.asarray(out['spec'].tokens)))
                    if temperature == 0 else None),
      'c': c, 'predicted': predicted,
      'measured_over_predicted': speedup / predicted if predicted else None,
  }
  res.setdefault('end2end_rows', []).append(rec)
  if g == args.gamma and b == 1:
    res['end2end' if temperature == 0 else f'end2end_t{temperature:g}'] = rec
  bc.write_json(args.out, res)
  print(f"end2end B={b} T={temperature:g} gamma={g}: speculative {rec['speedup']:.2f}x autoregressive "
        f"(alpha {alpha:.3f}, {rec['tokens_per_iter']:.2f} tokens/iter, predicted "
        f"{predicted or float('nan'):.2f}x), identical tokens: {rec['identical']}", flush=True)


def stage_refill(args, res, target, draft, ids):
  """bench_batch's refill table on this device: one queue through slots=B vs lockstep."""
  import types  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import bench_batch  # pylint: disable=import-outside-toplevel
  n = 8 if args.smoke else args.refill_n
  queue = np.asarray(jax.random.randint(jax.random.PRNGKey(200), (n, ids.shape[1]), 2,
                                        target.config.vocab_size))
  sub = types.SimpleNamespace(gamma=args.gamma, gammas=args.refill_gammas,
                              repeats=max(1, args.repeats // 3))
  for temperature in [float(t) for t in args.adaptive_temps.split(',')]:
    for b in [int(x) for x in args.batches.split(',')]:
      if elapsed() > args.budget_s - 60:
        res['skipped'].append(f'refill T={temperature:g} B={b}')
        continue
      rows = bench_batch.refill_rows(sub, target, draft, queue, temperature, min(b, n),
                                     args.max_new_tokens)
      res.setdefault('refill', []).extend(rows)
      bc.write_json(args.out, res)
      auto = [r for r in rows if r['mode'] == 'spec auto refill'][0]
      print(f'refill T={temperature:g} B={b}: ' + ', '.join(
          f"{r['mode']} {r['tok_s']:.0f} tok/s ({r['row_util']:.0%})" for r in rows)
          + f"; auto/best {auto['vs_best']:.2f} ({auto['best_fixed']})", flush=True)


def stage_pair(args, res):
  """The default run (configs/tiny.py: the shipped pair, held-out verses) through the runner."""
  import io  # pylint: disable=import-outside-toplevel
  import tempfile  # pylint: disable=import-outside-toplevel
  from specjax import configuring  # pylint: disable=import-outside-toplevel
  from specjax.runner import config as config_lib  # pylint: disable=import-outside-toplevel
  from specjax.runner import experiment  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  if root not in sys.path:  # configs/ import each other as the `configs` package
    sys.path.insert(0, root)
  name = args.pair_config or os.path.join(root, 'configs', 'tiny.py' + (':smoke' if args.smoke
                                                                          else ''))
  cfg = configuring.load_config_file(name, 'pair_config')
  with tempfile.TemporaryDirectory(prefix='gpu_step_pair_') as tmp:
    cfg.output_dir, cfg.plots, cfg.show_examples = tmp, False, 0
    spec = config_lib.run_spec(cfg)
    log = io.StringIO()
    rows = experiment.run(spec, out=log)
  res['pair'] = {'config': name, 'target': spec.target, 'rows': [
      dict({k: r.get(k) for k, _, _ in PAIR_COLUMNS},
           measured_over_predicted=r['speedup'] / r['pred_improvement'],
           baseline_s=r['baseline_s'], speculative_s=r['speculative_s'],
           pred_improvement_measured=r.get('pred_improvement_measured'),
           # greedy output must equal the baseline's; sampled output is equal only in law
           identical_to_baseline=(r['identical_to_baseline'] if r['temperature'] == 0
                                  else None))
      for r in rows]}
  bc.write_json(args.out, res)
  best = {}
  for r in res['pair']['rows']:
    t = r['temperature']
    best[t] = max(best.get(t, 0.0), r['speedup'])
  print('pair: best measured speedup ' + ', '.join(f'T={t:g} {v:.2f}x' for t, v in best.items()),
        flush=True)


def stage_end2end_t1(args, res, target, draft, ids):
  stage_end2end(args, res, target, draft, ids, temperature=1.0)


def stage_adaptive(args, res, target, draft, ids):
  """bench_adaptive's comparison on this device: fixed gamma vs stop rules vs block verification."""
  import types  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import bench_adaptive as ba  # pylint: disable=import-outside-toplevel
  from specjax.runner import metrics  # pylint: disable=import-outside-toplevel
  spec = types.SimpleNamespace(gammas=args.adaptive_gammas, block_gammas=args.adaptive_block_gammas,
                               g_max=args.adaptive_g_max, rules=args.adaptive_rules,
                               argmax_gammas='')
  m, cache_len = args.max_new_tokens, args.max_new_tokens + args.adaptive_g_max + 1
  gammas = sorted({*ba.ints(spec.gammas), *ba.ints(spec.block_gammas), spec.g_max})
  for b in [int(x) for x in args.batches.split(',')]:
    ids_b = ids if b == 1 else jax.random.randint(
        jax.random.PRNGKey(100 + b), (b, ids.shape[1]), 2, target.config.vocab_size, jnp.int32)
    c = metrics.measure_c(target, draft, ids_b, cache_len, repeats=args.repeats, steps=args.steps)
    block_cost = {g: metrics.measure_block_cost(target, ids_b, cache_len, g, repeats=args.repeats,
                                                steps=args.steps) for g in gammas}
    for temperature in [float(t) for t in args.adaptive_temps.split(',')]:
      if elapsed() > args.budget_s - 60:
        res['skipped'].append(f'adaptive B={b} T={temperature:g}')
        continue
      rows, block_rows = ba.compare(
          target, draft, np.asarray(ids_b), batch=b, temperature=temperature,
          variants=ba.variants_for(temperature, spec, c), max_new_tokens=m,
          repeats=max(3, args.repeats // 2), c=c, block_cost=block_cost, stat_seeds=2)
      rec = dict(batch=b, temperature=temperature, c=c, rows=rows, block_vs_token=block_rows,
                 block_cost={str(k): v for k, v in block_cost.items()},
                 **ba.summarise(rows, block_rows))
      res.setdefault('adaptive', []).append(rec)
      bc.write_json(args.out, res)
      print(f"\nadaptive B={b} T={temperature:g} (c {c:.3f}): best exact rule {rec['best_rule']} "
            f"vs best fixed {rec['best_fixed']}: {rec['rule_vs_fixed']:.3f}x tokens/s", flush=True)
      print(bc.markdown_table(rows, ba.COLUMNS))
      if block_rows:
        print(bc.markdown_table(block_rows, ba.BLOCK_COLUMNS), flush=True)


def _identity_one(args, target, draft, ids, label):
  """Greedy speculative vs greedy autoregressive tokens, and why they may differ: the target's
  logits along the autoregressive path computed one token per step (as autoregressive decoding
  does) and as one teacher-forced block (as verification does); where the top-2 margin is below
  the block-vs-step difference, the argmax depends on the matmul shape, not on the algorithm."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop as decoding  # pylint: disable=import-outside-toplevel
  g, m = args.gamma, args.max_new_tokens
  ar = np.asarray(decoding.autoregressive_decode(target, ids, max_new_tokens=m, eos_id=-1).tokens)
  sp = np.asarray(decoding.speculative_decode(target, draft, ids, gamma=g, max_new_tokens=m,
                                              eos_id=-1).tokens)
  diff = np.nonzero(ar[0] != sp[0])[0]
  first = int(diff[0]) if diff.size else None
  start = target.config.decoder_start_token_id
  dec_in = jnp.concatenate([jnp.full((1, 1), start, jnp.int32), jnp.asarray(ar[:, :-1])], axis=1)
  step_logits, block_logits = _path_logits(target, ids, dec_in)
  step_logits = np.asarray(step_logits[0], np.float64)
  block_logits = np.asarray(block_logits[0], np.float64)
  top2 = np.sort(step_logits, axis=-1)[:, -2:]
  margin = top2[:, 1] - top2[:, 0]
  delta = np.max(np.abs(step_logits - block_logits), axis=-1)
  step_arg, block_arg = step_logits.argmax(-1), block_logits.argmax(-1)
  rec = {
      'dtype': label, 'gamma': g, 'tokens': m,
      'identical': first is None, 'first_divergence': first, 'n_differ': int(diff.size),
      'ar_equals_step_argmax': int(np.sum(ar[0] == step_arg)),
      'block_argmax_flips': int(np.sum(step_arg != block_arg)),
      'logit_std': float(np.std(step_logits)),
      'margin_median': float(np.median(margin)), 'margin_min': float(margin.min()),
      'delta_median': float(np.median(delta)), 'delta_max': float(delta.max()),
      'margin_below_delta': int(np.sum(margin < delta)),
      'margin_at_divergence': float(margin[first]) if first is not None else None,
      'delta_at_divergence': float(delta[first]) if first is not None else None,
  }
  print(f"identity {label}: greedy speculative == autoregressive: {rec['identical']} "
        f"(first divergence {first}); block-vs-step argmax flips {rec['block_argmax_flips']}/{m}, "
        f"|block - step logits| median {rec['delta_median']:.3g} max {rec['delta_max']:.3g}, "
        f"top-2 margin median {rec['margin_median']:.3g} min {rec['margin_min']:.3g}", flush=True)
  return rec


@functools.lru_cache(maxsize=None)
def _path_logits_fn():
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  @jax.jit
  def fn(model, ids, dec_in):
    b, t = dec_in.shape
    cache = model.init_cache(ids, t + 1)

    def body(cache, x):
      tok_B, pos = x
      logits, cache = model.decode(cache, tok_B[:, None], jnp.full((b,), pos, jnp.int32))
      return cache, logits[:, 0]
    _, steps = jax.lax.scan(body, cache, (dec_in.T, jnp.arange(t, dtype=jnp.int32)))
    block, _ = model.decode(cache, dec_in, jnp.zeros((b,), jnp.int32))
    return jnp.swapaxes(steps, 0, 1), block
  return fn


def _path_logits(model, ids, dec_in):
  return _path_logits_fn()(model, ids, dec_in)


def stage_identity(args, res, target, draft, ids):
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  rows = res.setdefault('identity', [])
  label = args.dtype + (f' ({args.precision})' if args.precision else '')
  rows.append(_identity_one(args, target, draft, ids, label))
  bc.write_json(args.out, res)
  if args.dtype == 'bfloat16' and elapsed() < args.budget_s - 60:
    t32 = target.astype(jnp.float32)
    rows.append(_identity_one(args, t32, draft_view(t32, args.draft_layers), ids, 'float32'))
    del t32


def stage_tree(args, res, target, draft, ids):
  """bench_tree's comparison on this device: token trees vs chains, batch 1."""
  import types  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import bench_tree as bt  # pylint: disable=import-outside-toplevel
  spec = types.SimpleNamespace(trees=args.trees, gammas=args.tree_gammas)
  for temperature in [float(t) for t in args.tree_temps.split(',')]:
    if elapsed() > args.budget_s - 60:
      res['skipped'].append(f'tree T={temperature:g}')
      continue
    rows = bt.compare(target, draft, np.asarray(ids), temperature=temperature,
                      variants=bt.variants(spec), max_new_tokens=args.max_new_tokens,
                      repeats=max(3, args.repeats // 2), stat_seeds=2)
    res.setdefault('tree', []).append(dict(batch=1, temperature=temperature, rows=rows))
    bc.write_json(args.out, res)
    print(f'\ntree vs chain, batch 1, T={temperature:g}', flush=True)
    print(bc.markdown_table(rows, bt.COLUMNS), flush=True)


def dry_run(args) -> dict:
  """Lowers and compiles every program of the run for abstract (ShapeDtypeStruct) inputs: checks
  the XXL shapes on any backend without allocating them, and reports compile times."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import bench_bound  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop as decoding  # pylint: disable=import-outside-toplevel
  from specjax.models.t5 import DecoderCache, T5Config, T5Model, init_params  # pylint: disable=import-outside-toplevel
  dtype = jnp.bfloat16 if args.dtype == 'bfloat16' else jnp.float32
  config = T5Config(**SHAPES[args.shape])
  params = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0), dtype))
  dparams = dict(params)
  for stack in ('encoder', 'decoder'):
    dparams[stack] = dict(params[stack], layers=params[stack]['layers'][:args.draft_layers])
  dconfig = dataclasses.replace(config, num_layers=args.draft_layers,
                                num_decoder_layers=args.draft_layers)
  target, draft = T5Model(params, config), T5Model(dparams, dconfig)
  ks = sorted({1, *(int(k) for k in args.ks.split(','))})
  g, m, s = args.gamma, args.max_new_tokens, args.src_len
  cache_len = m + max(max(ks), g + 1) + 1
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731

  def cache(model, t):
    c = model.config
    kv = jax.ShapeDtypeStruct((1, c.num_heads, t, c.d_kv), dtype)  # head-major caches
    cr = jax.ShapeDtypeStruct((1, c.num_heads, s, c.d_kv), dtype)
    n = c.num_decoder_layers
    return DecoderCache(self_k=(kv,) * n, self_v=(kv,) * n, cross_k=(cr,) * n, cross_v=(cr,) * n,
                        enc_mask=jax.ShapeDtypeStruct((1, s), bool))

  f = bench_bound._jitted()
  samp = decoding.make_sampling(0.0)
  key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
  mdraft = decoding.as_draft(draft)
  state = jax.eval_shape(lambda t, d, x: decoding.speculative_init(
      t, d, x, jax.random.PRNGKey(0), gamma=g, max_new_tokens=m), target, mdraft, i32(1, s))
  programs = {f'step target K={k}': lambda k=k: f['step'].lower(
      target, cache(target, cache_len), i32(1, k), i32(1), steps=args.steps) for k in ks}
  programs.update({
      'step draft K=1': lambda: f['step'].lower(draft, cache(draft, cache_len), i32(1, 1), i32(1),
                                                steps=args.steps),
      'ar loop': lambda: f['ar'].lower(target, cache(target, m + 1), i32(1), key,
                                       steps=args.steps, sampling=samp, max_new_tokens=m),
      'spec init': lambda: f['spec_init'].lower(target, mdraft, i32(1, s), key, gamma=g,
                                                max_new_tokens=m),
      'spec loop': lambda: f['spec'].lower(target, mdraft, state, i32(1), gamma=g,
                                           max_new_tokens=m, sampling=samp, steps=args.steps),
      'speculative_decode': lambda: decoding.speculative_program.lower(
          target, mdraft, i32(1, s), key, gamma=g, max_new_tokens=m, sampling=samp, eos_id=-1),
      'autoregressive_decode': lambda: decoding.autoregressive_program.lower(
          target, i32(1, s), key, max_new_tokens=m, sampling=samp, eos_id=-1),
  })
  rows = []
  for name, lower in programs.items():
    t0 = time.perf_counter()
    try:
      lowered = lower()
      t1 = time.perf_counter()
      lowered.compile()
      rows.append({'program': name, 'lower_s': t1 - t0, 'compile_s': time.perf_counter() - t1})
    except Exception as e:  # pylint: disable=broad-except
      rows.append({'program': name, 'error': f'{type(e).__name__}: {e}'[:500]})
    print(f'  {rows[-1]}', flush=True)
  print(bc.markdown_table(rows, [('program', 'program', ''), ('lower_s', 'lower s', '.1f'),
                                 ('compile_s', 'compile s', '.1f'), ('error', 'error', '')]))
  return {'dry_run': rows, 'args': vars(args)}


def main(argv=None) -> dict:
  args = parse_args(argv)
  if args.dry_run:
    res = dry_run(args)
    bc.write_json(args.out, res)
    return res
  gate = bc.load_gate(args)
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  if args.precision:
    jax.config.update('jax_default_matmul_precision', args.precision)
  info = bc.machine_info()
  info['devices'] = [str(d) for d in jax.devices()]
  print(f'machine: {bc.describe_machine(info)}; devices {info["devices"]}')
  dtype = jnp.bfloat16 if args.dtype == 'bfloat16' else jnp.float32
  res = {'machine': info, 'args': vars(args), 'skipped': [], 'errors': {}}
  stages = args.stages.split(',')

  def run(name, fn, *a, min_left_s=0.0):
    if name not in stages:
      return
    if elapsed() + min_left_s > args.budget_s:
      res['skipped'].append(name)
      print(f'skipping {name}: {elapsed():.0f} s used of --budget_s={args.budget_s:.0f}')
      return
    t0 = time.perf_counter()
    try:
      fn(args, res, *a)
    except Exception as e:  # pylint: disable=broad-except  # keep the other stages' results
      res['errors'][name] = f'{type(e).__name__}: {e}'[:2000]
      print(f'{name} FAILED: {res["errors"][name]}', flush=True)
    res.setdefault('stage_s', {})[name] = time.perf_counter() - t0
    bc.write_json(args.out, res)

  run('bandwidth', stage_bandwidth)
  run('pair', stage_pair)
  if not set(stages) - {'bandwidth', 'pair'}:  # no stage needs the random --shape model
    return _finish(args, res, gate)
  t0 = time.perf_counter()
  target, draft = make_pair(args.shape, dtype, args.draft_layers, args.damp)
  jax.block_until_ready(target.params)
  res['params_s'] = time.perf_counter() - t0
  res['target_params'] = sum(x.size for x in jax.tree.leaves(target.params))
  res['draft_params'] = sum(x.size for x in jax.tree.leaves(draft.params))
  res['target_bytes'] = nbytes(target.params)
  print(f"{args.shape} target {res['target_params'] / 1e9:.3f} B params "
        f"({res['target_bytes'] / 1e9:.2f} GB {args.dtype}), draft {res['draft_params'] / 1e9:.3f} B "
        f"(first {args.draft_layers} blocks, shared arrays); made on device in {res['params_s']:.1f} s",
        flush=True)
  ids = jax.random.randint(jax.random.PRNGKey(3), (1, args.src_len), 2, target.config.vocab_size,
                           jnp.int32)
  run('steps', stage_steps, target, draft)
  run('floor', stage_floor, target)
  run('identity', stage_identity, target, draft, ids, min_left_s=60 if args.shape == 'xxl' else 0)
  run('loop', stage_loop, target, draft, ids, min_left_s=60 if args.shape == 'xxl' else 0)
  run('end2end', stage_end2end, target, draft, ids, min_left_s=90 if args.shape == 'xxl' else 0)
  run('end2end_t1', stage_end2end_t1, target, draft, ids,
      min_left_s=90 if args.shape == 'xxl' else 0)
  run('adaptive', stage_adaptive, target, draft, ids, min_left_s=120 if args.shape == 'xxl' else 0)

  run('tree', stage_tree, target, draft, ids, min_left_s=120 if args.shape == 'xxl' else 0)
  run('refill', stage_refill, target, draft, ids, min_left_s=120 if args.shape == 'xxl' else 0)

  return _finish(args, res, gate)


def _finish(args, res, gate) -> dict:
  """Prints every table the run filled and writes the JSON with the load at the end."""
  if res.get('steps'):
    print(f'\n{args.shape}: decoder step, batch 1, cache {res.get("cache_len")} positions '
          f'(rows at {res.get("step_length")}), source {args.src_len}, {args.dtype}')
    print(bc.markdown_table(res['steps'], STEP_COLUMNS))
  if res.get('floor'):
    print(f"\nBandwidth floor (copy {res['bandwidth']['copy_gbps']:.1f} GB/s, "
          f"read {res['bandwidth']['read_gbps']:.1f} GB/s)")
    print(bc.markdown_table(res['floor'], FLOOR_COLUMNS))
  if res.get('loop'):
    print('\nSpeculative loop overhead (compiled loop, per iteration)')
    print(bc.markdown_table(res['loop']['rows'], LOOP_COLUMNS))
  if res.get('end2end_rows'):
    e = res['end2end_rows'][0]
    print(f"\nEnd to end (random prompts of {args.src_len} tokens, {e['max_new_tokens']} "
          f"new tokens per row; predicted = Theorem 3.8 with this alpha and c, a batch-1 formula)")
    print(bc.markdown_table(res['end2end_rows'], E2E_COLUMNS))
  if res.get('pair'):
    print(f"\nThe shipped pair end to end ({res['pair']['config']}; measured = the runner's "
          f"baseline / speculative wall time, predicted = Theorem 3.8 with its alpha and c)")
    print(bc.markdown_table(res['pair']['rows'], PAIR_COLUMNS))
  if res.get('identity'):
    print('\nGreedy identity (speculative vs autoregressive tokens) and the target\'s logits along '
          'the autoregressive path: 1-token steps vs one teacher-forced block')
    print(bc.markdown_table(res['identity'], IDENTITY_COLUMNS))
  if res['skipped'] or res['errors']:
    print(f"skipped: {res['skipped']}; errors: {res['errors']}")
  res['wall_s'] = elapsed()
  bc.finish_load(gate, res, args.out)
  return res


if __name__ == '__main__':
  main()
