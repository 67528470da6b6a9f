"""The draft protocol: the shared rollout, variable proposal lengths n_B in the loop, their stats.

Shapes: B batch, G gamma (block width), V vocab, M max_new_tokens.

The loop verifies only each row's first n_B drafts and draws the corrected / bonus token from the
target at index n. A draft that proposes a uniformly random n in 0..G per row (drawn from its own
key, independently of the drafted tokens: exact by the non-anticipation rule) must give exactly the
target's law (the chi-square machinery of tests/test_exactness.py), and two loops that get n wrong
-- verifying all G slots whatever n, or drawing the bonus token from p[G] instead of p[n] -- must
be rejected by the same test. Greedy output with random n must be token-identical to
autoregressive greedy.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import test_exactness as tx  # tests/test_exactness.py: tiny models, exact law, chi-square helper
from specjax import testing
from specjax.decoding import acceptance, protocol, stopping
from specjax.decoding.drafts import ModelDraft
from specjax.decoding.loop import autoregressive_decode, speculative_decode
from specjax.testing import DraftWrapper
from specjax.decoding.sampling import sample

# ----------------------------------------------------------------------------- rollout


@dataclasses.dataclass(frozen=True)
class StopBeforeAt(stopping.StopRule):
  """Row b stops before drafting slot k_B[b] (a test rule over a fixed table)."""
  k_B: tuple = ()

  def before(self, q_BxV, k):
    return jnp.asarray(self.k_B) == k


@dataclasses.dataclass(frozen=True)
class StopAfterToken(stopping.StopRule):
  """Stops a row after it drafts `token` (that token is still proposed)."""
  token: int = 0

  def after(self, q_BxV, x_B, k):
    return x_B == self.token


RV = 7


def _chain_rollout(start_B, gamma, stop, limit_B):
  """A deterministic chain x_{k+1} = x_k + 1 (mod V): q one-hot, draw argmax."""
  onehot = lambda x_B: jax.nn.one_hot(x_B % RV, RV)  # noqa: E731
  advance = lambda carry, x_B, k: (carry + 1, onehot(x_B + 1))  # noqa: E731
  draw = lambda k, q_BxV: jnp.argmax(q_BxV, -1).astype(jnp.int32)  # noqa: E731
  fn = jax.jit(lambda s, l: protocol.rollout(advance, jnp.int32(0), onehot(s), draw, gamma=gamma,
                                             stop=stop, limit_B=l, passes=1))
  return jax.device_get(fn(jnp.asarray(start_B), jnp.asarray(limit_B, jnp.int32)))


def test_rollout_stops_per_row_and_counts_passes():
  # Catches a rollout that ignores limit/before/after, runs past the last live row, or reports
  # passes it did not make.
  start = [0, 1, 2, 3]
  prop = _chain_rollout(start, 5, stopping.Fixed(), [5, 2, 0, 3])
  np.testing.assert_array_equal(prop.n_B, [5, 2, 0, 3])
  np.testing.assert_array_equal(prop.tokens_BxG, [[0, 1, 2, 3, 4], [1, 2, 0, 0, 0],
                                                  [0, 0, 0, 0, 0], [3, 4, 5, 0, 0]])
  assert prop.passes == 5 and prop.state == 4  # 1 first pass + 4 advances
  # The longest row is 2: the loop exits after 1 advance.
  prop = _chain_rollout(start, 5, stopping.Fixed(), [1, 2, 0, 1])
  assert prop.passes == 2 and prop.state == 1
  np.testing.assert_array_equal(prop.n_B, [1, 2, 0, 1])
  # before(k): stop before slot k (n = k); after(x): stop after drafting token 4 (kept).
  prop = _chain_rollout(start, 5, StopBeforeAt(k_B=(3, 0, 5, 1)), [5] * 4)
  np.testing.assert_array_equal(prop.n_B, [3, 0, 5, 1])
  prop = _chain_rollout(start, 5, StopAfterToken(token=4), [5, 5, 2, 5])
  np.testing.assert_array_equal(prop.n_B, [5, 4, 2, 2])
  np.testing.assert_array_equal(prop.tokens_BxG[1], [1, 2, 3, 4, 0])
  # cut() agrees with the rollout for a block drafted at once.
  full = _chain_rollout(start, 5, stopping.Fixed(), [5] * 4)
  q = jax.nn.one_hot(jnp.asarray(full.tokens_BxG), RV)
  np.testing.assert_array_equal(
      protocol.cut(StopAfterToken(token=4), jnp.asarray(full.tokens_BxG), q,
                   jnp.array([5, 5, 2, 5])), prop.n_B)


# ----------------------------------------------------------------------------- random n, law


@struct.dataclass
class RandomLengthDraft(ModelDraft):
  """Proposes n ~ uniform{0..G} per row, drawn from its own stream of the row key (independent of
  the drafted tokens), through the per-row cap limit_B."""

  def propose(self, cache, seq_BxN, lengths_B, keys_B, gamma, sampling, *, stop, limit_B):
    n_B = jax.vmap(lambda k: jax.random.randint(jax.random.fold_in(k, 99), (), 0,
                                                gamma + 1))(keys_B)
    return super().propose(cache, seq_BxN, lengths_B, keys_B, gamma, sampling, stop=stop,
                           limit_B=jnp.minimum(limit_B, n_B))


def verify_ignores_n(key, draft_tokens_G, q_GxV, p_G1xV, n=None):
  """Broken: verifies all G slots whatever n (padding slots can be accepted)."""
  return acceptance.verify(key, draft_tokens_G, q_GxV, p_G1xV)


def verify_bonus_from_last_row(key, draft_tokens_G, q_GxV, p_G1xV, n=None):
  """Broken: when all n proposed drafts pass, the bonus comes from p[G] instead of p[n]."""
  g = draft_tokens_G.shape[0]
  m, nxt = acceptance.verify(key, draft_tokens_G, q_GxV, p_G1xV, n)
  return m, jnp.where(m == n, sample(jax.random.fold_in(key, 3), p_G1xV[g]), nxt)


def test_random_length_proposals_follow_target_law():
  # Catches a loop that verifies padding slots, takes the bonus from the wrong row, or lets n
  # shift the law; the stats must count what was proposed.
  p, stats = tx.law_pvalue('random_n', tx.SETTINGS['temp1'], draft_cls=RandomLengthDraft)
  assert p > 1e-3, p
  prop_hist = np.asarray(stats.proposed_hist)
  acc_hist = np.asarray(stats.accepted_hist).sum(0)
  assert (prop_hist.sum(0) > 3000).all(), prop_hist.sum(0)  # every n in 0..G is frequent
  assert acc_hist[tx.GAMMA] > 1000 and acc_hist[1] > 1000, acc_hist
  k = np.arange(tx.GAMMA + 1)
  np.testing.assert_array_equal((prop_hist * k).sum(1), stats.proposed)
  np.testing.assert_array_equal(prop_hist.sum(1), stats.target_calls)
  assert (np.asarray(stats.accepted) <= np.asarray(stats.proposed)).all()
  # Passes: one first pass per iteration plus one per further slot of the longest row.
  assert int(stats.iterations) <= int(stats.draft_passes) <= tx.GAMMA * int(stats.iterations)
  assert stats.draft_calls == stats.draft_passes


@pytest.mark.parametrize('broken', [verify_ignores_n, verify_bonus_from_last_row])
def test_random_length_negative_controls(broken):
  # Power check: the same chi-square must reject a loop that gets n wrong.
  p, _ = tx.law_pvalue(f'control:{broken.__name__}', tx.SETTINGS['temp1'], broken,
                       RandomLengthDraft)
  assert p < 1e-6, (broken.__name__, p)


# ----------------------------------------------------------------------------- greedy, passes

GM, GB = 16, 6


@pytest.fixture(scope='module')
def greedy_pair():
  config = testing.tiny_config('original')
  target = testing.tiny_t5(config, seed=1, scale=4.0)
  target = target.replace(params=testing.spread_params(target.params, 1, emb=0.5, final_norm=8.0))
  rng = np.random.default_rng(0)
  ids = rng.integers(2, config.vocab_size, (GB, 7)).astype(np.int32)
  ids[1:, 5:] = 0
  return target, testing.add_noise(target, 0.1, seed=7), ids


def test_greedy_identity_with_random_lengths(greedy_pair):
  # Catches an off-by-one at index n in the greedy verifier (wrong token after a short proposal)
  # or a draft cache that breaks when a row proposes fewer than gamma tokens.
  target, draft, ids = greedy_pair
  ref = autoregressive_decode(target, ids, max_new_tokens=GM)
  out = speculative_decode(target, RandomLengthDraft(draft), ids, gamma=4, max_new_tokens=GM)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  s = out.stats
  assert (np.asarray(s.proposed_hist).sum(0) > 0).all(), s.proposed_hist  # every n happened
  assert np.asarray(s.accepted_hist).sum(0)[1:].sum() > 0  # and drafts were accepted
  assert int(s.draft_passes) < 4 * int(s.iterations)  # short proposals cost fewer passes


def test_fixed_gamma_passes_and_proposed(greedy_pair):
  # The paper's rule: every active row proposes gamma drafts, with gamma passes per iteration.
  target, draft, ids = greedy_pair
  s = speculative_decode(target, draft, ids, gamma=4, max_new_tokens=GM).stats
  assert int(s.draft_passes) == 4 * int(s.iterations)
  np.testing.assert_array_equal(s.proposed, 4 * np.asarray(s.target_calls))
  np.testing.assert_array_equal(np.asarray(s.proposed_hist)[:, :4], 0)
  assert s.summary()['proposed_per_target_call'] == 4.0


def test_extending_doc_shows_the_tested_example():
  # docs/extending.md's example must be the code tests/test_drafts.py law-tests, verbatim.
  from pathlib import Path  # pylint: disable=import-outside-toplevel
  root = Path(__file__).resolve().parents[1]
  source = (root / 'specjax' / 'decoding' / 'examples.py').read_text()
  code = source[source.index('@struct.dataclass'):]
  assert code in (root / 'docs' / 'extending.md').read_text()
  assert len(code.strip().splitlines()) <= 40


# ----------------------------------------------------------------------------- bad draft ids


@struct.dataclass
class OffVocabDraft(DraftWrapper):
  """Broken on purpose: its first proposed token is `bad` (outside [0, V))."""
  bad: int = struct.field(pytree_node=False)

  def propose(self, state, seq_BxN, lengths_B, keys_B, gamma, sampling, *, stop, limit_B):
    prop = self.inner.propose(state, seq_BxN, lengths_B, keys_B, gamma, sampling, stop=stop,
                              limit_B=limit_B)
    return prop.replace(tokens_BxG=prop.tokens_BxG.at[:, 0].set(self.bad))


@pytest.mark.parametrize('bad,temperature', [(-1, 1.0), (-1, 0.0), (8, 1.0)])
def test_out_of_range_draft_id_raises(bad, temperature):
  # acceptance.verify's precondition, enforced by the loop: a clear error, never emitted tokens.
  p_V = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05])
  target, draft = testing.stub_pair(p_V, p_V[::-1])
  ids = np.full((4, 2), 3, np.int32)
  with pytest.raises(ValueError, match=r'token id outside \[0, 8\)'):
    speculative_decode(target, OffVocabDraft(draft, bad), ids, gamma=2, max_new_tokens=4,
                       temperature=temperature, eos_id=-1)
  out = speculative_decode(target, draft, ids, gamma=2, max_new_tokens=4, temperature=temperature,
                           eos_id=-1)  # the same draft without the fault
  assert not bool(out.stats.bad_draft) and (np.asarray(out.lengths) == 4).all()


# ----------------------------------------------------------------------------- verifier choice


def verify_accept_all(key, draft_tokens_G, q_GxV, p_G1xV, n=None):
  """Broken on purpose: accepts every proposed draft."""
  n = jnp.int32(draft_tokens_G.shape[0]) if n is None else n
  return n, jnp.argmax(p_G1xV[n]).astype(jnp.int32)


def test_custom_verifier_is_used_in_greedy_mode():
  # The greedy fast path replaces the registered verifiers only: a research rule must run.
  p_V = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05])
  target, draft = testing.stub_pair(p_V, p_V[::-1])  # greedy: target says 0, the draft 7
  ids = np.full((2, 2), 3, np.int32)
  kw = dict(gamma=3, max_new_tokens=8, eos_id=-1)
  plain = speculative_decode(target, draft, ids, **kw)
  assert (plain.tokens == 0).all() and int(np.sum(plain.stats.accepted)) == 0
  custom = speculative_decode(target, draft, ids,
                              verifier=acceptance.FunctionVerifier(verify_accept_all), **kw)
  assert (custom.tokens == 7).any() and int(np.sum(custom.stats.accepted)) > 0
  with pytest.raises(ValueError, match='verifier'):
    speculative_decode(target, draft, ids, verifier='nope', **kw)


def test_stop_rule_reaches_the_draft_and_the_trace():
  # stop= in speculative_decode: row b proposes b drafts every iteration (StopBeforeAt), the
  # trace records n and pads the drafts past it, the histograms count it.
  p_V = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05])
  target, draft = testing.stub_pair(p_V, p_V[::-1])
  out = speculative_decode(target, draft, np.full((4, 2), 3, np.int32), gamma=3, max_new_tokens=6,
                           temperature=1.0, eos_id=-1, trace=True,
                           stop=StopBeforeAt(k_B=(0, 1, 2, 3)))
  proposed, drafts = np.asarray(out.trace_proposed), np.asarray(out.trace_drafts)
  for b in range(4):
    live = proposed[b] >= 0
    assert live[0] and (proposed[b][live] == b).all() and (proposed[b][~live] == -1).all()
    assert (drafts[b][:, b:] == 0).all()
    assert np.asarray(out.stats.proposed_hist)[b, b] == np.asarray(out.stats.target_calls)[b]
  assert (np.asarray(out.trace_accepted) <= np.maximum(proposed, -1)).all()


# ----------------------------------------------------------------------------- public step API


def test_step_api_matches_the_programs(greedy_pair):
  # speculative_step / autoregressive_step driven from Python give the compiled loops' output.
  from specjax import decoding  # pylint: disable=import-outside-toplevel
  target, draft, ids = greedy_pair
  samp, key = decoding.make_sampling(1.0), jax.random.PRNGKey(5)
  spec_step = jax.jit(functools.partial(decoding.speculative_step, gamma=3, max_new_tokens=GM,
                                        sampling=samp, eos_id=1))
  state = decoding.speculative_init(target, draft, jnp.asarray(ids), key, gamma=3,
                                    max_new_tokens=GM)
  while not bool(state.done.all()):
    state = spec_step(target, draft, state)
  ref = speculative_decode(target, draft, ids, gamma=3, max_new_tokens=GM, temperature=1.0,
                           rng=key, eos_id=1)
  np.testing.assert_array_equal(state.lengths, ref.lengths)
  np.testing.assert_array_equal(_generated(state.seq, state.lengths),
                                _generated(ref.tokens, ref.lengths, 0))
  np.testing.assert_array_equal(state.stats.accepted_hist, ref.stats.accepted_hist)
  ar_step = jax.jit(functools.partial(decoding.autoregressive_step, max_new_tokens=GM,
                                      sampling=samp, eos_id=1))
  ar = decoding.autoregressive_init(target, jnp.asarray(ids), key, max_new_tokens=GM)
  while not bool(ar.done.all()):
    ar = ar_step(target, ar)
  ref = autoregressive_decode(target, ids, max_new_tokens=GM, temperature=1.0, rng=key, eos_id=1)
  np.testing.assert_array_equal(ar.lengths, ref.lengths)
  np.testing.assert_array_equal(_generated(ar.seq, ar.lengths),
                                _generated(ref.tokens, ref.lengths, 0))


def _generated(tokens, lengths, first=1):
  """The generated tokens [B, GM] (from seq when first = 1), 0 past each row's length."""
  tokens = np.asarray(tokens)[:, first:first + GM]
  return np.where(np.arange(GM)[None] < np.asarray(lengths)[:, None], tokens, 0)
