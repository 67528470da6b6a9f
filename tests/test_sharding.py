"""Sharding: partition rules (in-process, any device count) and sharded decoding on 8 CPU devices.

The multi-device checks need XLA_FLAGS=--xla_force_host_platform_device_count=8 set before JAX is
imported, while the rest of the pytest process runs JAX on one device. So this file doubles as the
helper script: `python tests/test_sharding.py` (run by `test_sharded_decoding_matches_single_device`
in a subprocess, once, to pay JAX start-up and compilation once) builds every mesh, decodes, and
prints one JSON line that the tests below assert on.
"""

import os
import sys
from pathlib import Path

_SUBPROCESS = __name__ == '__main__'
_FLAGS = ('--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 '
          '--xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false')
if _SUBPROCESS:  # before jax is imported
  os.environ['XLA_FLAGS'] = _FLAGS
  os.environ['JAX_PLATFORMS'] = 'cpu'
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dataclasses  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P  # noqa: E402

from specjax.models import sharding as sh  # noqa: E402
from specjax.models.t5 import T5Config, T5Model, init_params  # noqa: E402
from specjax.testing import tiny_t5  # noqa: E402

MESHES = ((1, 8), (2, 4), (8, 1))
GAMMA, MAX_NEW = 3, 10
MARK = 'SHARDING_JSON '

# Pair A: 8 heads, d_ff and vocab divisible by 8: everything shards. Target gated + untied head
# (wi_0/wi_1/lm_head), draft ReLU + tied head (wi, shared as head).
TARGET_A = T5Config(vocab_size=128, d_model=32, d_kv=4, d_ff=64, num_layers=1,
                    num_decoder_layers=2, num_heads=8, gated=True, tie_word_embeddings=False,
                    scale_logits=False)
DRAFT_A = T5Config(vocab_size=128, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                   num_decoder_layers=1, num_heads=8)
# Pair B: vocab 100 (not divisible by 8: replicated on (1, 8), sharded on (2, 4)); the target has
# 6 heads (replicated attention on both) but d_ff 48 (sharded).
TARGET_B = T5Config(vocab_size=100, d_model=24, d_kv=4, d_ff=48, num_layers=1,
                    num_decoder_layers=2, num_heads=6)
DRAFT_B = T5Config(vocab_size=100, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                   num_decoder_layers=1, num_heads=8, gated=True, tie_word_embeddings=False,
                   scale_logits=False)


def _model(config, seed):
  return tiny_t5(config, seed, scale=2.0)


def _inputs(vocab, seed, batch=8, length=7):
  ids = np.array(jax.random.randint(jax.random.PRNGKey(seed), (batch, length), 2, vocab), np.int32)
  ids[1 % batch, 4:] = 0  # padded rows
  ids[5 % batch, 2:] = 0
  return ids


# ============================================================================= the subprocess


