"""The feature head with a truncated draft vocabulary (FeatureHeadDraft.for_target(..., vocab=)).

Shapes: N rows, V = 12 vocab, V_d kept ids, M = 3 generated tokens.

Exactness: tests/test_feature_head.py's enumerable setup (a tiny V = 12 target, a random head,
chi-square of the first three tokens of N = 20,000 rows against the target's enumerated law) with
the head cut to V_d = 8 of the 12 ids, so q = 0 on ids that carry a good share of the target's
mass: at T = 1 and 0.7 (chain), with block verification, a token tree, slot refill. Negative controls the
same test must reject (p < 1e-6): a residual that leaves out the ids where q = 0 (the dropped
ids could then only come from the bonus row) and q reported without renormalisation over the kept
ids. Greedy: token-identical to autoregressive decoding (chain, block, tree, slots). Files and
options: vocab.json round trip, one-line errors naming the file or the option, the runner's
'DIR:vocab=N' draft names.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import test_feature_head as fh  # the tiny target, the random head, the exact law
from chi2 import chi2_pvalue  # tests/chi2.py
from specjax.decoding import acceptance, loop
from specjax.decoding.feature_head import FeatureHeadDraft
from specjax.decoding.sampling import Sampling, sample
from specjax.errors import ConfigError
from specjax.models import head as head_lib

V, N, M = fh.V, fh.N, fh.M
KEEP = np.array([1, 2, 4, 5, 7, 8, 10, 11], np.int32)  # V_d = 8 of 12
T1, T07 = Sampling(temperature=1.0), Sampling(temperature=0.7)


@functools.lru_cache(maxsize=None)
def truncated_head(cls=FeatureHeadDraft):
  target, head = fh.models()
  draft = FeatureHeadDraft.for_target(target, (head.params, head.config), vocab=KEEP)
  return cls(**{f: getattr(draft, f) for f in ('params', 'target_embed_VxDf', 'config',
                                                'candidates', 'slot_V')})


@functools.lru_cache(maxsize=None)
def law_pvalue(sampling, verifier='token', cls=FeatureHeadDraft, gamma=fh.GAMMA, **kw):
  """Chi-square p of the first M tokens of N rows (the truncated head) against the target law."""
  target = fh.models()[0]
  out = loop.speculative_decode(
      target, truncated_head(cls), np.repeat(fh.PROMPT, N, axis=0), gamma=gamma,
      max_new_tokens=M, temperature=sampling.temperature, rng=jax.random.PRNGKey(fh.SEED),
      eos_id=-1, verifier=verifier, **kw)
  assert (np.asarray(out.lengths) == M).all()
  tokens = np.asarray(out.tokens)
  return chi2_pvalue(fh.counts_of(tokens), fh.exact_law(sampling)), jax.device_get(out.stats), tokens


def test_truncated_head_puts_no_mass_outside_the_kept_ids():
  target, head = fh.models()
  draft = truncated_head()
  assert draft.draft_vocab == len(KEEP) and draft.vocab_size == V
  assert draft.params['lm_head'].shape == (head.config.d_model, len(KEEP))
  logits = draft.full_vocab(jnp.asarray(np.random.RandomState(0).randn(2, 3, len(KEEP)),
                                        jnp.float32))
  dropped = np.setdiff1d(np.arange(V), KEEP)
  assert np.isneginf(np.asarray(logits)[..., dropped]).all()
  from specjax.decoding.sampling import probs  # pylint: disable=import-outside-toplevel
  q = np.asarray(probs(logits, T07))
  assert (q[..., dropped] == 0).all() and np.allclose(q.sum(-1), 1.0) and not np.isnan(q).any()
  # The kept columns are the untruncated head's own: the same logits there, renormalised.
  full = np.asarray(head.params['lm_head'])
  np.testing.assert_array_equal(np.asarray(draft.params['lm_head']), full[:, KEEP])
  del target


@pytest.mark.parametrize('sampling', [T1, T07], ids=['T1', 'T0.7'])
def test_truncated_head_follows_target_law(sampling):
  p, stats, tokens = law_pvalue(sampling)
  law = fh.exact_law(sampling)
  dropped = np.setdiff1d(np.arange(V), KEEP)
  assert law.sum(axis=(1, 2))[dropped].sum() > 0.1  # the dropped ids matter for the first token
  hist = np.asarray(stats.accepted_hist).sum(0)
  print(f'T={sampling.temperature}: p = {p:.3g}, accepted hist {hist}, alpha {stats.alpha:.3f}')
  assert hist.min() > 1000, hist
  assert np.isin(tokens[:, 0], dropped).mean() > 0.1  # they come back through the residual
  assert p > 1e-3, p


def test_truncated_head_with_block_verification_follows_target_law():
  p, stats, _ = law_pvalue(T1, verifier='block')
  print(f'block: p = {p:.3g}, accepted {np.asarray(stats.accepted_hist).sum(0)}')
  assert p > 1e-3, p


def test_truncated_head_tree_follows_target_law():
  p, stats, _ = law_pvalue(T07, gamma=None, tree=(4, 1, 1))
  print(f'tree (4,1,1): p = {p:.3g}, accepted {np.asarray(stats.accepted_hist).sum(0)}')
  assert p > 1e-3, p


def test_truncated_head_with_slots_follows_target_law():
  p, _, _ = law_pvalue(T1, slots=512)
  print(f'slots=512: p = {p:.3g}')
  assert p > 1e-3, p


def _residual_without_zero_q(key, draft_tokens_G, q_GxV, p_G1xV, n=None):
  """Broken: the rejection resamples from max(0, p - q) only where q > 0."""
  g = draft_tokens_G.shape[0]
  n = jnp.int32(g) if n is None else n
  key_u, key_next = jax.random.split(key)
  m = acceptance.accept_prefix(draft_tokens_G, q_GxV, p_G1xV,
                               jax.random.uniform(key_u, (g,), jnp.float32), n)
  q_V = jnp.concatenate([q_GxV, jnp.zeros_like(q_GxV[:1])], axis=0)[m]
  diff_V = jnp.where(q_V > 0, jnp.maximum(p_G1xV[m] - q_V, 0.0), 0.0)
  return m, sample(key_next, jnp.where((m < n) & (diff_V.sum() > 0), diff_V, p_G1xV[m]))


RESIDUAL_WITHOUT_ZERO_Q = acceptance.FunctionVerifier(_residual_without_zero_q)


@struct.dataclass
class UnnormalisedQHead(FeatureHeadDraft):
  """Broken: tokens drawn from q over the kept ids, but q reported as the kept ids' share of a
  softmax that still counted the dropped ids (q * 0.7 here: it sums to 0.7, not 1)."""

  def propose(self, *args, **kw):
    prop = super().propose(*args, **kw)
    return prop.replace(q_BxGxV=prop.q_BxGxV * 0.7)


@pytest.mark.parametrize('control', ['residual_without_zero_q', 'q_not_renormalised'])
def test_truncated_head_controls_are_rejected(control):
  kw = {'residual_without_zero_q': dict(verifier=RESIDUAL_WITHOUT_ZERO_Q),
        'q_not_renormalised': dict(cls=UnnormalisedQHead)}[control]
  p, _, _ = law_pvalue(T1, **kw)
  print(f'control {control}: p = {p:.3g}')
  assert p < 1e-6, p


# ----------------------------------------------------------------------------- greedy


@functools.lru_cache(maxsize=None)
def greedy_case():
  """32 ragged prompts to the V = 12 pair (as tests/test_head_modes.py's), an EOS that ends some
  rows early, the head cut to KEEP: some of the target's greedy tokens are never drafted."""
  target = fh.models()[0]
  rng = np.random.RandomState(7)
  ids = rng.randint(2, V, (32, 9)).astype(np.int32)
  for b in range(32):
    ids[b, 3 + b % 6:] = 0
  base = loop.autoregressive_decode(target, ids, max_new_tokens=14, eos_id=6)
  return target, truncated_head(), ids, base


@pytest.mark.parametrize('mode', ['gamma1', 'gamma3', 'gamma5', 'block', 'tree', 'slots'])
def test_truncated_head_greedy_is_token_identical(mode):
  target, draft, ids, base = greedy_case()
  kw = {'gamma1': dict(gamma=1), 'gamma3': dict(gamma=3), 'gamma5': dict(gamma=5),
        'block': dict(gamma=3, verifier='block'), 'tree': dict(tree=(3, 2, 1)),
        'slots': dict(gamma=3, slots=8)}[mode]
  out = loop.speculative_decode(target, draft, ids, max_new_tokens=14, eos_id=6, **kw)
  np.testing.assert_array_equal(out.tokens, base.tokens, err_msg=mode)
  np.testing.assert_array_equal(out.lengths, base.lengths, err_msg=mode)
  assert not np.isin(np.asarray(base.tokens), KEEP).all()  # some greedy tokens never drafted
  hist = np.asarray(out.stats.accepted_hist).sum(0)
  assert hist[0] > 0 and hist[1:].sum() > 0, (mode, hist)


# ----------------------------------------------------------------------------- files, options


def test_token_order_counts_and_breaks_ties_by_id():
  order, counts = head_lib.token_order([[3, 3, 1, 5], [5, 1, 7, 9]], 8)
  np.testing.assert_array_equal(order, [1, 3, 5, 7, 0, 2, 4, 6])  # 9 is outside V: ignored
  np.testing.assert_array_equal(counts, [2, 2, 2, 1, 0, 0, 0, 0])


def test_vocab_file_roundtrip_and_errors(tmp_path):
  target, head = fh._greedy_pair()  # pylint: disable=protected-access
  d = tmp_path / 'head'
  head_lib.save_head(head.params, head.config, d)
  with pytest.raises(ValueError, match='vocab.json.*not found'):
    FeatureHeadDraft.for_target(target, d, vocab=10)
  assert FeatureHeadDraft.for_target(target, d).slot_V is None  # no vocab.json: loads as before
  order, counts = head_lib.token_order([np.arange(48)[::-1], np.arange(20)], 48)
  head_lib.save_vocab(d, order, counts, 'test')
  draft = FeatureHeadDraft.for_target(target, d, vocab=10)
  np.testing.assert_array_equal(np.flatnonzero(np.asarray(draft.slot_V) < 10), np.arange(10))
  assert FeatureHeadDraft.for_target(target, d, vocab=48).slot_V is None  # all ids: untruncated
  for bad in (0, 49, -3):
    with pytest.raises(ValueError, match=f'vocab={bad}'):
      FeatureHeadDraft.for_target(target, d, vocab=bad)
  with pytest.raises(ValueError, match='needs a head directory'):
    FeatureHeadDraft.for_target(target, (head.params, head.config), vocab=10)
  with pytest.raises(ValueError, match='distinct ids'):
    FeatureHeadDraft.for_target(target, (head.params, head.config), vocab=[1, 1, 2])
  (d / head_lib.VOCAB_NAME).write_text('{"order": [1, 2')
  with pytest.raises(ValueError, match='vocab.json is not a token ranking'):
    FeatureHeadDraft.for_target(target, d, vocab=10)
  (d / head_lib.VOCAB_NAME).write_text('{"order": [1, 2, 99]}')
  with pytest.raises(ValueError, match='field "order"'):
    FeatureHeadDraft.for_target(target, d, vocab=2)


def test_runner_head_spec(tmp_path):
  from specjax.runner import config as config_lib  # pylint: disable=import-outside-toplevel
  from specjax.runner import drafts  # pylint: disable=import-outside-toplevel
  from specjax.runner import report, results  # pylint: disable=import-outside-toplevel
  target, head = fh._greedy_pair()  # pylint: disable=protected-access
  d = str(tmp_path / 'head')
  head_lib.save_head(head.params, head.config, d)
  assert drafts.head_spec(d) == (d, {})
  assert drafts.head_spec(d + ':vocab=10') == (d, {'vocab': 10})
  assert drafts.is_head_dir(d + ':vocab=10') and not drafts.is_head_dir(str(tmp_path) + ':x=1')
  for bad, match in ((':vocab=ten', 'vocab=.ten.*positive integer'), (':vocab=0', 'positive'),
                     (':vocb=3', "unknown feature-head option 'vocb'.*vocab")):
    with pytest.raises(ValueError, match=match):
      drafts.head_spec(d + bad)
    with pytest.raises(ConfigError, match=r'config.drafts\[1\]: .*' + match):
      config_lib.check_head('drafts[1]', d + bad)
  with pytest.raises(ConfigError, match=r'config.drafts\[0\]: .*vocab.json.*not found'):
    config_lib.check_head('drafts[0]', d + ':vocab=10')
  head_lib.save_vocab(d, *head_lib.token_order([np.arange(48)], 48), 'test')
  config_lib.check_head('drafts[0]', d + ':vocab=10')
  with pytest.raises(ConfigError, match=r'vocab=60 must be an integer in \[1, 48\]'):
    config_lib.check_head('drafts[0]', d + ':vocab=60')
  ident = results.draft_settings(None, d + ':vocab=10', {})
  assert ident['options'] == {'vocab': 10} and ident['path'] == results.path_identity(d)['path']
  assert report.describe(d + ':vocab=10').endswith(', 10/48 ids')
  built = drafts.build(None, d + ':vocab=10', target, None, 'task')
  assert isinstance(built, FeatureHeadDraft) and built.draft_vocab == 10
  assert drafts.build(None, d, target, None, 'task').slot_V is None


def test_runner_head_spec_weights(tmp_path):
  """'DIR:weights=int8' stores the head's matrices as asked (the same head as
  for_target(weights='int8')); a bad format is a one-line error naming the option."""
  from specjax.models import cpu_kernels  # pylint: disable=import-outside-toplevel
  from specjax.runner import config as config_lib  # pylint: disable=import-outside-toplevel
  from specjax.runner import drafts, report  # pylint: disable=import-outside-toplevel
  assert drafts.HEAD_WEIGHTS == cpu_kernels.WEIGHTS
  target, head = fh._greedy_pair()  # pylint: disable=protected-access
  d = str(tmp_path / 'head')
  head_lib.save_head(head.params, head.config, d)
  head_lib.save_vocab(d, *head_lib.token_order([np.arange(48)], 48), 'test')
  assert drafts.head_spec(d + ':vocab=10,weights=int8') == (d, {'vocab': 10, 'weights': 'int8'})
  config_lib.check_head('drafts[1]', d + ':vocab=10,weights=int8')
  for bad in (':weights=int4', ':weights=', ':weights=8'):
    with pytest.raises(ValueError, match=r'weights=.* one of float32, bfloat16, int8'):
      drafts.head_spec(d + bad)
    with pytest.raises(ConfigError, match=r'config.drafts\[1\]: feature-head option weights='):
      config_lib.check_head('drafts[1]', d + bad)
  assert report.describe(d + ':vocab=10,weights=int8').endswith(' int8, 10/48 ids')
  built = drafts.build(None, d + ':weights=int8', target, None, 'task')
  want = FeatureHeadDraft.for_target(target, d, weights='int8')
  for a, b in zip(jax.tree.leaves(built.params), jax.tree.leaves(want.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  plain = drafts.build(None, d, target, None, 'task')
  assert any(not np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(built.params), jax.tree.leaves(plain.params)))
