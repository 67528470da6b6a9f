"""The feature head in every mode: slots=, gamma='auto', token trees, block verification, stop
rules (one engine step serves them all).

Shapes: N rows (requests), V = 12 vocab, M = 3 tokens, Df the target's d_model.

Law tests reuse tests/test_feature_head.py's enumerable setup (a tiny V = 12 target, a random
head, chi-square of the first three tokens against the target's enumerated law). Under slot
refill the queue alternates two prompts, so a refill that loads the wrong request's state is
visible. Every law test has a negative control that breaks one ingredient and must be rejected
(p < 1e-6) by the same test; each control runs a program of its own (another class or static
argument), so no control can reuse an exact program's compiled code. Greedy: token-identical to
autoregressive decoding with 32 ragged prompts through slots=8, with gamma='auto', with trees.
"""

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import test_feature_head as fh  # the tiny target, the random head, the exact law
from chi2 import chi2_pvalue  # tests/chi2.py
from test_refill import refill_nothing
from test_tree import STALE_RESIDUAL, relabel
from specjax.decoding import acceptance, loop, stopping, tree as tree_lib
from specjax.decoding import queue as queue_lib
from specjax.decoding.auto import Auto
from specjax.decoding.feature_head import FeatureHeadDraft
from specjax.decoding.sampling import Sampling, probs
from specjax.models import t5

T1, T07 = Sampling(temperature=1.0), Sampling(temperature=0.7)
V, M = fh.V, fh.M
PROMPT_B = np.array([[7, 11, 4, 0, 0]], np.int32)
N_PER, SLOTS = 10_000, 512
# The cost curve makes gamma='auto' switch between plain steps (gamma 0) and gamma 1 .. 2.
SWITCHING = Auto(g_max=2, prior=1.0, prior_weight=1.0, probe_every=3, costs=((1.0, 1.8, 2.5), 0.05))


@functools.lru_cache(maxsize=None)
def exact_law(prompt: tuple, sampling):
  """P(y1, y2, y3) [V, V, V] of the target for one prompt (float64)."""
  prefixes = np.array(list(itertools.product(range(V), repeat=2)), np.int32)
  dec_in = np.concatenate([np.zeros((V * V, 1), np.int32), prefixes], axis=1)
  logits = fh.models()[0].logits(np.repeat([prompt], V * V, axis=0), dec_in)
  p = np.asarray(probs(logits, sampling), np.float64).reshape(V, V, 3, V)
  law = p[0, 0, 0][:, None, None] * p[:, 0, 1][:, :, None] * p[:, :, 2]
  return law / law.sum()


@functools.lru_cache(maxsize=None)
def queued_pvalues(extra_tokens=0, verifier='token', **kw):
  """Requests alternating fh.PROMPT and PROMPT_B through SLOTS slots at T = 1: per prompt the
  chi-square p of the first three tokens, and the stats. `extra_tokens` > 0: a program of its
  own for a control traced under a monkeypatch."""
  target, head = fh.models()
  ids = np.concatenate([fh.PROMPT, PROMPT_B] * N_PER, axis=0)  # request r has prompt r % 2
  m = M + extra_tokens
  out = loop.speculative_decode(target, head, ids, slots=SLOTS, max_new_tokens=m, temperature=1.0,
                                rng=jax.random.PRNGKey(fh.SEED), eos_id=-1, verifier=verifier,
                                **dict(kw))
  assert (np.asarray(out.lengths) == m).all()
  ps = [chi2_pvalue(fh.counts_of(np.asarray(out.tokens)[k::2]), exact_law(tuple(pr[0]), T1))
        for k, pr in enumerate((fh.PROMPT, PROMPT_B))]
  print(f'queued {kw} +{extra_tokens} {verifier}: p = {ps}')
  return ps, jax.device_get(out.stats)


# ----------------------------------------------------------------------------- slots


def test_head_with_slots_follows_target_law():
  ps, stats = queued_pvalues(gamma=2)
  assert np.asarray(stats.accepted_hist).sum(0).min() > 1000
  assert min(ps) > 1e-3, ps


def test_head_with_slots_stale_refill_is_detected(monkeypatch):
  # Control: a refill that loads nothing (the slot decodes a new request against the previous
  # request's source: the target's cross keys/values and the head's).
  monkeypatch.setattr(queue_lib, 'take_rows', refill_nothing)
  ps, _ = queued_pvalues(extra_tokens=1, gamma=2)
  assert min(ps) < 1e-6, ps


# ----------------------------------------------------------------------------- gamma='auto'