def _mesh_checks() -> dict:
  from specjax.decoding.loop import autoregressive_decode, speculative_decode
  from specjax.models.t5 import init_cache

  res = {'device_count': jax.device_count(), 'runs': {}, 'errors': {}}
  t_start = time.time()

  # make_mesh
  res['mesh_minus1'] = list(sh.make_mesh((-1, 4)).devices.shape)
  res['mesh_minus1_b'] = list(sh.make_mesh((8, -1)).devices.shape)
  for bad in ((3, -1), (2, 2), (4, 4)):
    try:
      sh.make_mesh(bad)
      res['errors'][str(bad)] = None
    except ValueError as e:
      res['errors'][str(bad)] = str(e)

  def tokens(out):
    return np.asarray(out.tokens).tolist()

  def decode_all(target, draft, ids, modes):
    out = {}
    for mode in modes:
      kind, temp = mode.split('_')
      temperature = 0.0 if temp == 'greedy' else 1.0
      if kind == 'spec':
        o = speculative_decode(target, draft, ids, gamma=GAMMA, max_new_tokens=MAX_NEW,
                               temperature=temperature, rng=7)
      else:
        o = autoregressive_decode(target, ids, max_new_tokens=MAX_NEW, temperature=temperature,
                                  rng=7)
      out[mode] = tokens(o)
    return out

  pairs = {
      'A': (_model(TARGET_A, 1), _model(DRAFT_A, 2), _inputs(128, 3),
            ('spec_greedy', 'spec_sample', 'ar_greedy', 'ar_sample'), MESHES),
      # (8, 1) is pure data parallelism: the speculative modes cover it (AR adds nothing there).
      'B': (_model(TARGET_B, 4), _model(DRAFT_B, 5), _inputs(100, 6),
            ('spec_greedy', 'ar_greedy'), ((1, 8), (2, 4))),
  }
  res['specs'], res['timings'] = {}, {}
  res['timings']['setup'] = round(time.time() - t_start, 1)
  for name, (target, draft, ids, modes, meshes) in pairs.items():
    t0 = time.time()
    res['runs'][f'{name}/single'] = decode_all(target, draft, ids, modes)
    res['timings'][f'{name}/single'] = round(time.time() - t0, 1)
    for shape in meshes:
      mesh_modes = [m for m in modes if m.startswith('spec')] if shape == (8, 1) else modes
      mesh = sh.make_mesh(shape)
      ts, ds = sh.shard_model(target, mesh), sh.shard_model(draft, mesh)
      x = sh.shard_batch(ids, mesh)
      key = f'{name}/{shape[0]}x{shape[1]}'
      t0 = time.time()
      res['runs'][key] = decode_all(ts, ds, x, mesh_modes)
      res['timings'][key] = round(time.time() - t0, 1)
      lay = ts.params['decoder']['layers'][0]
      res['specs'][key] = {
          'shared': str(ts.params['shared'].sharding.spec),
          'self_q': str(lay['self_q'].sharding.spec),
          'cross_o': str(lay['cross_o'].sharding.spec),
          'wo': str(lay['wo'].sharding.spec),
          'rel_bias': str(ts.params['decoder']['rel_bias'].sharding.spec),
          'final_norm': str(ts.params['decoder']['final_norm'].sharding.spec),
          'input_ids': str(x.sharding.spec),
          'q_shard_shape': list(lay['self_q'].addressable_shards[0].data.shape),
          'shared_shard_shape': list(ts.params['shared'].addressable_shards[0].data.shape),
      }
      if 'lm_head' in ts.params:
        res['specs'][key]['lm_head'] = str(ts.params['lm_head'].sharding.spec)

  # Pair A on (2, 4): the same program inside `jax.set_mesh(mesh)`, a model placed tensor by
  # tensor through sharding_for_tensor + put_sharded (as a streaming loader does), and the caches.
  target, draft, ids = pairs['A'][:3]
  mesh = sh.make_mesh((2, 4))
  ts, ds, x = sh.shard_model(target, mesh), sh.shard_model(draft, mesh), sh.shard_batch(ids, mesh)
  with jax.set_mesh(mesh):  # a mesh context is optional; check it changes nothing
    res['runs']['A/2x4/set_mesh'] = {'ar_greedy': tokens(autoregressive_decode(
        ts, x, max_new_tokens=MAX_NEW, rng=7))}

  flat, treedef = jax.tree_util.tree_flatten_with_path(target.params)
  streamed, same = [], True
  for path, leaf in flat:
    host = np.asarray(leaf)
    keys = tuple(getattr(k, 'key', getattr(k, 'idx', None)) for k in path)
    sharding = sh.sharding_for_tensor(keys, host.shape, target.config, mesh)
    reads = []

    def read(index, host=host, reads=reads):
      reads.append(index)
      return host[index]

    arr = sh.put_sharded(read, sharding, shape=host.shape, dtype=host.dtype)
    want = ts.params
    for k in keys:
      want = want[k]
    same &= arr.sharding == want.sharding and bool(np.array_equal(np.asarray(arr), host))
    # Only the shards this process holds are read (all of them here: one host); a fully
    # replicated tensor is read once.
    want_reads = {str(s.index) for s in arr.addressable_shards}
    same &= {str(i) for i in reads} == want_reads and len(reads) <= len(mesh.devices.flat)
    streamed.append(arr)
  res['streamed_equal'] = same
  tstream = T5Model(jax.tree_util.tree_unflatten(treedef, streamed), target.config)
  res['runs']['A/2x4/streamed'] = {'spec_greedy': tokens(speculative_decode(
      tstream, ds, x, gamma=GAMMA, max_new_tokens=MAX_NEW))}

  # load_t5(mesh=...): a saved checkpoint streamed straight into sharded device arrays.
  import tempfile  # pylint: disable=import-outside-toplevel
  from specjax.models.checkpoints import load_t5, save_t5  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as tmp:
    save_t5(target, tmp + '/target')
    loaded = load_t5(tmp + '/target', mesh=mesh)
  res['loaded_q_spec'] = str(loaded.params['decoder']['layers'][0]['self_q'].sharding.spec)
  res['runs']['A/2x4/load_t5_mesh'] = {'spec_greedy': tokens(speculative_decode(
      loaded, ds, x, gamma=GAMMA, max_new_tokens=MAX_NEW))}

  cache = jax.jit(lambda m, x: init_cache(m.params, m.config, x, 16))(ts, x)
  res['cache_propagated'] = {'self_k': str(cache.self_k[0].sharding.spec),
                             'cross_k': str(cache.cross_k[0].sharding.spec)}
  want = sh.cache_shardings(target.config, mesh, ids.shape[0])
  with jax.set_mesh(mesh):
    constrained = jax.jit(lambda m, x: sh.constrain_cache(init_cache(m.params, m.config, x, 16),
                                                          m.config))(ts, x)
  res['cache_constrained_ok'] = all(
      a.sharding.is_equivalent_to(s, a.ndim)
      for a, s in zip(jax.tree.leaves(constrained), jax.tree.leaves(want)))
  res['cache_spec'] = str(sh.cache_partition_spec(target.config, mesh, 8).self_k[0])
  res['seconds'] = round(time.time() - t_start, 1)
  return res


