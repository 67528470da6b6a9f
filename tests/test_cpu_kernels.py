"""The CPU decode kernels (specjax/models/cpu_kernels.{cc,py}) against XLA's own arithmetic.

Shapes: M rows, K input features, N output features, B batch, Q query rows, H heads, T keys.

What must hold: the packed matmul and the decode attention compute what `x @ W` and `t5.attend`
compute (float64 references, float32 tolerances); every output row is the same whatever the
number of rows computed with it (bitwise); a packed model decodes like the same model on XLA's
dots (logits close, greedy tokens identical to plain greedy decoding), also when its weights are
quantized (then both paths compute the quantized target); the AVX2 build agrees with the
reference too; the argmax and row-lookup kernels return exactly what jnp.argmax and jnp indexing
return; without the kernel everything runs on XLA with a one-line notice.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import testing
from specjax.models import cpu_kernels, t5

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f'CPU kernel unavailable: {cpu_kernels.status()}')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rel_err(out, ref):
  ref = np.asarray(ref, np.float64)
  return float(np.max(np.abs(np.asarray(out, np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-30))


# ----------------------------------------------------------------------------- matmul


@pytest.mark.parametrize('weights', cpu_kernels.WEIGHTS)
@pytest.mark.parametrize('k,n', [(64, 100), (37, 65), (512, 32)])
def test_matmul_matches_reference_and_rows_are_independent(weights, k, n):
  rng = np.random.default_rng(k + n)
  w = cpu_kernels.pack(jnp.asarray(rng.normal(size=(k, n)), jnp.float32), weights)
  w_ref = np.asarray(cpu_kernels.unpack(w), np.float64)
  x = jnp.asarray(rng.normal(size=(64, k)), jnp.float32)
  full = np.asarray(jax.jit(cpu_kernels.matmul)(x, w))
  assert full.shape == (64, n)
  assert _rel_err(full, np.asarray(x, np.float64) @ w_ref) < 2e-6
  for m in (1, 3, 8, 13):  # any row count, any row tile: bitwise the same rows
    part = np.asarray(jax.jit(cpu_kernels.matmul)(x[:m], w))
    np.testing.assert_array_equal(part, full[:m])


def test_other_tiles_give_bitwise_the_same_products():
  """A second build with another tile (cpu_kernels.variant: 32-column panels, 2-row tiles, no
  panel pairs) computes every output as the same FMA chain: bitwise what the built tile gives."""
  rng = np.random.default_rng(3)
  w = jnp.asarray(rng.normal(size=(67, 75)), jnp.float32)
  x = jnp.asarray(rng.normal(size=(13, 67)), jnp.float32)
  ref = {m: np.asarray(jax.jit(lambda a, b: cpu_kernels.matmul(a, b))(x[:m], cpu_kernels.pack(w)))
         for m in (1, 2, 5, 13)}
  with cpu_kernels.variant('-DSPECJAX_PANEL=32 -DSPECJAX_ROWS=2 -DSPECJAX_PAIR_ROWS=0',
                           'test') as width:
    packed = cpu_kernels.pack(w)
    assert width == 32 and packed.data.shape == (3, 67, 32)
    other = {m: np.asarray(jax.jit(lambda a, b: cpu_kernels.matmul(a, b))(x[:m], packed))
             for m in (1, 2, 5, 13)}
  assert cpu_kernels.panel_width() in (16, 32) and cpu_kernels.TARGET == 'specjax_packed_matmul'
  for m, out in ref.items():
    np.testing.assert_array_equal(other[m], out)


def test_attention_split_over_threads_changes_nothing():
  """Splitting the (batch row, head) pairs over the workers (a build that always splits) gives
  bitwise what one thread gives (the shapes here are below the default threshold)."""
  rng = np.random.default_rng(4)
  q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32)
             for s in ((2, 3, 4, 16), (2, 4, 21, 16), (2, 4, 21, 16)))
  bias = jnp.zeros((2, 4, 3, 21)).at[..., 17:].set(t5.NEG_INF)
  one = np.asarray(jax.jit(lambda *a: cpu_kernels.attention(*a))(q, k, v, bias))
  with cpu_kernels.variant('-DSPECJAX_ATTENTION_SERIAL=0', 'split'):
    split = np.asarray(jax.jit(lambda *a: cpu_kernels.attention(*a))(q, k, v, bias))
  np.testing.assert_array_equal(split, one)


def test_quantize_stores_what_unpack_returns():
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(40, 70)), jnp.float32)
  q8 = cpu_kernels.pack(w, 'int8')
  c = cpu_kernels.panel_width()  # 16 on AVX2, 32 on AVX-512 (the row tile the registers hold)
  assert c in (16, 32)
  assert q8.data.dtype == jnp.int8 and q8.weights == 'int8'
  assert q8.data.shape == (-(-70 // c), 40, c)
  scale = np.max(np.abs(np.asarray(w)), axis=0) / 127
  err = np.abs(np.asarray(cpu_kernels.unpack(q8)) - np.asarray(w))
  assert (err <= scale / 2 * (1 + 1e-5)).all()
  bf = cpu_kernels.unpack(cpu_kernels.pack(w, 'bfloat16'))
  np.testing.assert_array_equal(np.asarray(bf), np.asarray(w.astype(jnp.bfloat16), np.float32))
  np.testing.assert_array_equal(np.asarray(cpu_kernels.unpack(cpu_kernels.pack(w))), np.asarray(w))
  with pytest.raises(ValueError, match='weights='):
    cpu_kernels.pack(w, 'int4')


def test_matmul_differentiates_and_vmaps():
  rng = np.random.default_rng(1)
  w_kn = jnp.asarray(rng.normal(size=(24, 40)), jnp.float32)
  w = cpu_kernels.pack(w_kn)
  x = jnp.asarray(rng.normal(size=(3, 2, 24)), jnp.float32)
  out = jax.vmap(lambda r: cpu_kernels.matmul(r, w))(x)
  np.testing.assert_allclose(out, x @ w_kn, rtol=1e-5, atol=1e-5)
  g = jax.grad(lambda r: jnp.sum(jnp.sin(cpu_kernels.matmul(r, w))))(x[0])
  g_ref = jax.grad(lambda r: jnp.sum(jnp.sin(r @ w_kn)))(x[0])
  np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('weights', cpu_kernels.WEIGHTS)
def test_matmul_rows_skips_padding_and_keeps_the_rest_bitwise(weights):
  rng = np.random.default_rng(7)
  w_kn = jnp.asarray(rng.normal(size=(48, 70)), jnp.float32)
  w = cpu_kernels.pack(w_kn, weights)
  x = jnp.asarray(rng.normal(size=(3, 11, 48)), jnp.float32)
  rows = jnp.array([11, 4, 0], jnp.int32)
  full = np.asarray(jax.jit(cpu_kernels.matmul)(x, w))
  out = np.asarray(jax.jit(cpu_kernels.matmul)(x, w, rows))
  keep = np.arange(11)[None, :] < np.asarray(rows)[:, None]
  np.testing.assert_array_equal(out[keep], full[keep])  # the same FMA chain per row
  assert (out[~keep] == 0).all()
  # Negative control: rows past the count are really skipped (an off-by-one would keep row 4).
  assert (full[1, 4] != 0).any() and (out[1, 4] == 0).all()
  g = jax.grad(lambda r: jnp.sum(jnp.sin(cpu_kernels.matmul(r, w, rows))))(x)
  w_ref = cpu_kernels.unpack(w)
  g_ref = jax.grad(lambda r: jnp.sum(jnp.where(keep[..., None], jnp.sin(r @ w_ref), 0.0)))(x)
  np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-4)  # cos of kernel vs XLA sums
  assert (np.asarray(g)[~keep] == 0).all()
  with pytest.raises(ValueError, match='rows_B'):
    cpu_kernels.matmul(x[0], w, rows)


# ----------------------------------------------------------------------------- attention


@pytest.mark.parametrize('b,q,h,d,t', [(1, 1, 8, 64, 46), (2, 6, 8, 64, 45), (3, 5, 2, 8, 17)])
def test_attention_matches_attend(b, q, h, d, t):
  rng = np.random.default_rng(b * q + t)
  q_ = jnp.asarray(rng.normal(size=(b, q, h, d)), jnp.float32)
  k_ = jnp.asarray(rng.normal(size=(b, h, t, d)), jnp.float32)
  v_ = jnp.asarray(rng.normal(size=(b, h, t, d)), jnp.float32)
  bias = jnp.asarray(rng.normal(size=(b, h, q, t)), jnp.float32)
  bias = bias.at[..., t // 2:].set(t5.NEG_INF)  # masked keys get exactly zero weight
  ref = t5.attend(q_.transpose(0, 2, 1, 3), k_, v_, bias)
  out = jax.jit(cpu_kernels.attention)(q_, k_, v_, bias)
  assert _rel_err(out, ref) < 2e-6
  one = jax.jit(cpu_kernels.attention)(q_[:, :1], k_, v_, bias[:, :, :1])
  np.testing.assert_array_equal(np.asarray(one), np.asarray(out[:, :1]))
  mask = jnp.where(jnp.arange(t) < t - 2, 0.0, t5.NEG_INF)[None, None, None, :]  # broadcast
  ref = t5.attend(q_.transpose(0, 2, 1, 3), k_, v_, jnp.broadcast_to(mask, (b, h, q, t)))
  assert _rel_err(jax.jit(cpu_kernels.attention)(q_, k_, v_, mask), ref) < 2e-6


# ----------------------------------------------------------------------------- models


def _target(family):
  config = testing.tiny_config(family, d_model=32, d_kv=16, d_ff=48, vocab_size=70)
  if config.gated:
    params = testing.spread_params(t5.init_params(config, jax.random.PRNGKey(1), scale=2.0), 1)
  else:
    params = testing.spread_params(t5.init_params(config, jax.random.PRNGKey(1), scale=4.0), 1,
                                   emb=0.5, final_norm=8.0)
  return t5.T5Model(params=params, config=config)


def _prompts(batch=4, s=6, vocab=70, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(2, vocab, (batch, s)).astype(np.int32)
  ids[1, 4:] = 0  # ragged
  return ids


@pytest.fixture(scope='module', params=['original', 'v11'])
def models(request):
  target = _target(request.param)
  return target, target.pack()


def test_packed_decode_matches_xla_and_blocks_match_single_steps(models):
  target, packed = models
  assert target.packed is None and packed.packed is not None and packed.weights == 'float32'
  ids = jnp.asarray(_prompts())
  lengths = jnp.array([0, 3, 5, 2], jnp.int32)
  toks = jnp.asarray(np.random.default_rng(3).integers(2, 70, (4, 6)), jnp.int32)
  cache = jax.jit(target.init_cache, static_argnums=1)(ids, 16)
  ref, _ = jax.jit(target.decode)(cache, toks, lengths)
  blk, _ = jax.jit(packed.decode)(cache, toks, lengths)
  assert _rel_err(blk, ref) < 1e-5
  c, steps = cache, []
  for j in range(toks.shape[1]):  # the same block fed one token at a time
    lg, c = jax.jit(packed.decode)(c, toks[:, j:j + 1], lengths + j)
    steps.append(lg)
  steps = jnp.concatenate(steps, 1)
  assert float(jnp.max(jnp.abs(steps - blk))) < 1e-5 * float(jnp.max(jnp.abs(blk)))
  np.testing.assert_array_equal(np.asarray(steps.argmax(-1)), np.asarray(blk.argmax(-1)))


@pytest.mark.parametrize('gamma', [1, 4])
def test_packed_greedy_is_token_identical(models, gamma):
  target, packed = models
  draft = testing.add_noise(target, 0.1, seed=5).pack()
  ids = _prompts()
  base = specjax.autoregressive_decode(target, ids, max_new_tokens=12)
  fast = specjax.autoregressive_decode(packed, ids, max_new_tokens=12)
  spec = specjax.speculative_decode(packed, draft, ids, gamma=gamma, max_new_tokens=12)
  np.testing.assert_array_equal(fast.tokens, base.tokens)
  np.testing.assert_array_equal(spec.tokens, base.tokens)


@pytest.mark.parametrize('weights', ['int8', 'bfloat16'])
def test_quantized_target_is_one_model_on_both_paths(models, weights):
  target, _ = models
  quant = target.pack(weights)
  assert quant.weights == weights
  assert quant.packed['lm_head'].data.dtype == (jnp.int8 if weights == 'int8' else jnp.bfloat16)
  xla = quant.unpack()  # the same (quantized) values in params, on XLA's dots
  moved = float(jnp.max(jnp.abs(xla.params['decoder']['layers'][0]['wo']
                                - target.params['decoder']['layers'][0]['wo'])))
  assert moved > 0  # the weights really are quantized
  ids = _prompts()
  base = specjax.autoregressive_decode(xla, ids, max_new_tokens=12)
  spec = specjax.speculative_decode(quant, testing.add_noise(target, 0.1, seed=5).pack(), ids,
                                    gamma=3, max_new_tokens=12)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  ids_j = jnp.asarray(ids)
  cache = quant.init_cache(ids_j, 8)
  toks = jnp.asarray(np.full((4, 3), 5, np.int32))
  a, _ = jax.jit(quant.decode)(cache, toks, jnp.zeros(4, jnp.int32))
  b, _ = jax.jit(xla.decode)(cache, toks, jnp.zeros(4, jnp.int32))
  assert _rel_err(a, b) < 1e-5


def test_replace_repacks_and_astype_keeps_the_kernel(models):
  target, packed = models
  new_params = testing.add_noise(target, 0.3, seed=9).params
  moved = packed.replace(params=new_params)
  assert moved.packed is not None
  ids = jnp.asarray(_prompts())
  cache = target.init_cache(ids, 8)
  toks = jnp.full((4, 2), 7, jnp.int32)
  zero = jnp.zeros(4, jnp.int32)
  a, _ = moved.decode(cache, toks, zero)
  b, _ = target.replace(params=new_params).decode(cache, toks, zero)
  assert _rel_err(a, b) < 1e-5  # not the stale packed weights
  assert packed.astype(jnp.float32).packed is not None


def test_encoder_skips_padding_without_changing_the_source_tokens(models, monkeypatch):
  """init_cache multiplies only up to each source's last token: its cache at the source's
  positions is bitwise what the full products give, and decoding does not depend on padding."""
  _, packed = models
  ids = _prompts(s=6)
  wide = jnp.asarray(np.pad(ids, ((0, 0), (0, 10))))
  assert list(np.asarray(t5.source_rows(wide != 0))) == [6, 4, 6, 6]
  skip = jax.jit(packed.init_cache, static_argnums=1)(wide, 16)
  monkeypatch.setattr(t5, 'source_rows', lambda mask: jnp.full(mask.shape[:1], mask.shape[1]))
  full = jax.jit(packed.init_cache, static_argnums=1)(wide, 16)
  monkeypatch.undo()
  mask = np.asarray(skip.enc_mask)
  for a, b in zip(skip.cross_k + skip.cross_v, full.cross_k + full.cross_v):
    a, b = np.asarray(a).transpose(0, 2, 1, 3), np.asarray(b).transpose(0, 2, 1, 3)  # [B, S, ..]
    np.testing.assert_array_equal(a[mask], b[mask])
    assert np.isfinite(a).all() and (a[~mask] != b[~mask]).any()  # padding really skipped
  short = specjax.autoregressive_decode(packed, ids, max_new_tokens=8)
  long = specjax.autoregressive_decode(packed, np.asarray(wide), max_new_tokens=8)
  np.testing.assert_array_equal(long.tokens, short.tokens)


def test_lossless_storage_is_bf16_only_where_no_weight_changes(tmp_path):
  target = _target('v11')
  specjax.save_t5(target, tmp_path / 'f32')
  assert specjax.load_t5(tmp_path / 'f32', quantize='lossless').weights == 'float32'
  bf16 = target.replace(params=jax.tree.map(
      lambda p: p.astype(jnp.bfloat16).astype(jnp.float32), target.params))
  specjax.save_t5(bf16, tmp_path / 'bf16')
  exact = specjax.load_t5(tmp_path / 'bf16')
  lossless = specjax.load_t5(tmp_path / 'bf16', quantize='lossless')
  assert exact.weights == 'float32' and lossless.weights == 'bfloat16'
  ids = jnp.asarray(_prompts())
  toks = jnp.asarray(np.random.default_rng(4).integers(2, 70, (4, 3)), jnp.int32)
  lengths = jnp.zeros((4,), jnp.int32)
  out = []
  for m in (exact, lossless):
    cache = jax.jit(m.init_cache, static_argnums=1)(ids, 8)
    out.append(np.asarray(jax.jit(m.decode)(cache, toks, lengths)[0]))
  np.testing.assert_array_equal(out[1], out[0])  # half the bytes, the same logits
  assert specjax.load_t5(tmp_path / 'bf16', quantize='lossless', cpu_kernel=False).packed is None


def test_load_t5_packs_on_cpu_and_quantizes(tmp_path):
  target = _target('v11')
  specjax.save_t5(target, tmp_path / 'm')
  auto = specjax.load_t5(tmp_path / 'm')
  assert auto.packed is not None and auto.weights == 'float32'
  assert specjax.load_t5(tmp_path / 'm', cpu_kernel=False).packed is None
  q = specjax.load_t5(tmp_path / 'm', quantize='int8', cpu_kernel=False)
  assert q.packed is None
  w = q.params['lm_head']
  stored, scale = cpu_kernels.quantize(w, 'int8')
  np.testing.assert_allclose(w, stored.astype(jnp.float32) * scale, rtol=1e-6)
  assert specjax.load_t5(tmp_path / 'm', quantize='int8').weights == 'int8'
  with pytest.raises(ValueError, match='quantize='):
    specjax.load_t5(tmp_path / 'm', quantize='fp8')


# ----------------------------------------------------------------------------- builds


def _run(code, **env):
  full = {**os.environ, **env}
  return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True,
                        text=True, env=full, cwd=REPO, timeout=300, check=False)


@pytest.mark.skipif('avx2' not in cpu_kernels._cpu_flags(), reason='no AVX2 on this CPU')  # pylint: disable=protected-access
def test_avx2_build_matches_reference(tmp_path):
  """The AVX2+FMA variant (what a CPU without AVX-512 builds) computes the same."""
  done = _run('''
      import numpy as np, jax, jax.numpy as jnp
      from specjax.models import cpu_kernels, t5
      assert cpu_kernels.available(), cpu_kernels.status()
      rng = np.random.default_rng(0)
      for weights in cpu_kernels.WEIGHTS:
        w = cpu_kernels.pack(jnp.asarray(rng.normal(size=(37, 70)), jnp.float32), weights)
        x = jnp.asarray(rng.normal(size=(11, 37)), jnp.float32)
        ref = np.asarray(x, np.float64) @ np.asarray(cpu_kernels.unpack(w), np.float64)
        out = np.asarray(cpu_kernels.matmul(x, w))
        assert np.max(np.abs(out - ref)) < 2e-6 * np.max(np.abs(ref)), weights
        for m in (1, 2, 4, 6):  # panel pairs (<= 2 rows), the 6-row tile, its tails: same rows
          np.testing.assert_array_equal(np.asarray(cpu_kernels.matmul(x[:m], w)), out[:m])
      assert cpu_kernels.panel_width() == 16
      q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32)
                 for s in ((2, 3, 4, 24), (2, 4, 19, 24), (2, 4, 19, 24)))
      bias = jnp.zeros((2, 4, 3, 19)).at[..., 15:].set(t5.NEG_INF)
      ref = t5.attend(q.transpose(0, 2, 1, 3), k, v, bias)
      assert float(jnp.max(jnp.abs(cpu_kernels.attention(q, k, v, bias) - ref))) < 1e-5
      x = rng.normal(size=(5, 4001)).astype(np.float32)
      x[1, [9, 4000]] = np.nan; x[2, 4000] = np.nan; x[3, [7, 300]] = 99.0; x[4] = -np.inf
      assert (np.asarray(cpu_kernels.argmax(jnp.asarray(x))) == [int(np.argmax(x[0])), 9, 4000,
                                                                7, 0]).all()
      print('ok', cpu_kernels.build().name)
      ''', SPECJAX_CPU_KERNEL_CFLAGS='-march=x86-64-v3', XDG_CACHE_HOME=str(tmp_path),
      JAX_PLATFORMS='cpu')
  assert done.returncode == 0 and 'ok' in done.stdout, done.stderr[-2000:]


def test_without_the_kernel_models_use_xla(tmp_path):
  code = '''
      import specjax
      from specjax import data
      from specjax.models import cpu_kernels
      print(cpu_kernels.status())
      target = specjax.load_t5(data.TINY_PAIR_DIR / 'draft')
      print('packed' if target.packed is not None else 'xla')
      '''
  off = _run(code, SPECJAX_CPU_KERNEL='0', XDG_CACHE_HOME=str(tmp_path))
  assert off.returncode == 0, off.stderr[-2000:]
  assert off.stdout.split() == ['xla', '(SPECJAX_CPU_KERNEL=0)', 'xla']
  assert 'kernel' not in off.stderr  # asked for: no notice
  # No compiler: XLA's dots, and one line that says why.
  nocc = _run(code, XDG_CACHE_HOME=str(tmp_path), CXX='', PATH=str(tmp_path))
  assert nocc.returncode == 0, nocc.stderr[-2000:]
  assert nocc.stdout.split()[-1] == 'xla'
  assert 'specjax: CPU decode kernel off (no C++ compiler found (set CXX, or install g++)); ' \
         'using XLA dots' in nocc.stderr
  # No compiler, and the kernel demanded: one clear error.
  forced = _run(code, SPECJAX_CPU_KERNEL='1', XDG_CACHE_HOME=str(tmp_path), CXX='',
                PATH=str(tmp_path))
  assert forced.returncode != 0
  assert 'specjax CPU kernel unavailable (SPECJAX_CPU_KERNEL=1): no C++ compiler found' in (
      forced.stderr)


# ----------------------------------------------------------------------------- sampling


def test_sample_cdf_kernel_draws_what_the_cumulative_sum_says():
  from specjax.decoding import sampling  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(7)
  w = np.abs(rng.normal(size=(64, 9))).astype(np.float32)
  w[:, 4] = 0.0          # a zero-weight token is never drawn
  w[3] = 0.0             # an all-zero row: the last token, as the XLA path
  w[5, 6:] = 0.0         # rounding past the end: the last positive-weight token
  u = rng.uniform(size=(64,)).astype(np.float32)
  u[:4] = (0.0, np.nextafter(np.float32(1), np.float32(0)), 0.5, 0.25)
  fast = np.asarray(jax.jit(cpu_kernels.sample_cdf)(jnp.asarray(u), jnp.asarray(w)))
  slow = np.asarray(jax.jit(sampling._by_cumsum)(jnp.asarray(u), jnp.asarray(w)))  # pylint: disable=protected-access
  cdf = np.cumsum(w.astype(np.float64), -1)
  ref = np.array([min(int(np.sum(c <= x * c[-1])), 8 if c[-1] == 0 else int(np.flatnonzero(r)[-1]))
                  for c, x, r in zip(cdf, u.astype(np.float64), w)])
  np.testing.assert_array_equal(fast, ref)
  np.testing.assert_array_equal(slow, ref)
  assert 4 not in set(fast.tolist())
  assert fast[3] == 8 and fast[5] <= 5


# ----------------------------------------------------------------------------- rows and argmax


def _argmax_cases():
  """Rows that probe jnp.argmax's rules: ties (first index), -0.0 against 0.0, all -inf, NaN
  (the first NaN wins, also when it sits in the scalar tail past the vector lanes), V not a
  multiple of any vector width."""
  rng = np.random.default_rng(3)
  x = rng.normal(size=(9, 4001)).astype(np.float32)
  x[0, [5, 900, 4000]] = 9.0
  x[1] = 0.0
  x[1, 2] = -0.0
  x[1, 0] = -1.0
  x[2] = -np.inf
  x[3, [17, 3000]] = np.nan
  x[4, 4000] = np.nan
  x[5, :3] = (np.inf, np.inf, np.nan)
  x[6, 3999] = 50.0
  return x


def test_argmax_kernel_is_jnp_argmax():
  from specjax import ops  # pylint: disable=import-outside-toplevel
  x = _argmax_cases()
  want = np.asarray(jnp.argmax(jnp.asarray(x), axis=-1))
  np.testing.assert_array_equal(np.asarray(jax.jit(cpu_kernels.argmax)(jnp.asarray(x))), want)
  np.testing.assert_array_equal(want[:6], [5, 1, 0, 17, 4000, 2])
  # ops.argmax takes the kernel on the CPU, XLA's two reductions elsewhere: both agree.
  np.testing.assert_array_equal(np.asarray(jax.jit(ops.argmax)(jnp.asarray(x))), want)
  # (XLA:CPU's max reduction need not propagate a NaN, so the fallback is held to NaN-free rows.)
  clean = ~np.isnan(x).any(-1)
  fallback = ops._argmax  # pylint: disable=protected-access
  np.testing.assert_array_equal(np.asarray(fallback(jnp.asarray(x[clean]))), want[clean])
  # Leading axes, vmap, bf16 inputs and a short last axis.
  x3 = jnp.asarray(x[:8].reshape(2, 4, 4001))
  np.testing.assert_array_equal(np.asarray(jax.vmap(cpu_kernels.argmax)(x3)),
                                want[:8].reshape(2, 4))
  xb = jnp.asarray(x[6:8, :7]).astype(jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(ops.argmax(xb)), np.asarray(jnp.argmax(xb, -1)))


def test_take_rows_kernel_is_jnp_indexing():
  rng = np.random.default_rng(4)
  table = jnp.asarray(rng.normal(size=(50, 37)), jnp.float32)
  ids = jnp.asarray([[0, 3, -1, 49], [60, -70, 7, 7]], jnp.int32)  # wrap, clamp, repeats
  for t in (table, table.astype(jnp.bfloat16)):
    np.testing.assert_array_equal(np.asarray(jax.jit(cpu_kernels.take_rows)(t, ids)),
                                  np.asarray(t[ids]))
  np.testing.assert_array_equal(
      np.asarray(jax.vmap(cpu_kernels.take_rows, (None, 0))(table, ids)), np.asarray(table[ids]))
  loss = lambda f: lambda t: jnp.sum(f(t) ** 2 * jnp.arange(37.0))  # noqa: E731
  np.testing.assert_allclose(jax.grad(loss(lambda t: cpu_kernels.take_rows(t, ids)))(table),
                             jax.grad(loss(lambda t: t[ids]))(table), rtol=1e-6)
  # t5.embed takes the kernel for a block of rows on the packed path only.
  fake_packed = {}
  np.testing.assert_array_equal(np.asarray(t5.embed(table, ids, fake_packed)),
                                np.asarray(table[ids]))
  np.testing.assert_array_equal(np.asarray(t5.embed(table, ids[:1, :1], fake_packed)),
                                np.asarray(table[ids[:1, :1]]))
