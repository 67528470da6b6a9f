"""Tests for the model-free drafts of specjax.decoding.drafts: UnigramDraft, BigramDraft, PromptLookupDraft.

Shapes: R rows (trials), S source, N seq buffer, G gamma, V vocab.

Exactness under sampling is tested through the whole speculative loop: R copies of one prompt
decoded in ONE batched call (eos_id=-1, so every row generates exactly 3 tokens), and the joint law
of the first 3 tokens compared by chi-square with the law enumerated from teacher-forced target
probabilities. A broken draft that reports a q other than the one it sampled from, run through the
same helper, must fail. Greedy decoding with each draft must equal autoregressive greedy token for
token. Compiles are the budget here (each gamma / draft type is a new XLA program), so the greedy
gamma sweep runs the three drafts behind one `OneOf` draft selected by a traced index: one
program per gamma for all three.
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from chi2 import chi2_pvalue  # tests/chi2.py
from specjax.decoding import sampling as sampling_lib
from specjax.decoding.loop import autoregressive_decode, speculative_decode
from specjax.decoding.protocol import Proposal
from specjax.decoding.drafts import (PromptLookupDraft, UnigramDraft, fit_bigram, fit_unigram, load_ngram,
                            save_ngram)
from specjax.models.t5 import T5Config, T5Model, init_params
from specjax.testing import DraftWrapper

# ----------------------------------------------------------------------------- helpers


@struct.dataclass
class MislabeledDraft(DraftWrapper):
  """Negative control: proposes like `inner` but reports q = probs(report_log_probs_V)."""
  report_log_probs_V: jax.Array

  def propose(self, state, seq_BxN, lengths_B, keys_B, gamma, sampling, *, stop, limit_B):
    prop = self.inner.propose(state, seq_BxN, lengths_B, keys_B, gamma, sampling, stop=stop,
                              limit_B=limit_B)
    q_V = sampling_lib.probs(self.report_log_probs_V, sampling)
    return prop.replace(q_BxGxV=jnp.broadcast_to(q_V, prop.q_BxGxV.shape))


@struct.dataclass
class OneOf:
  """Test-only: runs every draft's `propose` and keeps draft number `which` (a traced index).

  Changing `which` (or the drafts' arrays, same shapes) reuses the compiled program, so a gamma
  sweep over several drafts costs one compile per gamma.
  """
  drafts: tuple
  which: jax.Array

  @property
  def vocab_size(self):
    return self.drafts[0].vocab_size

  def init(self, input_ids_BxS, max_len):
    return tuple(d.init(input_ids_BxS, max_len) for d in self.drafts)

  def commit(self, state, seq_BxN, lengths_B):
    return tuple(d.commit(s, seq_BxN, lengths_B) for d, s in zip(self.drafts, state))

  def propose(self, state, seq_BxN, lengths_B, keys_B, gamma, sampling, *, stop, limit_B):
    outs = [d.propose(s, seq_BxN, lengths_B, keys_B, gamma, sampling, stop=stop, limit_B=limit_B)
            for d, s in zip(self.drafts, state)]
    pick = lambda *xs: jnp.stack(xs)[self.which]  # noqa: E731
    return Proposal(pick(*[o.tokens_BxG for o in outs]), pick(*[o.q_BxGxV for o in outs]),
                    pick(*[o.n_B for o in outs]), pick(*[o.passes for o in outs]),
                    tuple(o.state for o in outs))


def _padded(rows, width=16):
  ids = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)] = r
  return ids


# ----------------------------------------------------------------------------- fitting

TOY_V = 8
# Normalised (trailing pad stripped, EOS appended): [5,3,5,4,1], [3,3,1], [2,1]
TOY_CORPUS = [[5, 3, 5, 4], [3, 3, 1], np.array([2, 0, 0])]


def test_fit_unigram_matches_hand_counts():
  counts = np.zeros(TOY_V)
  for tok, c in {5: 2, 3: 3, 4: 1, 1: 3, 2: 1}.items():
    counts[tok] = c
  for k in (0.0, 0.5):
    q = np.exp(np.asarray(fit_unigram(TOY_CORPUS, TOY_V, smoothing=k).log_probs_V, np.float64))
    np.testing.assert_allclose(q, (counts + k) / (10 + k * TOY_V), rtol=1e-6)
    np.testing.assert_allclose(q.sum(), 1.0, rtol=1e-6)
  # A 2-D padded array is the same corpus.
  padded = np.zeros((3, 6), np.int64)
  for i, s in enumerate(TOY_CORPUS):
    padded[i, :len(s)] = s
  np.testing.assert_array_equal(fit_unigram(padded, TOY_V).log_probs_V,
                                fit_unigram(TOY_CORPUS, TOY_V).log_probs_V)
  with pytest.raises(ValueError, match='out of range'):
    fit_unigram([[3, 9]], TOY_V)
  with pytest.raises(ValueError, match='flat list'):
    fit_unigram([3, 4, 1], TOY_V)


def test_fit_bigram_matches_hand_counts():
  beta, k_uni = 1.0, 1.0
  u = (np.array([0, 3, 1, 3, 1, 2, 0, 0]) + k_uni) / (10 + k_uni * TOY_V)
  # Bigram counts of [0]+s: 0->5, 0->3, 0->2, 5->3, 3->5, 5->4, 4->1, 3->3, 3->1, 2->1.
  c = np.zeros((TOY_V, TOY_V))
  for a, x in [(0, 5), (0, 3), (0, 2), (5, 3), (3, 5), (5, 4), (4, 1), (3, 3), (3, 1), (2, 1)]:
    c[a, x] += 1
  n = c.sum(1, keepdims=True)
  all_rows = jnp.arange(TOY_V)

  # top_k >= successors: exactly the Dirichlet-smoothed bigram (c + beta u) / (N + beta).
  full = fit_bigram(TOY_CORPUS, TOY_V, smoothing=beta, top_k=4, unigram_smoothing=k_uni)
  q_full = np.asarray(full.conditional(all_rows), np.float64)
  np.testing.assert_allclose(q_full, (c + beta * u) / (n + beta), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(q_full[6], u, rtol=1e-6)  # unseen row: the unigram

  # top_k = 1: each row keeps its largest count (ties: lower id) and backs off with the rest.
  top1 = fit_bigram(TOY_CORPUS, TOY_V, smoothing=beta, top_k=1, unigram_smoothing=k_uni)
  assert top1.ids_VxK.shape == (TOY_V, 1)
  np.testing.assert_array_equal(np.asarray(top1.ids_VxK)[[0, 3, 5], 0], [2, 1, 3])
  q0 = np.asarray(top1.conditional(jnp.array([0])))[0]
  expected0 = 1 / 4 * np.eye(TOY_V)[2] + (3 - 1 + 1) / 4 * u  # N_0 = 3, kept 1
  np.testing.assert_allclose(q0, expected0, rtol=1e-5)
  for draft in (full, top1):
    np.testing.assert_allclose(np.asarray(draft.conditional(all_rows)).sum(1), 1.0, rtol=1e-6)
    assert np.all(np.asarray(draft.conditional(all_rows)) > 0)  # full support


def test_bigram_large_vocab_memory_is_bounded():
  v, k = 32128, 32
  rng = np.random.default_rng(0)
  corpus = [rng.integers(2, v, size=int(rng.integers(5, 60))) for _ in range(300)]
  corpus.append([7] * 40 + list(range(100, 140)))  # row 7 has > K successors: truncation
  draft = fit_bigram(corpus, v, top_k=k)
  assert draft.ids_VxK.shape == (v, k) and draft.weights_VxK.shape == (v, k)
  assert draft.nbytes == v * (8 * k + 8) == 8_481_792  # vs 4.13e9 for a dense V x V table
  q_BxV = np.asarray(draft.conditional(jnp.array([0, 7, 9])))
  assert q_BxV.shape == (3, v)
  np.testing.assert_allclose(q_BxV.sum(1), 1.0, rtol=1e-5)
  assert np.all(q_BxV > 0)


def test_save_load_roundtrip(tmp_path):
  uni = fit_unigram(TOY_CORPUS, TOY_V)
  big = fit_bigram(TOY_CORPUS, TOY_V, top_k=2)
  for draft, name in [(uni, 'uni.npz'), (big, 'bigram.cache')]:
    path = tmp_path / name
    draft.save(path)
    assert path.exists()  # no '.npz' appended to a name that lacks it
    loaded = load_ngram(path)
    assert type(loaded) is type(draft)
    for a, b in zip(jax.tree.leaves(draft), jax.tree.leaves(loaded)):
      assert a.dtype == b.dtype
      np.testing.assert_array_equal(a, b)
  with pytest.raises(TypeError):
    save_ngram(PromptLookupDraft(TOY_V), tmp_path / 'x.npz')


# ----------------------------------------------------------------------------- prompt lookup rules


@jax.jit
def _lookup_program(draft, source_BxS, seq_BxN, lengths_B):
  return draft.lookup(draft.init(source_BxS, seq_BxN.shape[1]), seq_BxN, lengths_B, 5)


def _lookup(draft, source, generated, gamma):
  """Drafts for 2 rows, source [2, 8] (padded) and generated tokens (same L); one jit shape."""
  source = _padded(source, 8)
  length = len(generated[0])
  seq = np.zeros((2, 12), np.int32)
  for i, g in enumerate(generated):
    seq[i, 1:1 + length] = g
    seq[i, 2 + length:] = 13  # stale tokens past the committed prefix must never be read
  out = _lookup_program(draft, jnp.asarray(source), jnp.asarray(seq), jnp.full((2,), length))
  return np.asarray(out)[:, :gamma]


def test_prompt_lookup_rules():
  pl = PromptLookupDraft(vocab_size=16)
  src = [[4, 5, 6, 7, 8, 1], [9, 2, 3, 9, 2, 4, 1]]
  # L = 0: the query [start] matches the virtual start before the source -> the source's start.
  np.testing.assert_array_equal(_lookup(pl, src, [[], []], 5), [[4, 5, 6, 7, 8], [9, 2, 3, 9, 2]])
  # A source match; its continuation runs on past EOS into [start] + generated text (the haystack
  # is [start] + source without its padding + seq). Row 1: no match -> repeat the last token.
  np.testing.assert_array_equal(_lookup(pl, src, [[5, 6], [5, 6]], 5),
                                [[7, 8, 1, 0, 5], [6, 6, 6, 6, 6]])
  # Longest n wins: [2, 3, 9] (source, n = 3) over the more recent [9] (generated, n = 1).
  np.testing.assert_array_equal(_lookup(pl, src, [[9, 2, 3, 9]] * 2, 5)[1], [2, 4, 1, 0, 9])
  # Same n: the most recent match wins (generated beats source); periodic past the query end.
  np.testing.assert_array_equal(_lookup(pl, src, [[4, 5, 11, 4, 5]] * 2, 5)[0], [11, 4, 5, 11, 4])
  np.testing.assert_array_equal(_lookup(pl, src, [[7, 7, 7]] * 2, 4), [[7, 7, 7, 7]] * 2)
  # Padding is skipped: [3] matches the source's last token, the continuation is [start] + [3]
  # (it would be pad zeros if the haystack kept the padding).
  np.testing.assert_array_equal(_lookup(pl, [[9, 2, 3], [9, 2, 3]], [[3], [3]], 4)[0],
                                [0, 3, 0, 3])
  # ngram_min = 2: a lone 1-gram match is ignored (-> repeat the last token).
  pl2 = PromptLookupDraft(vocab_size=16, ngram_max=3, ngram_min=2)
  np.testing.assert_array_equal(_lookup(pl2, src, [[3, 6]] * 2, 3)[0], [6, 6, 6])
  np.testing.assert_array_equal(_lookup(pl, src, [[3, 6]] * 2, 3)[0], [7, 8, 1])
  with pytest.raises(ValueError):
    PromptLookupDraft(vocab_size=16, ngram_max=1, ngram_min=2)


# ----------------------------------------------------------------------------- exactness (sampling)

V = 8
ROWS = 20_000
NEW = 3
PROMPT = [3, 4, 3, 4, 5, 6, 2, 1]  # repeated bigrams, so prompt lookup finds matches
SAMPLING_UNI = dict(temperature=1.0)
SAMPLING_BI = dict(temperature=0.8, top_k=6)
SAMPLING_PL = dict(temperature=1.0)


def _sampling(kw):
  return sampling_lib.Sampling(**{'temperature': 0.0, 'top_k': 0, 'top_p': 1.0, **kw})


@pytest.fixture(scope='module')
def target():
  config = T5Config(vocab_size=V, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1,
                    num_heads=2, tie_word_embeddings=False, scale_logits=False)
  return T5Model(init_params(config, jax.random.PRNGKey(3), scale=2.0), config)


@pytest.fixture(scope='module')
def target_logits(target):
  """Teacher-forced logits [V*V, 3, V] for decoder inputs [start, a, b], all a, b."""
  ab = np.array([(a, b) for a in range(V) for b in range(V)], np.int32)
  dec = np.concatenate([np.zeros((V * V, 1), np.int32), ab], axis=1)
  return np.asarray(target.logits(np.tile(PROMPT, (V * V, 1)), dec))


def exact_law(target_logits, sampling_kw):
  """P(first 3 tokens = a, b, c) [V, V, V] under the processed target distribution."""
  p = np.asarray(sampling_lib.probs(jnp.asarray(target_logits), _sampling(sampling_kw)),
                 np.float64).reshape(V, V, 3, V)
  return p[0, 0, 0][:, None, None] * p[:, 0, 1][:, :, None] * p[:, :, 2]


def run_first3(target, draft, sampling_kw, gamma, seed):
  """One batched speculative_decode of ROWS copies of PROMPT; counts of the first 3 tokens."""
  out = speculative_decode(target, draft, np.tile(PROMPT, (ROWS, 1)), gamma=gamma,
                           max_new_tokens=NEW, rng=seed, eos_id=-1, **sampling_kw)
  assert np.all(np.asarray(out.lengths) == NEW)  # eos_id = -1: no row stops early
  tokens = np.asarray(out.tokens)
  counts = np.bincount(tokens[:, 0] * V * V + tokens[:, 1] * V + tokens[:, 2], minlength=V ** 3)
  return counts, out


def _peaked_log_probs():
  return jnp.log(jnp.array([0.02, 0.02, 0.02, 0.02, 0.02, 0.86, 0.02, 0.02]))


@pytest.fixture(scope='module')
def unigram_draft():
  rng = np.random.default_rng(1)
  corpus = [rng.choice(V, size=10, p=[.05, .05, .3, .1, .2, .1, .1, .1]) for _ in range(50)]
  return fit_unigram(corpus, V, smoothing=1.0)


def _bigram_draft():
  rng = np.random.default_rng(2)
  corpus = [rng.integers(0, V, size=12) for _ in range(40)]
  return fit_bigram(corpus, V, smoothing=2.0, top_k=3)


@pytest.fixture(scope='module')
def unigram_run(target, unigram_draft):
  return run_first3(target, unigram_draft, SAMPLING_UNI, gamma=3, seed=11)


def _check_alpha_is_acceptance(out):
  """E[accepted] = E[alpha_sum]: each verified draft is accepted w.p. sum_x min(p, q) given its
  prefix, so the difference is a martingale with variance <= alpha_count / 4 (5 sigma)."""
  s = out.stats
  diff = float(np.sum(s.accepted)) - float(np.sum(s.alpha_sum))
  sigma = np.sqrt(float(np.sum(s.alpha_count)) / 4)
  assert abs(diff) < 5 * sigma, (diff, sigma)


def test_unigram_exact_under_sampling(target_logits, unigram_run):
  counts, out = unigram_run
  pvalue = chi2_pvalue(counts, exact_law(target_logits, SAMPLING_UNI))
  print(f'unigram chi2 p = {pvalue:.4g}; {out.stats.summary()}')
  assert pvalue > 1e-3
  assert 0 < out.stats.acceptance_rate < 1  # drafts are both accepted and rejected
  _check_alpha_is_acceptance(out)


@pytest.mark.parametrize('name,make_draft,sampling_kw,gamma,seed', [
    ('bigram', _bigram_draft, SAMPLING_BI, 2, 12),
    ('prompt lookup', lambda: PromptLookupDraft(vocab_size=V), SAMPLING_PL, 3, 13),
])
def test_draft_exact_under_sampling(target, target_logits, name, make_draft, sampling_kw, gamma,
                                    seed):
  """The unigram test's chi-square check, for the bigram and the prompt-lookup draft."""
  counts, out = run_first3(target, make_draft(), sampling_kw, gamma=gamma, seed=seed)
  pvalue = chi2_pvalue(counts, exact_law(target_logits, sampling_kw))
  print(f'{name} chi2 p = {pvalue:.4g}; {out.stats.summary()}')
  assert pvalue > 1e-3
  assert 0 < out.stats.acceptance_rate < 1
  _check_alpha_is_acceptance(out)


def test_negative_control_q_not_the_sampled_distribution(target, target_logits):
  """Samples from a peaked unigram but reports a uniform q: the same helper must reject."""
  broken = MislabeledDraft(inner=UnigramDraft(_peaked_log_probs()), report_log_probs_V=jnp.zeros(V))
  counts, out = run_first3(target, broken, SAMPLING_UNI, gamma=3, seed=11)
  pvalue = chi2_pvalue(counts, exact_law(target_logits, SAMPLING_UNI))
  print(f'negative control chi2 p = {pvalue:.4g}')
  assert pvalue < 1e-6


def test_unigram_alpha_in_loop_stats(target_logits, unigram_draft, unigram_run):
  """The loop's alpha terms are sum_x min(p, q) at the verified prefixes, row by row.

  Every prefix length 0, 1, 2 of a row is verified exactly once (gamma = 3: no bonus position
  below 3), so rows with alpha_count == 3 must have alpha_sum = sum over those three prefixes of
  beta(prefix) = sum_x min(p(x | prefix), q(x)); rows that also verified longer prefixes have more.
  """
  _, out = unigram_run
  sampling = _sampling(SAMPLING_UNI)
  p = np.asarray(sampling_lib.probs(jnp.asarray(target_logits), sampling),
                 np.float64).reshape(V, V, 3, V)
  q = np.asarray(sampling_lib.probs(unigram_draft.log_probs_V, sampling), np.float64)
  beta = lambda p_xV: np.minimum(p_xV, q).sum(-1)
  t = np.asarray(out.tokens)
  expected = beta(p[0, 0, 0]) + beta(p[t[:, 0], 0, 1]) + beta(p[t[:, 0], t[:, 1], 2])
  alpha_sum, count = np.asarray(out.stats.alpha_sum), np.asarray(out.stats.alpha_count)
  three = count == 3
  assert three.sum() > ROWS // 4 and np.all(count >= 3)
  np.testing.assert_allclose(alpha_sum[three], expected[three], rtol=1e-5, atol=1e-6)
  assert np.all(alpha_sum[~three] >= expected[~three] - 1e-5)
  assert np.all(alpha_sum[~three] <= expected[~three] + count[~three] - 3 + 1e-5)


# ----------------------------------------------------------------------------- greedy

GV = 16
GREEDY_NEW = 14


def _greedy_config():
  return T5Config(vocab_size=GV, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1,
                  num_heads=2, tie_word_embeddings=False, scale_logits=False)


@pytest.fixture(scope='module')
def greedy_target():
  """Untied head: random tied T5s decode greedily into a constant; this one does not."""
  return T5Model(init_params(_greedy_config(), jax.random.PRNGKey(20), scale=2.0),
                 _greedy_config())


@pytest.fixture(scope='module')
def copy_target():
  """Decoder cut off from the encoder (cross-attention output = 0): the output does not depend on
  the source, so a source that contains it is copied."""
  params = init_params(_greedy_config(), jax.random.PRNGKey(15), scale=2.0)
  params['decoder']['layers'] = [dict(layer, cross_o=jnp.zeros_like(layer['cross_o']))
                                 for layer in params['decoder']['layers']]
  return T5Model(params, _greedy_config())


GREEDY_PROMPTS = _padded([[3, 4, 5, 6, 2, 9, 1], [7, 2, 1], [5, 5, 3, 8, 11, 12, 13, 1]])


def _sweep(target, drafts, prompts, names):
  """Speculative greedy == autoregressive greedy for every draft and gamma 1..5."""
  ref = autoregressive_decode(target, prompts, max_new_tokens=GREEDY_NEW)
  accepted = {name: 0 for name in names}
  for gamma in range(1, 6):
    for which, name in enumerate(names):
      out = speculative_decode(target, OneOf(tuple(drafts), jnp.int32(which)), prompts,
                               gamma=gamma, max_new_tokens=GREEDY_NEW)
      np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=f'{name} gamma={gamma}')
      np.testing.assert_array_equal(out.lengths, ref.lengths, err_msg=f'{name} gamma={gamma}')
      accepted[name] += int(np.sum(out.stats.accepted))
  return ref, accepted