# ============================================================================= in-process tests


def _abstract_mesh(shape):
  return AbstractMesh(tuple(shape), sh.MESH_AXES)


T5_11B = T5Config(vocab_size=32128, d_model=1024, d_kv=128, d_ff=65536, num_layers=24,
                  num_decoder_layers=24, num_heads=128)
V11_XXL = T5Config(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24,
                   num_decoder_layers=24, num_heads=64, gated=True, tie_word_embeddings=False,
                   scale_logits=False)


def _shapes(config):
  return jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0), jnp.bfloat16))


def _by_path(specs):
  flat = jax.tree_util.tree_flatten_with_path(specs)[0]
  return {sh._path_str(p): s for p, s in flat}


def test_every_param_leaf_matches_exactly_one_rule():
  for config in (TARGET_A, DRAFT_A, TARGET_B, DRAFT_B, T5_11B, V11_XXL):
    shapes = _shapes(config)
    for path, _ in jax.tree_util.tree_flatten_with_path(shapes)[0]:
      name = sh._path_str(path)
      hits = [r for r, _ in sh.PARAM_RULES if re.fullmatch(r, name)]
      assert len(hits) == 1, (name, hits)
      sh.logical_axes_for(path)  # the same check through the API
  # And every rule is used by some config (no dead rules).
  names = [sh._path_str(p) for c in (TARGET_A, DRAFT_A)
           for p, _ in jax.tree_util.tree_flatten_with_path(_shapes(c))[0]]
  for rule, _ in sh.PARAM_RULES:
    assert any(re.fullmatch(rule, n) for n in names), rule


def test_unmatched_or_ambiguous_leaf_is_an_error(monkeypatch):
  import pytest
  mesh = _abstract_mesh((1, 8))
  params = dict(_shapes(DRAFT_A))
  params['extra_bias'] = jax.ShapeDtypeStruct((16,), jnp.float32)
  with pytest.raises(ValueError, match="no partition rule matches params path 'extra_bias'"):
    sh.param_partition_specs(params, DRAFT_A, mesh)
  with pytest.raises(ValueError, match='no partition rule'):
    sh.sharding_for_tensor(('decoder', 'layers', 0, 'q'), (16, 32), DRAFT_A, mesh)  # encoder name
  with pytest.raises(ValueError, match=r"params 'shared': shape \(128,\) has 1 dims but"):
    sh.sharding_for_tensor(('shared',), (128,), DRAFT_A, mesh)
  rules = sh.PARAM_RULES + ((r'shared', (None, None)),)
  monkeypatch.setattr(sh, '_COMPILED_RULES', tuple((re.compile(r), a) for r, a in rules))
  with pytest.raises(ValueError, match="'shared' matches 2 partition rules"):
    sh.logical_axes_for(('shared',))


