"""FeatureHeadDraft: a draft head on the target's own features (specjax.decoding.feature_head).

Shapes: N rows, V vocab, G gamma, M = 3 generated tokens, Df the target's d_model.

Exactness: one batched speculative_decode of N = 20,000 copies of one prompt with a random tiny
head; the joint law of the first M = 3 tokens against the target's enumerated law (chi-square),
at T = 1 and 0.7 and under a stop rule; the engine's controls (always accept, residual replaced
by p) and a head that reuses one step's sampling noise must be rejected (p < 1e-6).
Greedy: token-identical to autoregressive_decode for several gamma, ragged batch, EOS rows; each
row alone gives the tokens it gives in the batch. Plumbing: after every iteration the features
the head holds equal the target's teacher-forced hidden states at the same positions (accepts,
rejects and rollbacks all occur); the head runs no encoder (traced calls counted). Packed: with
the target on the CPU kernels the head's pass runs on them too, matching XLA's pass, greedy
identical, and the law test (with the always-accept control rejected) on the kernel path.
"""

import contextlib
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from chi2 import chi2_pvalue  # tests/chi2.py
from specjax.decoding import acceptance, loop, protocol, stopping
from specjax.decoding.feature_head import FeatureHeadDraft
from specjax.decoding.sampling import Sampling, probs
from specjax.models import cpu_kernels
from specjax.models import head as head_lib
from specjax.models import t5
from specjax.models.t5 import T5Config, T5Model, init_params

V, N, M, GAMMA = 12, 20_000, 3, 2
PROMPT = np.array([[5, 3, 9, 2, 0]], np.int32)
SEED = 2024


def _target():
  config = T5Config(vocab_size=V, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_decoder_layers=2,
                    num_heads=2, relative_attention_num_buckets=8,
                    relative_attention_max_distance=8, gated=True, tie_word_embeddings=False,
                    scale_logits=False)
  return T5Model(init_params(config, jax.random.PRNGKey(0)), config)


def _head(target, seed=1, scale=1.0, parallel=False, **config_kw):
  """A random width-8 head; `config_kw` go to HeadConfig (feature_taps=, parallel_depth=)."""
  hc = head_lib.HeadConfig.for_target(target.config, d_model=8, num_heads=2, d_kv=4, d_ff=16,
                                      **config_kw)
  params = head_lib.init_head_params(hc, jax.random.PRNGKey(seed))
  params = jax.tree.map(lambda p: p * scale if p.ndim == 2 else p, params)
  # A non-zero start feature, so position 0 reads something learned-looking.
  params['start_feature'] = jax.random.normal(jax.random.PRNGKey(seed + 7), (hc.input_dim,))
  if hc.parallel_depth:  # parallel blocks that change q (they start at zero, as depth 1)
    params['par_out'] = 2.0 * jax.random.normal(jax.random.PRNGKey(seed + 9),
                                                params['par_out'].shape)
  return FeatureHeadDraft.for_target(target, (params, hc), parallel=parallel)


@functools.lru_cache(maxsize=None)
def models():
  target = _target()
  return target, _head(target)


def exact_law(sampling):
  prefixes = np.array(list(itertools.product(range(V), repeat=2)), np.int32)
  dec_in = np.concatenate([np.zeros((V * V, 1), np.int32), prefixes], axis=1)
  logits = models()[0].logits(np.repeat(PROMPT, V * V, axis=0), dec_in)
  p = np.asarray(probs(logits, sampling), np.float64).reshape(V, V, 3, V)
  law = p[0, 0, 0][:, None, None] * p[:, 0, 1][:, :, None] * p[:, :, 2]
  return law / law.sum()


def head_as(draft_cls, draft=None):
  """The test head as an instance of `draft_cls` (a control's own class: its own programs)."""
  draft = draft or models()[1]
  return draft_cls(**{f: getattr(draft, f) for f in ('params', 'target_embed_VxDf', 'config',
                                                    'candidates')})