def _greedy_drafts(corpus):
  return (fit_unigram(corpus, GV), fit_bigram(corpus, GV, top_k=4), PromptLookupDraft(GV))


def test_greedy_equals_autoregressive(greedy_target):
  ref = autoregressive_decode(greedy_target, GREEDY_PROMPTS, max_new_tokens=GREEDY_NEW)
  lengths = np.asarray(ref.lengths)
  assert len(set(lengths.tolist())) > 1, lengths  # ragged: some row stops at EOS
  # n-gram drafts fitted on the target's own outputs, so that they are often right.
  drafts = _greedy_drafts(np.asarray(ref.tokens))
  _, accepted = _sweep(greedy_target, drafts, GREEDY_PROMPTS, ['unigram', 'bigram', 'lookup'])
  print(f'greedy accepted drafts (gamma 1..5): {accepted}')
  assert accepted['bigram'] > 0 and accepted['lookup'] > 0


def test_prompt_lookup_copies_source(copy_target):
  probe = autoregressive_decode(copy_target, GREEDY_PROMPTS, max_new_tokens=GREEDY_NEW)
  y = np.asarray(probe.tokens[0, :int(probe.lengths[0])])
  np.testing.assert_array_equal(probe.tokens[1], probe.tokens[0])  # source-independent
  assert len(set(y.tolist())) > 4, y  # not a constant or short cycle
  # Sources that contain the output: whole, shifted behind junk, and a middle part only.
  sources = _padded([list(y) + [1], [6, 10] + list(y[:10]) + [1], [13] + list(y[3:12]) + [1]])
  ref = autoregressive_decode(copy_target, sources, max_new_tokens=GREEDY_NEW)
  np.testing.assert_array_equal(ref.tokens[0, :len(y)], y)
  # Same shapes as the other sweep: these programs are already compiled.
  drafts = _greedy_drafts(np.asarray(ref.tokens))
  _, accepted = _sweep(copy_target, drafts, sources, ['unigram', 'bigram', 'lookup'])
  print(f'copy case accepted drafts (gamma 1..5): {accepted}')
  # The draft itself (not through OneOf): most tokens come from accepted drafts.
  out = speculative_decode(copy_target, PromptLookupDraft(GV), sources, gamma=4,
                           max_new_tokens=GREEDY_NEW)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  stats = out.stats
  print(f'copy case, PromptLookupDraft gamma=4: {stats.summary()}')
  assert int(np.sum(stats.accepted)) > 0
  assert int(np.sum(stats.accepted)) >= int(np.sum(ref.lengths)) // 2
  assert stats.draft_calls == 0