def test_t5_11b_specs_without_materialising():
  shapes = _shapes(T5_11B)
  for mesh_shape in ((1, 8), (2, 4), (1, 16)):
    specs = _by_path(sh.param_partition_specs(shapes, T5_11B, _abstract_mesh(mesh_shape)))
    assert specs['shared'] == P('model', None)  # 32128 = 8 * 4016 = 16 * 2008
    assert 'lm_head' not in specs  # tied
    for stack in ('encoder', 'decoder'):
      assert specs[f'{stack}/rel_bias'] == P(None, 'model')  # 128 heads
      assert specs[f'{stack}/final_norm'] == P(None)
    assert specs['encoder/layers/0/q'] == P(None, 'model')
    assert specs['encoder/layers/23/o'] == P('model', None)
    assert specs['encoder/layers/5/wi'] == P(None, 'model')
    assert specs['encoder/layers/5/wo'] == P('model', None)
    assert specs['encoder/layers/5/attn_norm'] == P(None)
    for pre in ('self_', 'cross_'):
      assert specs[f'decoder/layers/23/{pre}k'] == P(None, 'model')
      assert specs[f'decoder/layers/23/{pre}o'] == P('model', None)
    assert specs['decoder/layers/0/cross_norm'] == P(None)
    assert len(specs) == len(jax.tree.leaves(shapes))
  # Per-device bytes on (1, 8): about 1/8 of the ~22 GB (norms are replicated).
  mesh = _abstract_mesh((1, 8))
  total = per_device = 0
  for (_, x), spec in zip(jax.tree_util.tree_flatten_with_path(shapes)[0],
                          jax.tree.leaves(sh.param_partition_specs(shapes, T5_11B, mesh))):
    n = x.size * x.dtype.itemsize
    total += n
    per_device += n // (8 if 'model' in tuple(spec) else 1)
  assert 21e9 < total < 23e9, total
  assert per_device < total / 7.9


def test_v11_xxl_untied_head_and_gated_ffn():
  specs = _by_path(sh.param_partition_specs(_shapes(V11_XXL), V11_XXL, _abstract_mesh((2, 4))))
  assert specs['lm_head'] == P(None, 'model')
  assert specs['shared'] == P('model', None)
  assert specs['decoder/layers/3/wi_0'] == P(None, 'model')
  assert specs['decoder/layers/3/wi_1'] == P(None, 'model')
  assert specs['decoder/layers/3/wo'] == P('model', None)


def test_indivisible_dims_fall_back_to_replication():
  # vocab 100 on 8: replicated; on 4: sharded. 6 heads: attention replicated, d_ff 48 sharded.
  s8 = _by_path(sh.param_partition_specs(_shapes(TARGET_B), TARGET_B, _abstract_mesh((1, 8))))
  s4 = _by_path(sh.param_partition_specs(_shapes(TARGET_B), TARGET_B, _abstract_mesh((2, 4))))
  assert s8['shared'] == P(None, None) and s4['shared'] == P('model', None)
  for s in (s8, s4):
    assert s['encoder/layers/0/q'] == P(None, None)  # 6 heads: whole heads per shard impossible
    assert s['encoder/layers/0/o'] == P(None, None)
    assert s['decoder/rel_bias'] == P(None, None)
    assert s['decoder/layers/1/wo'] == P('model', None)
  # t5-base-like: 12 heads, d_kv 64 (H*Dk = 768 divides by 8, but heads do not).
  base = dataclasses.replace(T5_11B, num_heads=12, d_kv=64, d_model=768, d_ff=3072, num_layers=1,
                             num_decoder_layers=1, vocab_size=32100)
  sb = _by_path(sh.param_partition_specs(_shapes(base), base, _abstract_mesh((1, 8))))
  assert sb['encoder/layers/0/q'] == P(None, None)
  assert sb['shared'] == P(None, None)  # 32100 % 8 != 0
  assert sb['encoder/layers/0/wi'] == P(None, 'model')
  sb4 = _by_path(sh.param_partition_specs(_shapes(base), base, _abstract_mesh((1, 4))))
  assert sb4['encoder/layers/0/q'] == P(None, 'model') and sb4['shared'] == P('model', None)
  # A (N, 1) mesh replicates every param; the trivial 'model' axis is never named.
  s81 = sh.param_partition_specs(_shapes(TARGET_A), TARGET_A, _abstract_mesh((8, 1)))
  assert all(all(a is None for a in s) for s in jax.tree.leaves(s81))