def counts_of(tokens, m=M):
  """Counts over the V^3 cells of the first three tokens of every row."""
  tokens = np.asarray(tokens)[:, :m]
  return np.bincount(tokens[:, :3] @ np.array([V * V, V, 1]), minlength=V ** 3)


@functools.lru_cache(maxsize=None)
def law_pvalue(sampling, verifier='token', draft_cls=None, stop=None, gamma=GAMMA, **kw):
  """Chi-square p of the first M tokens of N rows against the target law, and the stats. `kw`
  go to speculative_decode (slots=, tree=, auto=)."""
  target, draft = models()
  if draft_cls is not None:
    draft = head_as(draft_cls)
  out = loop.speculative_decode(
      target, draft, np.repeat(PROMPT, N, axis=0), gamma=gamma, max_new_tokens=M,
      temperature=sampling.temperature, rng=jax.random.PRNGKey(SEED), eos_id=-1,
      verifier=verifier, stop=stop, **dict(kw))
  assert (np.asarray(out.lengths) == M).all()
  return chi2_pvalue(counts_of(out.tokens), exact_law(sampling)), jax.device_get(out.stats)


@pytest.mark.parametrize('temperature', [1.0, 0.7])
def test_head_output_follows_target_law(temperature):
  p, stats = law_pvalue(Sampling(temperature=temperature))
  hist = np.asarray(stats.accepted_hist).sum(0)
  print(f'T={temperature}: chi-square p = {p:.3g}, accepted hist {hist}, alpha {stats.alpha:.3f}')
  assert hist.min() > 1000, hist  # rejections, partial and full acceptances all frequent
  assert p > 1e-3


def test_head_law_under_a_stop_rule():
  p, stats = law_pvalue(Sampling(temperature=1.0), stop=stopping.Confidence(0.15), gamma=3)
  hist = np.asarray(stats.proposed_hist).sum(0)
  print(f'Confidence(0.15), G_MAX 3: chi-square p = {p:.3g}, proposed hist {hist}')
  assert (hist[1:] > 500).all(), hist  # rows stop early at every length
  assert p > 1e-3


def _always_accept(key, draft_tokens_G, q_GxV, p_G1xV, n=None):
  from specjax.decoding.sampling import sample  # pylint: disable=import-outside-toplevel
  n = jnp.int32(draft_tokens_G.shape[0]) if n is None else n
  return n, sample(key, p_G1xV[n])


def _residual_is_p(key, draft_tokens_G, q_GxV, p_G1xV, n=None):
  from specjax.decoding import acceptance  # pylint: disable=import-outside-toplevel
  from specjax.decoding.sampling import sample  # pylint: disable=import-outside-toplevel
  m, _ = acceptance.verify(key, draft_tokens_G, q_GxV, p_G1xV, n)
  return m, sample(jax.random.fold_in(key, 1), p_G1xV[m])


ALWAYS_ACCEPT = acceptance.FunctionVerifier(_always_accept)
RESIDUAL_IS_P = acceptance.FunctionVerifier(_residual_is_p)


@struct.dataclass
class ReusedNoiseHead(FeatureHeadDraft):
  """Control: a head of its own class (its own programs), run while every draft step samples with
  step 0's noise (`reused_step_noise`: tokens of a block dependent)."""


@contextlib.contextmanager
def reused_step_noise():
  """protocol.step_noise patched to give step 0's noise at every step. jax's tracing caches are
  cleared on entry and exit and the persistent compilation cache is off inside, so no program
  made with the true noise serves the control (full-suite runs once gave the control the correct
  head's p) and no patched program serves a later test."""
  from jax._src import config as jax_config  # pylint: disable=import-outside-toplevel
  saved = protocol.step_noise
  jax.clear_caches()
  protocol.step_noise = lambda noise_BxG, k: noise_BxG[:, 0]
  try:
    with jax_config.enable_compilation_cache(False):
      yield
  finally:
    protocol.step_noise = saved
    jax.clear_caches()


