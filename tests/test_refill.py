"""Slot refill (speculative_decode / autoregressive_decode with slots=B) and gamma='auto'.

Shapes: Q requests, B slots, V vocab, M new tokens.

Greedy: every slots value gives the tokens of the lockstep loop, which equal autoregressive decoding
(ragged prompts, rows ending at EOS and at max_new_tokens, Q not a multiple of B). Sampled: a
request's tokens depend on (rng, request) only, whatever `slots`; the first three tokens of 16,000
refilled requests (two prompts, alternating) follow the exact target law per prompt (chi-square,
with gamma='auto' switching between plain steps and speculation), and a refill that forgets to load
the new request's encoder keys/values is rejected by the same test.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chi2 import chi2_pvalue  # tests/chi2.py
from specjax import testing
from specjax.decoding import loop, refill
from specjax.decoding import queue as queue_lib
from specjax.decoding.sampling import Sampling, probs
from specjax.models.t5 import T5Config, T5Model, init_params

Q, M, GAMMA = 7, 10, 3
EOS = 23  # a token the tiny target emits often: four rows end early, three at M


@functools.lru_cache(maxsize=None)
def pair():
  return testing.spread_pair()  # as tests/test_decoding.py: no instant loops


def prompts():
  ids = np.random.RandomState(0).randint(2, 64, (Q, 6)).astype(np.int32)
  ids[1, 3:] = 0
  ids[4, 2:] = 0
  ids[6, 1:] = 0
  return ids


@functools.lru_cache(maxsize=None)
def lockstep_greedy():
  target, _ = pair()
  return loop.autoregressive_decode(target, prompts(), max_new_tokens=M, eos_id=EOS)


def test_greedy_refill_equals_lockstep_and_autoregressive():
  target, draft = pair()
  ref = lockstep_greedy()
  lengths = np.asarray(ref.lengths)
  assert (lengths < M).sum() >= 2 and (lengths == M).sum() >= 2, lengths  # EOS and max-length rows
  spec = loop.speculative_decode(target, draft, prompts(), gamma=GAMMA, max_new_tokens=M,
                                 eos_id=EOS)
  np.testing.assert_array_equal(spec.tokens, ref.tokens)
  for slots in (1, 3, Q):  # 3: Q = 7 is not a multiple of B
    out = loop.speculative_decode(target, draft, prompts(), gamma=GAMMA, max_new_tokens=M,
                                  eos_id=EOS, slots=slots)
    np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=f'slots={slots}')
    np.testing.assert_array_equal(out.lengths, ref.lengths, err_msg=f'slots={slots}')
    s = out.stats
    # Per-request statistics: each request emitted at least its own tokens.
    assert s.target_calls.shape == (Q,) and (np.asarray(s.emitted) >= lengths).all()
    assert int(s.slots) == slots and 0 < s.row_utilisation <= 1
  for slots in (1, 3):
    out = loop.autoregressive_decode(target, prompts(), max_new_tokens=M, eos_id=EOS, slots=slots)
    np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=f'AR slots={slots}')
    # One token per row-iteration: busy row-iterations are exactly the tokens produced.
    assert int(np.sum(out.stats.target_calls)) == int(lengths.sum())


def test_refill_keeps_rows_busy():
  # With one slot nothing is ever wasted; the lockstep loop pays for finished rows.
  target, _ = pair()
  one = loop.autoregressive_decode(target, prompts(), max_new_tokens=M, eos_id=EOS, slots=1)
  assert one.stats.row_utilisation == 1.0
  assert int(one.stats.iterations) == int(np.sum(lockstep_greedy().lengths))


def test_no_recompilation_same_shapes():
  target, draft = pair()
  kw = dict(gamma=GAMMA, max_new_tokens=M, eos_id=EOS, slots=3)
  loop.speculative_decode(target, draft, prompts(), **kw)
  before = loop.TRACE_COUNTS['refill']
  loop.speculative_decode(target, draft, prompts()[::-1].copy(), rng=3, **kw)
  assert loop.TRACE_COUNTS['refill'] == before


def test_sampled_tokens_per_request_not_per_slot():
  target, draft = pair()
  outs = [loop.speculative_decode(target, draft, prompts(), gamma=GAMMA, max_new_tokens=M,
                                  eos_id=EOS, temperature=1.0, rng=11, slots=s) for s in (1, 3, Q)]
  for o in outs[1:]:
    np.testing.assert_array_equal(o.tokens, outs[0].tokens)
  # A request's stream is its own: the same prompt moved to another place of the queue (and other
  # neighbours) draws the same tokens when it keeps its request index...
  other = prompts().copy()
  other[[0, 2]] = other[[5, 3]]
  moved = loop.speculative_decode(target, draft, other, gamma=GAMMA, max_new_tokens=M, eos_id=EOS,
                                  temperature=1.0, rng=11, slots=3)
  for r in (1, 4, 6):
    np.testing.assert_array_equal(moved.tokens[r], outs[0].tokens[r])
  # ... and a different rng gives different tokens (the test can fail).
  fresh = loop.speculative_decode(target, draft, prompts(), gamma=GAMMA, max_new_tokens=M,
                                  eos_id=EOS, temperature=1.0, rng=12, slots=3)
  assert not np.array_equal(fresh.tokens, outs[0].tokens)
  ar = [loop.autoregressive_decode(target, prompts(), max_new_tokens=M, eos_id=EOS,
                                   temperature=1.0, rng=11, slots=s) for s in (1, Q)]
  np.testing.assert_array_equal(ar[0].tokens, ar[1].tokens)


def test_bad_input_one_line_errors():
  target, draft = pair()
  with pytest.raises(ValueError, match='slots'):
    loop.speculative_decode(target, draft, prompts(), gamma=GAMMA, max_new_tokens=M, slots=0)
  with pytest.raises(ValueError, match='gamma'):
    loop.speculative_decode(target, draft, prompts(), gamma='often', max_new_tokens=M)
  with pytest.raises(ValueError, match='costs'):
    loop.speculative_decode(target, draft, prompts(), max_new_tokens=M,
                            gamma=refill.Auto(g_max=2, costs=((1.0,), 0.0)))


def many_prompts(q=40):
  return np.random.RandomState(1).randint(2, 64, (q, 6)).astype(np.int32)


def compact_without_cache(st, width):
  """Control: a tail compaction that narrows the slots but leaves the target's cache in the old
  slot order (rows decode against another request's keys/values)."""
  narrowed = _COMPACT(st, width)
  return narrowed.replace(target_cache=jax.tree.map(lambda x: x[:width], st.target_cache))


_COMPACT = queue_lib.compact


def test_tail_shrink_keeps_tokens_and_saves_row_iterations(monkeypatch):
  # 40 requests through 16 slots: once the queue is empty the loop narrows to 8 slots (active rows
  # first). Tokens, per-request statistics and sampled streams are those of the full-width loop.
  target, draft = pair()
  ids = many_prompts()
  assert refill.shrink_widths(16, (jnp.zeros((16, 3)),)) == [16, 8]
  assert refill.shrink_widths(8, (jnp.zeros((8, 3)),)) == [8]
  assert refill.shrink_widths(16, (jnp.zeros((3,)),)) == [16]  # a leaf without a row axis
  for temperature in (0.0, 1.0):
    kw = dict(max_new_tokens=M, eos_id=EOS, slots=16, temperature=temperature, rng=5)
    outs = {shrink: refill.refill_decode(target, draft, ids, gamma=GAMMA, shrink=shrink, **kw)
            for shrink in (True, False)}
    np.testing.assert_array_equal(outs[True].tokens, outs[False].tokens)
    np.testing.assert_array_equal(outs[True].stats.emitted, outs[False].stats.emitted)
    paid = {k: int(o.stats.row_iterations) for k, o in outs.items()}
    assert paid[False] == int(outs[False].stats.iterations) * 16
    assert paid[True] < paid[False], paid
    assert outs[True].stats.row_utilisation > outs[False].stats.row_utilisation
    ar = {shrink: refill.refill_decode(target, None, ids, gamma=None, shrink=shrink, **kw)
          for shrink in (True, False)}
    np.testing.assert_array_equal(ar[True].tokens, ar[False].tokens)
    if temperature == 0:
      ref = loop.autoregressive_decode(target, ids, max_new_tokens=M, eos_id=EOS)
      np.testing.assert_array_equal(outs[True].tokens, ref.tokens)
  # The control (rows separated from their caches) changes the tokens: the check has power.
  monkeypatch.setattr(queue_lib, 'compact', compact_without_cache)
  bad = refill.refill_decode(target, draft, ids, gamma=GAMMA, max_new_tokens=M + 1, eos_id=EOS,
                             slots=16)
  good = refill.refill_decode(target, draft, ids, gamma=GAMMA, max_new_tokens=M + 1, eos_id=EOS,
                              slots=16, shrink=False)
  assert not np.array_equal(bad.tokens, good.tokens)


def test_smooth_costs_is_linear_from_gamma_one():
  c = refill.smooth_costs([1.0, 1.5, 1.9, 1.7, 2.5, 2.9])  # gamma 3 timed 'cheaper' than 2
  assert c[0] == 1.0 and np.all(np.diff(c[1:]) > 0)
  np.testing.assert_allclose(np.diff(c[1:]), np.diff(c[1:])[0])
  flat = refill.smooth_costs([1.0, 2.0, 1.5, 1.2])  # a falling fit is clipped to flat
  np.testing.assert_allclose(flat[1:], np.mean([2.0, 1.5, 1.2]))


# ----------------------------------------------------------------------------- gamma='auto'


def test_choose_gamma_follows_cost_curve_and_alpha():
  auto = refill.Auto(g_max=4, prior=0.8, prior_weight=1.0)
  free = refill.Costs(target_K=jnp.ones(5), draft=jnp.float32(0.0))
  dear = refill.Costs(target_K=jnp.arange(1.0, 6.0), draft=jnp.float32(0.3))
  assert int(refill.choose_gamma(auto, free, 0.0, 0.0)) == 4  # verification free: widest block
  assert int(refill.choose_gamma(auto, dear, 0.0, 0.0)) == 0  # K tokens cost K: plain decoding
  mid = refill.Costs(target_K=jnp.asarray([1.0, 1.3, 1.6, 1.9, 2.2]), draft=jnp.float32(0.1))
  high, low = (int(refill.choose_gamma(auto, mid, a * 100.0, 100.0)) for a in (0.95, 0.2))
  assert high > 1 and low == 0, (high, low)


def test_auto_greedy_identical_and_reports_choices():
  target, draft = pair()
  auto = refill.Auto(g_max=2, prior=1.0, prior_weight=1.0, probe_every=2,
                     costs=((1.0, 1.8, 2.5), 0.05))
  out = loop.speculative_decode(target, draft, prompts(), auto=auto, max_new_tokens=M,
                                eos_id=EOS, slots=3)
  np.testing.assert_array_equal(out.tokens, lockstep_greedy().tokens)
  hist = np.asarray(out.stats.gamma_hist)
  trace = np.asarray(out.stats.gamma_trace)
  assert hist.sum() == int(out.stats.iterations) == (trace >= 0).sum()
  assert hist[0] > 0 and hist[1:].sum() > 0, hist  # plain steps and speculation both ran


# ----------------------------------------------------------------------------- the law, refilled

VL, N_PER, ML, G_LAW, SLOTS = 12, 8000, 3, 2, 511  # odd: a slot's next request has the other prompt
PROMPT_A = [5, 3, 9, 2, 0]
PROMPT_B = [7, 11, 4, 0, 0]


@functools.lru_cache(maxsize=None)
def law_models():
  config = T5Config(vocab_size=VL, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_decoder_layers=1,
                    num_heads=2, relative_attention_num_buckets=8,
                    relative_attention_max_distance=8, gated=True, tie_word_embeddings=False,
                    scale_logits=False)
  return tuple(T5Model(init_params(config, jax.random.PRNGKey(s), scale=1.0), config)
               for s in (0, 1))


def exact_law(prompt, sampling):
  """P(y1, y2, y3) [V, V, V] of the target for one prompt (float64)."""
  prefixes = np.array(list(itertools.product(range(VL), repeat=2)), np.int32)
  dec_in = np.concatenate([np.zeros((VL * VL, 1), np.int32), prefixes], axis=1)
  logits = law_models()[0].logits(np.repeat([prompt], VL * VL, axis=0), dec_in)
  p = np.asarray(probs(logits, sampling), np.float64).reshape(VL, VL, 3, VL)
  law = p[0, 0, 0][:, None, None] * p[:, 0, 1][:, :, None] * p[:, :, 2]
  return law / law.sum()


def refill_nothing(slot_state, queue_state, take_B, req_B):
  """Control: a refill that forgets to load the new request's encoder keys/values (the slot
  decodes the new request against the previous request's source)."""
  del queue_state, take_B, req_B
  return slot_state


def alternating_law_pvalues(target, draft, *, extra_tokens=0, **kw):
  """Per prompt, the chi-square p of the first ML tokens of the requests of PROMPT_A and
  PROMPT_B (alternating in one queue of 2 N_PER through SLOTS slots, T = 1) against the target
  law, and the output. `extra_tokens` > 0 gives a control a program of its own (a longer loop)."""
  ids = np.array([PROMPT_A, PROMPT_B] * N_PER, np.int32)  # request r has prompt r % 2
  m = ML + extra_tokens
  out = loop.speculative_decode(target, draft, ids, slots=SLOTS, max_new_tokens=m,
                                temperature=1.0, rng=2023, eos_id=-1, **kw)
  assert (np.asarray(out.lengths) == m).all()
  codes = np.asarray(out.tokens)[:, :ML] @ np.array([VL * VL, VL, 1])
  sampling = Sampling(temperature=1.0)
  ps = [chi2_pvalue(np.bincount(codes[k::2], minlength=VL ** 3), exact_law(pr, sampling))
        for k, pr in enumerate((PROMPT_A, PROMPT_B))]
  return ps, out


# alpha ~ 0.6 here: the cost curve makes auto switch between plain steps and gamma 1..2.
LAW_AUTO = refill.Auto(g_max=G_LAW, prior=1.0, prior_weight=1.0, probe_every=3,
                       costs=((1.0, 1.8, 2.5), 0.05))


@functools.lru_cache(maxsize=None)
def law_pvalues(extra_tokens=0):
  ps, out = alternating_law_pvalues(*law_models(), auto=LAW_AUTO, extra_tokens=extra_tokens)
  print(f'refill law (+{extra_tokens}): p = {ps}, gamma_hist {np.asarray(out.stats.gamma_hist)}')
  return ps, np.asarray(out.stats.gamma_hist), np.asarray(out.stats.accepted_hist).sum(0)


def test_refilled_requests_follow_target_law():
  ps, hist, accepted = law_pvalues()
  assert hist[0] > 0 and hist[1:].sum() > 0, hist  # plain steps, probes and speculation
  assert accepted[1] > 500, accepted  # drafts accepted often (and rejected: bin 0 holds the rest)
  assert min(ps) > 1e-3, ps


def test_stale_encoder_refill_is_detected(monkeypatch):
  monkeypatch.setattr(queue_lib, 'take_rows', refill_nothing)
  ps, _, _ = law_pvalues(extra_tokens=1)  # a program of its own, traced with the fault
  assert min(ps) < 1e-6, ps