def test_head_with_auto_gamma_follows_target_law():
  ps, stats = queued_pvalues(auto=SWITCHING)
  hist = np.asarray(stats.gamma_hist)
  assert hist[0] > 0 and hist[1:].sum() > 0, hist  # plain steps (then resyncs) and speculation
  assert min(ps) > 1e-3, ps


def test_head_with_auto_gamma_always_accept_is_detected():
  ps, _ = queued_pvalues(auto=SWITCHING, verifier=fh.ALWAYS_ACCEPT)
  assert min(ps) < 1e-6, ps


# ----------------------------------------------------------------------------- trees


@struct.dataclass
class WorLabeledIidHead(FeatureHeadDraft):
  """Control: candidates drawn without replacement but reported as i.i.d. draws from q."""

  def propose_tree(self, state, seq_BxN, lengths_B, keys_B, shape, sampling):
    return relabel(super().propose_tree(state, seq_BxN, lengths_B, keys_B, shape, sampling),
                   shape, 'iid')


TREES = {'(2,2,1)/T1': ((2, 2, 1), T1), '(4,1,1)/T0.7': ((4, 1, 1), T07)}


@pytest.mark.parametrize('name', list(TREES))
def test_head_tree_follows_target_law(name):
  tree, sampling = TREES[name]
  p, stats = fh.law_pvalue(sampling, gamma=None, tree=tree)
  hist = np.asarray(stats.accepted_hist).sum(0)
  print(f'head tree {name}: p = {p:.3g}, accepted path lengths {hist}, alpha {stats.alpha:.3f}, '
        f'level acceptance {stats.level_acceptance:.3f}')
  assert hist[:3].min() > 200, hist  # rejections at every depth and full paths both frequent
  assert p > 1e-3, p


@pytest.mark.parametrize('control', ['stale_residual', 'wor_verified_as_iid'])
def test_head_tree_controls_are_detected(control):
  kw = {'stale_residual': dict(verifier=STALE_RESIDUAL),
        'wor_verified_as_iid': dict(draft_cls=WorLabeledIidHead)}[control]
  p, _ = fh.law_pvalue(T07, gamma=None, tree=(4, 1, 1), **kw)
  print(f'head tree control {control}: p = {p:.3g}')
  assert p < 1e-6, p


# ----------------------------------------------------------------------------- block, stop rules


def test_head_with_block_verification_follows_target_law():
  p, stats = fh.law_pvalue(T1, verifier='block')
  print(f'head + block verification: p = {p:.3g}, accepted {np.asarray(stats.accepted_hist).sum(0)}')
  assert np.asarray(stats.accepted_hist).sum(0).min() > 1000
  assert p > 1e-3, p


def test_head_with_block_verification_reused_noise_is_detected():
  with fh.reused_step_noise():
    p, _ = fh.law_pvalue(T1, verifier='block', draft_cls=fh.ReusedNoiseHead)
  print(f'head + block verification, control reused noise: p = {p:.3g}')
  assert p < 1e-6, p


def test_head_with_a_biased_stop_rule_is_detected():
  # Control for tests/test_feature_head.py's stop-rule law test: the rule that drops a drafted
  # token because of its own low q.
  p, stats = fh.law_pvalue(T1, stop=stopping.UnsafeDropLowConfidence(0.15), gamma=3)
  hist = np.asarray(stats.proposed_hist).sum(0)
  print(f'head + unsafe stop: p = {p:.3g}, proposed {hist}')
  assert hist[:3].sum() > 0.05 * hist.sum(), hist
  assert p < 1e-6, p


# ----------------------------------------------------------------------------- greedy


@dataclasses.dataclass(frozen=True)
class BlockAsWritten(acceptance.BlockVerifier):
  """The block rule's own code at temperature 0 (not the batched argmax shortcut)."""
  argmax_at_greedy = False


@functools.lru_cache(maxsize=None)
def greedy_case():
  """32 ragged prompts, an EOS that ends about half the rows early, and their greedy tokens (the
  V = 12 pair: the random head agrees with the target's argmax often enough to be accepted)."""
  target, head = fh.models()
  rng = np.random.RandomState(7)
  ids = rng.randint(2, V, (32, 9)).astype(np.int32)
  for b in range(32):
    ids[b, 3 + b % 6:] = 0
  eos = 6
  base = loop.autoregressive_decode(target, ids, max_new_tokens=14, eos_id=eos)
  lengths = np.asarray(base.lengths)
  assert (lengths < 14).any() and (lengths == 14).any(), lengths
  return target, head, ids, eos, base