@pytest.mark.parametrize('control', ['always_accept', 'residual_is_p', 'reused_noise'])
def test_negative_controls_are_rejected(control):
  kw = {'always_accept': dict(verifier=ALWAYS_ACCEPT),
        'residual_is_p': dict(verifier=RESIDUAL_IS_P),
        'reused_noise': dict(draft_cls=ReusedNoiseHead)}[control]
  with reused_step_noise() if control == 'reused_noise' else contextlib.nullcontext():
    p, _ = law_pvalue(Sampling(temperature=1.0), **kw)
  print(f'control {control}: chi-square p = {p:.3g}')
  assert p < 1e-6


# ----------------------------------------------------------------------------- greedy


def _greedy_pair():
  """A target with spread-out logits and a head trained for nothing: many rejections."""
  from specjax import testing  # pylint: disable=import-outside-toplevel
  config = testing.tiny_config('v11', vocab_size=48)
  target = testing.tiny_t5(config, seed=3)
  target = target.replace(params=testing.spread_params(target.params, 3))
  return target, _head(target, seed=4, scale=2.0)


def test_greedy_identical_to_autoregressive_and_batch_invariant():
  target, draft = _greedy_pair()
  rng = np.random.RandomState(0)
  ids = rng.randint(2, 48, (4, 9)).astype(np.int32)
  ids[1, 6:] = 0
  ids[3, 3:] = 0
  eos = int(np.asarray(loop.autoregressive_decode(target, ids, max_new_tokens=14).tokens)[0, 4])
  base = loop.autoregressive_decode(target, ids, max_new_tokens=14, eos_id=eos)
  assert (np.asarray(base.lengths) < 14).any()  # some row ends at EOS, some at max length
  for gamma in (1, 3, 5):
    out = loop.speculative_decode(target, draft, ids, gamma=gamma, max_new_tokens=14, eos_id=eos)
    np.testing.assert_array_equal(out.tokens, base.tokens)
    np.testing.assert_array_equal(out.lengths, base.lengths)
  for b in range(4):  # each row alone: the tokens it got in the batch
    alone = loop.speculative_decode(target, draft, ids[b:b + 1], gamma=3, max_new_tokens=14,
                                    eos_id=eos)
    np.testing.assert_array_equal(alone.tokens[0], base.tokens[b])


def test_greedy_identical_through_narrow_blocks():
  """Under a rule that caps whole batches at iteration % 4 drafts the target verifies blocks of
  1, 2, 3 or 5 of the 6 slots, and hands the head their (padded) hidden states."""
  from test_stopping import ShortBlocks  # pylint: disable=import-outside-toplevel
  target, draft = _greedy_pair()
  ids = np.random.RandomState(5).randint(2, 48, (3, 8)).astype(np.int32)
  ids[2, 4:] = 0
  base = loop.autoregressive_decode(target, ids, max_new_tokens=16, eos_id=-1)
  for rule in (ShortBlocks(period=4), ShortBlocks(stopping.Confidence(0.3), 4)):
    out = loop.speculative_decode(target, draft, ids, gamma=5, max_new_tokens=16, eos_id=-1,
                                  stop=rule)
    np.testing.assert_array_equal(out.tokens, base.tokens)
    hist = np.asarray(out.stats.proposed_hist).sum(0)
    assert hist[5] == 0 and hist[1:4].min() > 0, hist


def test_stats_count_the_head_passes():
  """One window pass + (n - 1) one-token passes per proposal: gamma per iteration here."""
  target, draft = _greedy_pair()
  ids = np.random.RandomState(1).randint(2, 48, (2, 6)).astype(np.int32)
  out = loop.speculative_decode(target, draft, ids, gamma=4, max_new_tokens=10, eos_id=-1)
  s = out.stats
  assert int(s.draft_passes) == int(s.iterations) * 4