def test_explicit_axis_meshes_are_rejected():
  import pytest
  mesh = AbstractMesh((2, 4), sh.MESH_AXES, axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  with pytest.raises(ValueError, match=r"AxisType.Explicit .*make_mesh"):
    sh.param_partition_specs(_shapes(DRAFT_A), DRAFT_A, mesh)
  with pytest.raises(ValueError, match=r"must include \('data', 'model'\)"):
    sh.cache_partition_spec(DRAFT_A, AbstractMesh((8,), ('x',)))


def test_cache_and_batch_specs():
  m = _abstract_mesh((2, 4))
  c = sh.cache_partition_spec(TARGET_A, m, batch_size=8)
  assert len(c.self_k) == len(c.cross_v) == TARGET_A.num_decoder_layers
  assert c.self_k[0] == c.cross_v[1] == P('data', 'model', None, None)  # [B, H, T, Dk]
  assert c.enc_mask == P('data', None)
  c = sh.cache_partition_spec(TARGET_B, m, batch_size=3)  # 6 heads on 4, 3 rows on 2
  assert c.self_v[0] == P(None, None, None, None) and c.enc_mask == P(None, None)
  assert sh.batch_sharding(m, 8).spec == P('data', None)
  assert sh.batch_sharding(m, 5).spec == P(None, None)
  assert sh.batch_sharding(m).spec == P('data', None)


def test_make_mesh_on_this_process():
  import pytest
  n = jax.device_count()
  mesh = sh.make_mesh((1, -1))
  assert mesh.axis_names == ('data', 'model') and mesh.devices.shape == (1, n)
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
  assert sh.make_mesh((-1, 1)).devices.shape == (n, 1)
  with pytest.raises(ValueError, match=r'mesh_shape=\(1, %d\) has %d devices but there are %d'
                     % (8 * n, 8 * n, n)):
    sh.make_mesh((1, 8 * n))
  for bad, msg in (((8,), 'two integers'), ((1, 2, 3), 'two integers'), ('ab', 'two integers'),
                   ((1.5, 1), 'two integers'), ((0, 1), 'positive'), ((-1, -1), 'at most one'),
                   ((-2, 1), 'positive')):
    with pytest.raises(ValueError, match='mesh_shape=') as e:
      sh.make_mesh(bad)
    assert msg in str(e.value) and '\n' not in str(e.value)


def test_single_device_mesh_round_trip():
  """Sharding on a (1, 1) mesh only re-places arrays (runs in-process on one device)."""
  mesh = sh.make_mesh((1, 1), devices=jax.devices()[:1])
  model = _model(DRAFT_A, 2)
  sharded = sh.shard_model(model, mesh)
  for a, b in zip(jax.tree.leaves(model.params), jax.tree.leaves(sharded.params)):
    assert isinstance(b.sharding, NamedSharding)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  x = sh.shard_batch(_inputs(128, 3, batch=2), mesh)
  assert x.sharding.spec == P(None, None) and x.dtype == np.int32


def test_initialize_distributed_is_a_noop_on_one_host(monkeypatch):
  for var in ('JAX_COORDINATOR_ADDRESS', 'TPU_PROCESS_ADDRESSES', 'TPU_WORKER_HOSTNAMES',
              'MEGASCALE_COORDINATOR_ADDRESS', 'SLURM_NTASKS', 'OMPI_COMM_WORLD_SIZE'):
    monkeypatch.delenv(var, raising=False)
  called = []
  monkeypatch.setattr(jax.distributed, 'initialize', lambda **kw: called.append(kw))
  assert sh.initialize_distributed() is False and not called
  assert sh.is_multi_host_env({'TPU_WORKER_HOSTNAMES': 'localhost'}) is None  # single-host TPU VM
  assert sh.is_multi_host_env({'TPU_WORKER_HOSTNAMES': 'h0,h1,h2,h3'}).startswith('TPU pod')
  assert sh.is_multi_host_env({'SLURM_NTASKS': '1', 'SLURM_JOB_ID': '3'}) is None
  assert sh.is_multi_host_env({'SLURM_NTASKS': '4', 'SLURM_JOB_ID': '3'}).startswith('SLURM')
  monkeypatch.setenv('JAX_COORDINATOR_ADDRESS', '10.0.0.1:1234')
  monkeypatch.setenv('JAX_NUM_PROCESSES', '2')
  monkeypatch.setenv('JAX_PROCESS_ID', '1')
  assert sh.initialize_distributed() is True
  assert called == [{'num_processes': 2, 'process_id': 1}]


# ============================================================================= multi-device


_RESULT = None


def _subprocess_result():
  global _RESULT
  if _RESULT is None:
    env = dict(os.environ, XLA_FLAGS=_FLAGS, JAX_PLATFORMS='cpu')
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                          timeout=600, cwd=str(Path(__file__).resolve().parents[1]))
    lines = [l for l in proc.stdout.splitlines() if l.startswith(MARK)]
    assert proc.returncode == 0 and lines, (proc.returncode, proc.stdout[-3000:],
                                            proc.stderr[-3000:])
    _RESULT = json.loads(lines[-1][len(MARK):])
  return _RESULT


