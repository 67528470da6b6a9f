"""Multi-layer fusion for the feature head (HeadConfig.feature_taps, EAGLE-3 style).

Shapes: N rows, V vocab, M = 3 generated tokens, Df the target's d_model, Di = Df (1 + #taps).

The target's feature pass with taps returns its final state followed by the tapped layers'
outputs, the logits unchanged (the last layer's tap, normalised by the final norm, is the final
state); a tapped head holds exactly those teacher-forced features after every iteration; greedy
output is token-identical to autoregressive decoding through chains, static and dynamic trees,
on XLA and on the CPU kernels; the joint law of the first three tokens matches the target's at
T = 1 and 0.7 (chi-square, N = 20,000 rows) and the always-accept control is rejected with the
same head; heads saved before taps existed load unchanged; bad taps are one-line errors.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chi2 import chi2_pvalue  # tests/chi2.py
from specjax.decoding import loop
from specjax.decoding.feature_head import FeatureHeadDraft
from specjax.decoding.sampling import Sampling
from specjax.models import cpu_kernels
from specjax.models import head as head_lib
from specjax.models import t5
from test_feature_head import (ALWAYS_ACCEPT, M, N, PROMPT, SEED, _greedy_pair, _head, _target,
                               counts_of, exact_law)

TAPS = (0, 1)


def tapped_head(target, seed=1, scale=1.0, taps=TAPS):
  return _head(target, seed, scale, feature_taps=taps)


@functools.lru_cache(maxsize=None)
def law_pair():
  target = _target()
  return target, tapped_head(target)


@functools.lru_cache(maxsize=None)
def greedy_pair():
  target, _ = _greedy_pair()
  return target, tapped_head(target, seed=4, scale=2.0)


def test_taps_follow_the_final_state_and_leave_the_logits():
  target, _ = greedy_pair()
  ids = jnp.asarray(np.random.RandomState(0).randint(2, 48, (2, 7)), jnp.int32)
  toks = jnp.asarray(np.random.RandomState(1).randint(2, 48, (2, 4)), jnp.int32)
  lengths = jnp.array([0, 5], jnp.int32)
  cache = target.init_cache(ids, 16)
  last = target.config.num_decoder_layers - 1
  logits, x, _ = target.decode_features(cache, toks, lengths)
  logits_t, x_t, _ = target.decode_features(cache, toks, lengths, taps=(last, 0))
  df = target.config.d_model
  assert x_t.shape == x.shape[:-1] + (3 * df,)
  np.testing.assert_array_equal(np.asarray(logits_t), np.asarray(logits))
  np.testing.assert_array_equal(np.asarray(x_t[..., :df]), np.asarray(x))
  normed = t5.rms_norm(x_t[..., df:2 * df], target.params['decoder']['final_norm'],
                       target.config.layer_norm_epsilon)
  np.testing.assert_allclose(np.asarray(normed), np.asarray(x), rtol=1e-5, atol=1e-5)
  assert float(jnp.max(jnp.abs(x_t[..., 2 * df:] - x_t[..., df:2 * df]))) > 1e-3  # layer 0
  for bad in ((0, 0), (last + 1,), (-1,)):
    with pytest.raises(ValueError, match='feature taps') as e:
      target.decode_features(cache, toks, lengths, taps=bad)
    assert '\n' not in str(e.value)


def test_tapped_head_holds_the_teacher_forced_fused_features():
  target, draft = greedy_pair()
  ids = np.random.RandomState(2).randint(2, 48, (3, 8)).astype(np.int32)
  ids[2, 5:] = 0
  gamma, max_new = 3, 12
  state = loop.speculative_init(target, draft, jnp.asarray(ids), jax.random.PRNGKey(6),
                                gamma=gamma, max_new_tokens=max_new)
  step = jax.jit(functools.partial(loop.speculative_step, gamma=gamma, max_new_tokens=max_new,
                                   sampling=Sampling(temperature=1.0), eos_id=-1))

  @jax.jit
  def teacher_forced(seq):
    cache = t5.init_cache(target.params, target.config, jnp.asarray(ids), seq.shape[1])
    x, _ = t5.decode_hidden(target.params, target.config, cache, seq,
                            jnp.zeros((3,), jnp.int32), taps=TAPS)
    return x

  iterations = 0
  while not bool(np.all(np.asarray(state.done))):
    state = step(target, draft, state)
    iterations += 1
    hidden = np.asarray(teacher_forced(jnp.asarray(np.asarray(state.seq)[:, :max_new + 1])))
    prev = np.asarray(state.draft_state.prev_BxNxDf)
    assert prev.shape[-1] == draft.config.input_dim == hidden.shape[-1]
    for b in range(3):
      lb = min(int(state.lengths[b]), max_new - 1)
      np.testing.assert_allclose(prev[b, 1:lb + 1], hidden[b, :lb], rtol=1e-5, atol=1e-5)
  assert iterations > 2


def _greedy_identical(target, head):
  ids = np.random.RandomState(0).randint(2, 48, (3, 9)).astype(np.int32)
  ids[1, 6:] = 0
  base = loop.autoregressive_decode(target, ids, max_new_tokens=14)
  for kw in (dict(gamma=1), dict(gamma=4), dict(tree=(2, 2, 1)), dict(tree='dynamic:4,2,1')):
    out = loop.speculative_decode(target, head, ids, max_new_tokens=14, **kw)
    np.testing.assert_array_equal(out.tokens, base.tokens, err_msg=str(kw))


def test_tapped_head_greedy_identical():
  _greedy_identical(*greedy_pair())


@pytest.mark.skipif(not cpu_kernels.available(), reason=cpu_kernels.status())
def test_tapped_head_on_the_kernels():
  target, head = greedy_pair()
  target = target.pack()
  head = FeatureHeadDraft.for_target(target, (head.params, head.config))
  assert head.packed is not None
  ids = jnp.asarray(np.random.RandomState(3).randint(2, 48, (3, 7)), jnp.int32)
  state = jax.jit(lambda i: head.init(i, 16, target_cache=target.init_cache(i, 16)))(ids)
  toks = jnp.asarray(np.random.RandomState(4).randint(2, 48, (3, 4)), jnp.int32)
  feats = jnp.asarray(np.random.RandomState(5).normal(size=(3, 4, head.config.input_dim)),
                      jnp.float32)
  run = jax.jit(lambda h: head_lib.block(head.params, head.config, state.cache,
                                         head.target_embed_VxDf, state.cross_k, state.cross_v,
                                         state.enc_mask, toks, feats,
                                         jnp.array([0, 3, 9], jnp.int32), fast=h)[:2])
  (f_fast, l_fast), (f_ref, l_ref) = run(head.packed), run(None)
  assert f_fast.shape == f_ref.shape == (3, 4, head.config.input_dim)
  for fast, ref in ((f_fast, f_ref), (l_fast, l_ref)):
    assert float(jnp.max(jnp.abs(fast - ref))) < 1e-5 * float(jnp.max(jnp.abs(ref)))
  _greedy_identical(target, head)


@functools.lru_cache(maxsize=None)
def law_pvalue(temperature, verifier='token'):
  target, draft = law_pair()
  out = loop.speculative_decode(target, draft, np.repeat(PROMPT, N, axis=0), gamma=2,
                                max_new_tokens=M, temperature=temperature,
                                rng=jax.random.PRNGKey(SEED), eos_id=-1, verifier=verifier)
  assert (np.asarray(out.lengths) == M).all()
  hist = np.asarray(jax.device_get(out.stats.accepted_hist)).sum(0)
  return chi2_pvalue(counts_of(out.tokens), exact_law(Sampling(temperature=temperature))), hist


@pytest.mark.parametrize('temperature', [1.0, 0.7])
def test_tapped_head_follows_target_law(temperature):
  p, hist = law_pvalue(temperature)
  print(f'tapped head T={temperature}: chi-square p = {p:.3g}, accepted hist {hist}')
  assert hist.min() > 1000, hist
  assert p > 1e-3


def test_tapped_head_law_control_is_rejected():
  p, _ = law_pvalue(1.0, ALWAYS_ACCEPT)
  print(f'tapped head, always-accept control: chi-square p = {p:.3g}')
  assert p < 1e-6


def test_heads_without_taps_load_and_bad_taps_are_one_line(tmp_path):
  target, head = greedy_pair()
  old = head_lib.HeadConfig.for_target(target.config, d_model=8, num_heads=2, d_kv=4, d_ff=16)
  params = head_lib.init_head_params(old, jax.random.PRNGKey(0))
  head_lib.save_head(params, old, tmp_path / 'old')
  cfg_file = tmp_path / 'old' / head_lib.CONFIG_NAME
  text = cfg_file.read_text()
  cfg_file.write_text(text.replace('  "feature_taps": [],\n', ''))  # as written before taps
  assert 'feature_taps' not in cfg_file.read_text()
  loaded, config = head_lib.load_head(tmp_path / 'old')
  assert config == old and config.feature_taps == () and config.input_dim == config.feature_dim
  head_lib.save_head(head.params, head.config, tmp_path / 'new')
  loaded, config = head_lib.load_head(tmp_path / 'new')
  assert config.feature_taps == TAPS and loaded['in_proj'].shape[0] == 4 * config.feature_dim
  bad = head_lib.HeadConfig.for_target(target.config, d_model=8, num_heads=2, d_kv=4, d_ff=16,
                                       feature_taps=(target.config.num_decoder_layers,))
  with pytest.raises(ValueError, match='feature taps') as e:
    FeatureHeadDraft.for_target(target, (head_lib.init_head_params(bad, jax.random.PRNGKey(0)),
                                         bad))
  assert '\n' not in str(e.value)