# ----------------------------------------------------------------------------- plumbing


@pytest.mark.parametrize('narrow', [False, True], ids=['full', 'narrow'])
def test_head_holds_the_target_teacher_forced_features(narrow):
  """prev[j] = f_{j-1} for every j <= L after each iteration, f from teacher forcing (narrow:
  through blocks narrower than gamma + 1, whose padded hidden rows the head must not keep)."""
  from test_stopping import ShortBlocks  # pylint: disable=import-outside-toplevel
  target, draft = _greedy_pair()
  ids = np.random.RandomState(2).randint(2, 48, (3, 8)).astype(np.int32)
  ids[2, 5:] = 0
  gamma, max_new = 3, 12
  sampling = Sampling(temperature=1.0)
  state = loop.speculative_init(target, draft, jnp.asarray(ids), jax.random.PRNGKey(6),
                                gamma=gamma, max_new_tokens=max_new)
  step = jax.jit(functools.partial(loop.speculative_step, gamma=gamma, max_new_tokens=max_new,
                                   sampling=sampling, eos_id=-1,
                                   stop=ShortBlocks(period=3) if narrow else None))
  ms = set()
  while not bool(np.all(np.asarray(state.done))):
    before = np.asarray(state.stats.accepted).copy()
    state = step(target, draft, state)
    ms.update((np.asarray(state.stats.accepted) - before).tolist())
    lengths = np.asarray(state.lengths)
    seq = np.asarray(state.seq)
    hidden = np.asarray(jax.jit(t5.teacher_forced_hidden, static_argnums=1)(
        target.params, target.config, jnp.asarray(ids), jnp.asarray(seq[:, :max_new + 1])))
    prev = np.asarray(state.draft_state.prev_BxNxDf)
    for b in range(3):
      lb = min(lengths[b], max_new - 1)
      np.testing.assert_allclose(prev[b, 1:lb + 1], hidden[b, :lb], rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(prev[b, 0], np.asarray(draft.params['start_feature']))
  assert 0 in ms and max(ms) >= 2, ms  # rejections, and blocks with accepted drafts


def test_no_second_encoder(monkeypatch):
  """Tracing the loop's init and step: the target's encoder once, the head none (a model draft,
  the control, runs its own)."""
  target, head = _greedy_pair()
  calls = []
  real = t5.encode
  monkeypatch.setattr(t5, 'encode', lambda *a, **k: calls.append(1) or real(*a, **k))
  ids = jnp.ones((2, 5), jnp.int32)

  def traced(draft):
    calls.clear()
    def run(ids):
      state = loop.speculative_init(target, draft, ids, jax.random.PRNGKey(0), gamma=2,
                                    max_new_tokens=4)
      return loop.speculative_step(target, draft, state, gamma=2, max_new_tokens=4,
                                   sampling=Sampling(), eos_id=1)
    jax.make_jaxpr(run)(ids)
    return len(calls)

  assert traced(head) == 1
  assert traced(target) == 2  # control: a T5 draft encodes the source itself


def test_head_files_roundtrip_and_errors(tmp_path):
  target, draft = _greedy_pair()
  head_lib.save_head(draft.params, draft.config, tmp_path / 'head')
  again = FeatureHeadDraft.for_target(target, tmp_path / 'head')
  for k, v in draft.params.items():
    np.testing.assert_array_equal(np.asarray(again.params[k]), np.asarray(v))
  other = _target()  # another target shape
  with pytest.raises(ValueError, match='vocab_size'):
    FeatureHeadDraft.for_target(other, tmp_path / 'head')
  with pytest.raises(ValueError, match='not found'):
    FeatureHeadDraft.for_target(target, tmp_path / 'nope')
  (tmp_path / 'head' / head_lib.WEIGHTS_NAME).write_bytes(b'garbage')
  with pytest.raises(ValueError, match='corrupt'):
    FeatureHeadDraft.for_target(target, tmp_path / 'head')
  assert protocol.reads_target(draft) and not protocol.reads_target(loop.as_draft(target))


# ----------------------------------------------------------------------------- packed head

needs_kernel = pytest.mark.skipif(not cpu_kernels.available(), reason=cpu_kernels.status())


def _packed(target_head, vocab=None, weights=None):
  """The pair with the target on the CPU kernels; the head built for it packs its own weights
  (cut to the ids `vocab` first, when given; stored as `weights` says)."""
  target, head = target_head
  target = target.pack()
  return target, FeatureHeadDraft.for_target(target, (head.params, head.config), vocab=vocab,
                                             weights=weights)


@needs_kernel
def test_packed_head_pass_matches_xla():
  target, head = _packed(_greedy_pair())
  assert head.packed is not None and FeatureHeadDraft.for_target(
      target.unpack(), (head.params, head.config)).packed is None
  run = _head_pass(target, head, outputs=slice(None))
  (f_fast, l_fast, c_fast), (f_ref, l_ref, c_ref) = run(head.packed), run(None)
  for fast, ref in ((f_fast, f_ref), (l_fast, l_ref), (c_fast.self_k, c_ref.self_k)):
    assert float(jnp.max(jnp.abs(fast - ref))) < 1e-5 * float(jnp.max(jnp.abs(ref)))
  np.testing.assert_array_equal(np.asarray(l_fast.argmax(-1)), np.asarray(l_ref.argmax(-1)))


@needs_kernel
def test_packed_head_greedy_identical():
  target, head = _packed(_greedy_pair())
  ids = np.random.RandomState(0).randint(2, 48, (3, 9)).astype(np.int32)
  ids[1, 6:] = 0
  base = loop.autoregressive_decode(target, ids, max_new_tokens=14)
  for kw in (dict(gamma=1), dict(gamma=4), dict(tree=(2, 2, 1))):
    out = loop.speculative_decode(target, head, ids, max_new_tokens=14, **kw)
    np.testing.assert_array_equal(out.tokens, base.tokens)


@functools.lru_cache(maxsize=None)
def packed_law_pvalue(verifier='token', rows=125, vocab=None, weights=None):
  """law_pvalue's test with the pair on the CPU kernels: N rows in calls of `rows` (rows x block
  tokens stay under cpu_kernels.MAX_ROWS, so the kernels run, not XLA's fallback)."""
  target, head = _packed(models(), vocab, weights)
  assert rows * (GAMMA + 1) <= cpu_kernels.MAX_ROWS
  key = jax.random.PRNGKey(SEED)
  tokens = [loop.speculative_decode(target, head, np.repeat(PROMPT, rows, axis=0), gamma=GAMMA,
                                    max_new_tokens=M, temperature=1.0, eos_id=-1,
                                    rng=jax.random.fold_in(key, i), verifier=verifier).tokens
            for i in range(N // rows)]
  return chi2_pvalue(counts_of(np.concatenate(tokens)), exact_law(Sampling(temperature=1.0)))


@needs_kernel
def test_packed_head_follows_target_law_and_control_is_rejected():
  p = packed_law_pvalue()
  p_control = packed_law_pvalue(ALWAYS_ACCEPT)
  print(f'packed head: chi-square p = {p:.3g}; always-accept control p = {p_control:.3g}')
  assert p > 1e-3 and p_control < 1e-6


@needs_kernel
def test_packed_truncated_head_is_exact():
  """A truncated head on the kernels (24 of 48 ids; 8 of 12 for the law): greedy identity and
  the law test (the always-accept control of the test above shows its power)."""
  target, head = _packed(_greedy_pair(), vocab=np.arange(0, 48, 2))
  assert head.packed is not None and head.draft_vocab == 24
  ids = np.random.RandomState(0).randint(2, 48, (3, 9)).astype(np.int32)
  base = loop.autoregressive_decode(target, ids, max_new_tokens=14)
  out = loop.speculative_decode(target, head, ids, gamma=3, max_new_tokens=14)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  p = packed_law_pvalue(vocab=(1, 2, 4, 5, 6, 8, 9, 11))
  print(f'packed truncated head: chi-square p = {p:.3g}')
  assert p > 1e-3


def _head_pass(target, head, outputs=1):
  """A jitted head pass over fixed random tokens and features on a fresh state, given the packed
  weights or None (XLA): `head_lib.block`'s outputs[`outputs`] (default: the logits)."""
  ids = jnp.asarray(np.random.RandomState(3).randint(2, 48, (3, 7)), jnp.int32)
  state = jax.jit(lambda i: head.init(i, 16, target_cache=target.init_cache(i, 16)))(ids)
  toks = jnp.asarray(np.random.RandomState(4).randint(2, 48, (3, 4)), jnp.int32)
  feats = jnp.asarray(np.random.RandomState(5).normal(size=(3, 4, head.config.feature_dim)),
                      jnp.float32)
  lengths = jnp.array([0, 3, 9], jnp.int32)
  return jax.jit(lambda h: head_lib.block(head.params, head.config, state.cache,
                                          head.target_embed_VxDf, state.cross_k, state.cross_v,
                                          state.enc_mask, toks, feats, lengths, fast=h)[outputs])


@needs_kernel
def test_packed_head_storage_bf16_where_lossless_and_int8_on_request():
  """A head whose weights are bf16 values (saved in bf16, as the shipped one) streams bf16 with
  bitwise the same q; a float32 head stays float32; 'int8' is one quantized head on both paths
  and stays exact (greedy identity here, the law test below)."""
  target, head = _greedy_pair()
  target = target.pack()
  assert FeatureHeadDraft.for_target(target, (head.params, head.config)).packed['out'].weights \
      == 'float32'
  rounded = jax.tree.map(lambda p: p.astype(jnp.bfloat16).astype(jnp.float32), head.params)
  auto = FeatureHeadDraft.for_target(target, (rounded, head.config))
  f32 = FeatureHeadDraft.for_target(target, (rounded, head.config), weights='float32')
  assert auto.packed['out'].weights == 'bfloat16' and f32.packed['out'].weights == 'float32'
  np.testing.assert_array_equal(np.asarray(_head_pass(target, auto)(auto.packed)),
                                np.asarray(_head_pass(target, f32)(f32.packed)))
  i8 = FeatureHeadDraft.for_target(target, (head.params, head.config), weights='int8')
  assert i8.packed['wi'].weights == 'int8'
  assert float(jnp.max(jnp.abs(i8.params['wi_1'] - head.params['wi_1']))) > 0  # quantized
  run = _head_pass(target, i8)
  fast, ref = run(i8.packed), run(None)  # kernel vs XLA on the quantized params
  assert float(jnp.max(jnp.abs(fast - ref))) < 1e-5 * float(jnp.max(jnp.abs(ref)))
  ids = np.random.RandomState(0).randint(2, 48, (3, 9)).astype(np.int32)
  base = loop.autoregressive_decode(target, ids, max_new_tokens=14)
  out = loop.speculative_decode(target, i8, ids, gamma=3, max_new_tokens=14)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  with pytest.raises(ValueError, match='weights='):
    FeatureHeadDraft.for_target(target, (head.params, head.config), weights='int4')


@needs_kernel
def test_int8_head_follows_target_law():
  """A draft's storage changes q only: the int8 head passes the law test (the always-accept
  control of test_packed_head_follows_target_law_and_control_is_rejected shows its power)."""
  p = packed_law_pvalue(weights='int8')
  print(f'int8 head: chi-square p = {p:.3g}')
  assert p > 1e-3