GREEDY_MODES = {
    'slots=8': dict(gamma=3, slots=8),
    "gamma='auto'": dict(gamma='auto:3', slots=8),
    'auto switching': dict(auto=SWITCHING, slots=8),
    'tree (3,2,1)': dict(tree=(3, 2, 1)),
    'tree wide:4,3': dict(tree='wide:4,3'),
    'block': dict(gamma=3, verifier=BlockAsWritten()),
    'confidence stop, slots=8': dict(gamma=4, slots=8, stop='confidence:0.3'),
}


@pytest.mark.parametrize('mode', list(GREEDY_MODES))
def test_head_greedy_is_token_identical_in_every_mode(mode):
  target, head, ids, eos, base = greedy_case()
  out = loop.speculative_decode(target, head, ids, max_new_tokens=14, eos_id=eos,
                                **GREEDY_MODES[mode])
  np.testing.assert_array_equal(out.tokens, base.tokens, err_msg=mode)
  np.testing.assert_array_equal(out.lengths, base.lengths, err_msg=mode)
  hist = np.asarray(out.stats.accepted_hist).sum(0)
  if mode == "gamma='auto'":  # the measured curve may well choose plain decoding throughout
    print(f'{mode}: gamma_hist {np.asarray(out.stats.gamma_hist)}, accepted {hist}')
    return
  assert hist[0] > 0 and hist[1:].sum() > 0, (mode, hist)  # accepts and rejects both happen
  if mode == 'auto switching':
    assert np.asarray(out.stats.gamma_hist)[0] > 0, out.stats.gamma_hist


def accept_first_children(key, tokens_M1, q_MxV, p_M1xV, shape):
  """Broken tree rule: the first child at every depth is accepted, then a draw from the leaf."""
  path = [jnp.int32(0)]
  for d in range(shape.depth):
    path.append(jnp.int32(shape.first_child(d, path[-1])))
  return jnp.stack(path), jnp.int32(shape.depth), jnp.argmax(p_M1xV[path[-1]]).astype(jnp.int32)


BROKEN = {'slots=8': fh.ALWAYS_ACCEPT, 'auto switching': fh.ALWAYS_ACCEPT,
          'tree (3,2,1)': acceptance.FunctionVerifier(accept_first_children)}


@pytest.mark.parametrize('mode', list(BROKEN))
def test_head_greedy_controls_are_detected(mode):
  # Control: the same comparison with a verifier that accepts what it should not.
  target, head, ids, eos, base = greedy_case()
  kw = dict(GREEDY_MODES[mode], verifier=BROKEN[mode])
  out = loop.speculative_decode(target, head, ids, max_new_tokens=14, eos_id=eos, **kw)
  assert not np.array_equal(out.tokens, base.tokens), mode


# ----------------------------------------------------------------------------- tree plumbing


def test_head_tree_holds_the_target_teacher_forced_features():
  """After every tree iteration prev[j] = f_{j-1} for j <= L (the accepted path's hidden states
  from the tree pass itself), f from teacher forcing."""
  target, head = fh._greedy_pair()  # pylint: disable=protected-access
  ids = np.random.RandomState(3).randint(2, 48, (3, 8)).astype(np.int32)
  ids[1, 4:] = 0
  shape, max_new = tree_lib.TreeShape((3, 2, 1)), 12
  state = tree_lib.tree_init(target, head, jnp.asarray(ids), jax.random.PRNGKey(4), shape=shape,
                             max_new_tokens=max_new)
  step = jax.jit(functools.partial(tree_lib.tree_step, shape=shape, max_new_tokens=max_new,
                                   sampling=T1, eos_id=-1))
  teacher = jax.jit(t5.teacher_forced_hidden, static_argnums=1)
  ms = set()
  while not bool(np.all(np.asarray(state.done))):
    before = np.asarray(state.stats.accepted).copy()
    state = step(target, head, state)
    ms.update((np.asarray(state.stats.accepted) - before).tolist())
    lengths, seq = np.asarray(state.lengths), np.asarray(state.seq)
    hidden = np.asarray(teacher(target.params, target.config, jnp.asarray(ids),
                                jnp.asarray(seq[:, :max_new + 1])))
    prev = np.asarray(state.draft_state.prev_BxNxDf)
    for b in range(3):
      lb = min(lengths[b], max_new - 1)
      np.testing.assert_allclose(prev[b, 1:lb + 1], hidden[b, :lb], rtol=1e-5, atol=1e-5)
  assert 0 in ms and max(ms) >= 2, ms  # rejections and accepted paths of depth >= 2