# ----------------------------------------------------------------------------- the docs' example


def test_example_draft_exact_under_sampling(target, target_logits):
  """docs/extending.md's SourceBigramDraft (rows stop early where the source chain ends): the
  target's law, and the same draft reporting a wrong q is rejected."""
  from specjax.decoding.examples import SourceBigramDraft  # pylint: disable=import-outside-toplevel
  counts, out = run_first3(target, SourceBigramDraft(V), SAMPLING_PL, gamma=3, seed=14)
  pvalue = chi2_pvalue(counts, exact_law(target_logits, SAMPLING_PL))
  print(f'example draft chi2 p = {pvalue:.4g}; {out.stats.summary()}')
  assert pvalue > 1e-3
  hist = np.asarray(out.stats.proposed_hist).sum(0)
  assert hist[0] > 0 and hist[3] > 0 and hist[1:3].sum() > 0, hist  # rows stop early, per row
  assert 0 < out.stats.acceptance_rate < 1
  _check_alpha_is_acceptance(out)
  broken = MislabeledDraft(inner=SourceBigramDraft(V), report_log_probs_V=jnp.zeros(V))
  counts, _ = run_first3(target, broken, SAMPLING_PL, gamma=3, seed=14)
  pvalue = chi2_pvalue(counts, exact_law(target_logits, SAMPLING_PL))
  print(f'example draft negative control chi2 p = {pvalue:.4g}')
  assert pvalue < 1e-6