def test_sharded_decoding_matches_single_device():
  res = _subprocess_result()
  assert res['device_count'] == 8
  runs = res['runs']
  for name, meshes in (('A', MESHES), ('B', ((1, 8), (2, 4)))):
    ref = runs[f'{name}/single']
    for shape in meshes:
      got = runs[f'{name}/{shape[0]}x{shape[1]}']
      want = {m for m in ref if m.startswith('spec')} if shape == (8, 1) else set(ref)
      assert set(got) == want, (name, shape, sorted(got))
      for mode, toks in got.items():
        assert toks == ref[mode], (name, shape, mode)
  # Sampling really samples (differs from greedy), and the samples are reproducible per seed.
  ref = runs['A/single']
  assert ref['spec_sample'] != ref['spec_greedy'] and ref['ar_sample'] != ref['ar_greedy']
  assert runs['A/2x4/set_mesh']['ar_greedy'] == ref['ar_greedy']
  assert runs['A/2x4/streamed']['spec_greedy'] == ref['spec_greedy']
  assert runs['A/2x4/load_t5_mesh']['spec_greedy'] == ref['spec_greedy']
  assert res['loaded_q_spec'] == str(P(None, 'model'))
  assert res['streamed_equal']


def test_sharded_layouts_on_8_devices():
  res = _subprocess_result()
  s = res['specs']
  for shape in ('1x8', '2x4'):
    a = s[f'A/{shape}']
    assert a['shared'] == str(P('model', None))
    assert a['lm_head'] == str(P(None, 'model'))
    assert a['self_q'] == str(P(None, 'model')) and a['cross_o'] == str(P('model', None))
    assert a['wo'] == str(P('model', None)) and a['rel_bias'] == str(P(None, 'model'))
    assert a['final_norm'] == str(P(None))
  assert s['A/1x8']['q_shard_shape'] == [32, 4] and s['A/2x4']['q_shard_shape'] == [32, 8]
  assert s['A/1x8']['input_ids'] == str(P(None, None))  # data axis of size 1: not named
  assert s['A/2x4']['input_ids'] == str(P('data', None))
  assert s['A/8x1']['input_ids'] == str(P('data', None))
  assert s['A/8x1']['self_q'] == str(P(None, None))
  # Vocab 100: replicated over 8, sharded over 4.
  assert s['B/1x8']['shared'] == str(P(None, None)) and s['B/1x8']['shared_shard_shape'] == [100, 24]
  assert s['B/2x4']['shared'] == str(P('model', None)) and s['B/2x4']['shared_shard_shape'] == [25, 24]
  assert s['B/2x4']['self_q'] == str(P(None, None))  # 6 heads
  # Caches: propagation already gives the cross cache batch x heads sharding; constrain_cache pins
  # every cache leaf (self cache included) to cache_partition_spec.
  assert res['cache_propagated']['cross_k'] == str(P('data', 'model'))
  assert res['cache_spec'] == str(P('data', 'model', None, None))
  assert res['cache_constrained_ok']


def test_make_mesh_with_8_devices():
  res = _subprocess_result()
  assert res['mesh_minus1'] == [2, 4] and res['mesh_minus1_b'] == [8, 1]
  errors = res['errors']
  assert 'mesh_shape=(3, -1)' in errors['(3, -1)'] and 'do not divide' in errors['(3, -1)']
  assert 'mesh_shape=(2, 2) has 4 devices but there are 8' in errors['(2, 2)']
  assert 'mesh_shape=(4, 4) has 16 devices but there are 8' in errors['(4, 4)']


if _SUBPROCESS:
  print(MARK + json.dumps(_mesh_checks()), flush=True)
