"""speculative_decode / autoregressive_decode: greedy identity with transformers, the loop's edges.

Shapes: B batch, S source length, M max_new_tokens, G gamma, V vocab.

Targets are tiny T5s (both families) with spread-out random weights; each draft is its target's
params plus noise, at a level where rejections, partial and full acceptances all happen. The
reference is transformers' PyTorch greedy generate on the same weights (written with
specjax.save_t5 and read with from_pretrained). Every distinct (shape, gamma, sampling, eos) is
one more XLA compile (seconds on CPU), so the runs are memoised per module and shapes are shared.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import decoding, save_t5
from specjax.decoding.loop import autoregressive_decode, speculative_decode
from specjax import testing
from specjax.models.t5 import T5Model, init_params
from specjax.testing import add_noise, spread_params

S, M, B = 7, 16, 8  # source length, max_new_tokens, full batch
GAMMAS = (1, 2, 3, 5, 8)
DRAFT_NOISE = 0.1  # relative std of the noise added to the target's matrices to make the draft


# ----------------------------------------------------------------------------- models


def make_target(family):
  config = testing.tiny_config(family)
  if config.gated:
    params = spread_params(init_params(config, jax.random.PRNGKey(1), scale=2.0), 1)
  else:
    params = spread_params(init_params(config, jax.random.PRNGKey(1), scale=4.0), 1, emb=0.5,
                           final_norm=8.0)
  return T5Model(params=params, config=config)


def make_prompts(seed, batch=B, vocab=64):
  """Right-padded prompts (pad 0) with ragged lengths 2 .. S, tokens in [2, vocab)."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((batch, S), np.int32)
  for b in range(batch):
    n = rng.integers(2, S + 1)
    ids[b, :n] = rng.integers(2, vocab, n)
  ids[0, :] = rng.integers(2, vocab, S)  # one full-length row
  return ids


def hf_greedy(hf_model, ids, eos_id):
  """transformers greedy generate -> (tokens [B, M] padded with 0 after EOS, lengths [B])."""
  import torch
  with torch.no_grad():
    out = hf_model.generate(
        input_ids=torch.tensor(ids, dtype=torch.long),
        attention_mask=torch.tensor(ids != 0, dtype=torch.long),
        do_sample=False, num_beams=1, max_new_tokens=M, min_length=0,
        repetition_penalty=1.0, no_repeat_ngram_size=0, eos_token_id=eos_id, pad_token_id=0,
        decoder_start_token_id=0, forced_bos_token_id=None, forced_eos_token_id=None,
        # transformers 5.x's decoder cache raises IndexError when num_decoder_layers !=
        # num_layers; without the cache generate re-runs the full decoder (same greedy tokens).
        use_cache=False)
  out = out.numpy()
  assert (out[:, 0] == 0).all()  # the decoder start token
  toks = np.zeros((ids.shape[0], M), np.int64)
  toks[:, :out.shape[1] - 1] = out[:, 1:]
  if eos_id is None:
    return toks, np.full((ids.shape[0],), M)
  is_eos = toks == eos_id
  lengths = np.where(is_eos.any(1), is_eos.argmax(1) + 1, M)
  return toks, lengths


def pick_eos(tokens_BxM):
  """A token (not pad 0) the target first emits mid-sequence in >= 2 rows and never in >= 2 others.

  Among candidates, the one ending most rows in the middle (4 .. M-3 tokens), then the smallest.
  """
  best = None
  for t in sorted(set(tokens_BxM.ravel().tolist()) - {0}):
    hit = tokens_BxM == t
    first = np.where(hit.any(1), hit.argmax(1), M)
    mid = int(np.sum((first >= 3) & (first <= M - 4)))
    reach = int(np.sum(first == M))
    if mid >= 2 and reach >= 2 and (best is None or mid > best[0]):
      best = (mid, t)
  assert best is not None, tokens_BxM
  return best[1]


class Family:
  """One T5 family's tiny target, noisy draft, transformers twin, prompts and memoised runs."""

  def __init__(self, name, tmp_dir):
    import transformers
    transformers.logging.set_verbosity_error()
    self.name = name
    self.target = make_target(name)
    self.draft = add_noise(self.target, DRAFT_NOISE, seed=7)
    save_t5(self.target, tmp_dir)
    self.hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_dir).eval()
    self.ids = make_prompts(seed=0)
    free, _ = hf_greedy(self.hf, self.ids, None)
    self.eos = pick_eos(free)
    self.hf_tokens, self.hf_lengths = hf_greedy(self.hf, self.ids, self.eos)
    first = np.where((free == self.eos).any(1), (free == self.eos).argmax(1), M)
    # Three rows: one ending early, one reaching max_new_tokens, one more (batch-3 / batch-1 runs).
    early = [b for b in range(B) if 3 <= first[b] <= M - 4]
    reach = [b for b in range(B) if first[b] == M]
    self.rows3 = [early[0], reach[0], next(b for b in range(B) if b not in (early[0], reach[0]))]
    self._runs = {}
    self.traces = {}  # run key -> traces it caused (1 = first compile of that program)

  def spec(self, gamma, rows=None, draft=None, **kw):
    key = (gamma, tuple(rows) if rows is not None else None, id(draft), tuple(sorted(kw.items())))
    if key not in self._runs:
      ids = self.ids if rows is None else self.ids[list(rows)]
      before = decoding.TRACE_COUNTS['speculative']
      out = speculative_decode(self.target, draft or self.draft, ids, gamma=gamma,
                               max_new_tokens=kw.pop('max_new_tokens', M), eos_id=self.eos, **kw)
      self._runs[key] = jax.device_get(out)
      self.traces[key] = decoding.TRACE_COUNTS['speculative'] - before
    return self._runs[key]

  def ar(self):
    if 'ar' not in self._runs:
      before = decoding.TRACE_COUNTS['autoregressive']
      out = autoregressive_decode(self.target, self.ids, max_new_tokens=M, eos_id=self.eos)
      self._runs['ar'] = jax.device_get(out)
      self.traces['ar'] = decoding.TRACE_COUNTS['autoregressive'] - before
    return self._runs['ar']


@pytest.fixture(scope='module')
def families(tmp_path_factory):
  cache = {}

  def get(name):
    if name not in cache:
      cache[name] = Family(name, tmp_path_factory.mktemp(f'decoding_{name}'))
    return cache[name]
  return get


def _assert_same(out, tokens, lengths, what):
  np.testing.assert_array_equal(np.asarray(out.tokens), tokens, err_msg=what)
  np.testing.assert_array_equal(np.asarray(out.lengths), lengths, err_msg=what)


# ----------------------------------------------------------------------------- greedy identity


def test_autoregressive_greedy_matches_transformers(families):
  # Catches a wrong loop baseline: the JAX autoregressive loop must be transformers' greedy.
  fam = families('original')
  ar = fam.ar()
  _assert_same(ar, fam.hf_tokens, fam.hf_lengths, 'autoregressive vs transformers')


@pytest.mark.parametrize('gamma', GAMMAS)
def test_speculative_greedy_identity_batch8(families, gamma):
  # Catches any per-row offset / rollback / draft-cache bug that changes a greedy token.
  fam = families('original')
  out = fam.spec(gamma)
  _assert_same(out, fam.hf_tokens, fam.hf_lengths, f'speculative gamma={gamma} vs transformers')
  _assert_same(out, fam.ar().tokens, fam.ar().lengths, f'speculative gamma={gamma} vs autoregr.')


@pytest.mark.parametrize('rows_kind,gamma', [('one', 5), ('three', 2)])
def test_speculative_greedy_identity_small_batches(families, rows_kind, gamma):
  # Batch sizes 1 and 3: transformers is run on the same sub-batch.
  fam = families('original')
  rows = fam.rows3[:1] if rows_kind == 'one' else fam.rows3
  out = fam.spec(gamma, rows=rows)
  hf_tokens, hf_lengths = hf_greedy(fam.hf, fam.ids[rows], fam.eos)
  _assert_same(out, hf_tokens, hf_lengths, f'batch {len(rows)} vs transformers')
  _assert_same(out, fam.ar().tokens[rows], fam.ar().lengths[rows], 'vs autoregressive rows')


def test_speculative_greedy_identity_v11(families):
  # The gated / untied / unscaled family through the same loop.
  fam = families('v11')
  out = fam.spec(3)
  _assert_same(out, fam.hf_tokens, fam.hf_lengths, 'v1.1 speculative vs transformers')
  _assert_same(out, fam.ar().tokens, fam.ar().lengths, 'v1.1 speculative vs autoregressive')
  # A v1.1 row takes the rejection and the all-accepted path too.
  hist = np.asarray(out.stats.accepted_hist).sum(0)
  assert hist[0] > 0 and hist[-1] > 0, hist


def test_greedy_runs_hit_reject_partial_and_full_acceptance(families):
  # Without this the identity tests could pass on a draft that is always right (or always wrong).
  fam = families('original')
  for gamma in GAMMAS:
    hist = np.asarray(fam.spec(gamma).stats.accepted_hist).sum(0)
    assert hist[0] > 0, (gamma, hist)          # immediate rejections
    assert hist[gamma] > 0, (gamma, hist)      # full acceptance (bonus token path)
    if gamma >= 2:
      assert hist[1:gamma].sum() > 0, (gamma, hist)  # rejections in the middle of a block


def test_eos_ends_rows_and_pads(families):
  # Catches EOS not counted in lengths, tokens after EOS not padded, or rows stopped too early.
  fam = families('original')
  out = fam.spec(3)
  toks, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  ended = lengths < M
  assert ended.sum() >= 2 and (~ended).sum() >= 2, lengths
  for b in range(B):
    n = lengths[b]
    if n < M:
      assert toks[b, n - 1] == fam.eos
      assert (toks[b, n:] == 0).all()
    assert (toks[b, :n - 1] != fam.eos).all()


def test_batch_invariance(families):
  # A greedy row's output must not depend on the other rows (per-row offsets, masks, caches).
  fam = families('original')
  gamma = 5
  r = fam.rows3[0]
  in_batch = fam.spec(gamma)
  alone = fam.spec(gamma, rows=[r])
  others = make_prompts(seed=123)
  others[3] = fam.ids[r]
  mixed = speculative_decode(fam.target, fam.draft, others, gamma=gamma, max_new_tokens=M,
                             eos_id=fam.eos)
  for out, row in ((alone, 0), (mixed, 3)):
    np.testing.assert_array_equal(np.asarray(out.tokens)[row], np.asarray(in_batch.tokens)[r])
    assert int(np.asarray(out.lengths)[row]) == int(np.asarray(in_batch.lengths)[r])
  # Rows of `mixed` that differ from r must also differ in output (not a broadcast of row 3).
  assert not (np.asarray(mixed.tokens) == np.asarray(mixed.tokens)[3]).all()


# ----------------------------------------------------------------------------- sampling / rng


def test_rng_determinism_and_independent_rows(families):
  # Catches shared keys across rows or iterations, and nondeterminism for a fixed key.
  fam = families('v11')
  kw = dict(gamma=3, max_new_tokens=M, temperature=1.0, eos_id=fam.eos)
  a = speculative_decode(fam.target, fam.draft, fam.ids, rng=jax.random.PRNGKey(1), **kw)
  b = speculative_decode(fam.target, fam.draft, fam.ids, rng=jax.random.PRNGKey(1), **kw)
  c = speculative_decode(fam.target, fam.draft, fam.ids, rng=jax.random.PRNGKey(2), **kw)
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  np.testing.assert_array_equal(np.asarray(a.lengths), np.asarray(b.lengths))
  assert (np.asarray(a.tokens) != np.asarray(c.tokens)).any()
  same = np.repeat(fam.ids[:1], B, axis=0)
  d = np.asarray(speculative_decode(fam.target, fam.draft, same, rng=jax.random.PRNGKey(3),
                                    **kw).tokens)
  # Shared keys would make the 8 copies of one prompt identical. Independent rows differ, except
  # that about half of them end at once with EOS (the first token's law puts ~0.5 on it), so
  # independent rows give 4-8 distinct outputs; more than 2 rules out shared keys.
  assert len({tuple(row) for row in d.tolist()}) > 2, d


# ----------------------------------------------------------------------------- compilation


def test_no_retrace(families):
  # Catches Python values leaking into the jit key (a retrace per call) and a non-static gamma.
  fam = families('original')
  for gamma in GAMMAS:  # each new gamma (same shapes otherwise) traced exactly once more
    fam.spec(gamma)
    assert fam.traces[(gamma, None, id(None), ())] == 1, (gamma, fam.traces)
  fam.ar()
  assert fam.traces['ar'] == 1
  before = dict(decoding.TRACE_COUNTS)
  # Same shapes / gamma / sampling, different values everywhere: no new trace.
  other_ids = make_prompts(seed=5)
  kw = dict(max_new_tokens=M, eos_id=fam.eos)
  for gamma in (3, 8):
    speculative_decode(fam.target, add_noise(fam.target, 0.3, 9), other_ids, gamma=gamma, rng=11,
                       **kw)
  autoregressive_decode(fam.target, other_ids, rng=jax.random.PRNGKey(4), **kw)
  assert dict(decoding.TRACE_COUNTS) == before


# ----------------------------------------------------------------------------- max-length edges


@pytest.mark.parametrize('max_new,gamma', [(1, 3), (3, 5)])
def test_max_length_edges(families, max_new, gamma):
  # max_new_tokens = 1 and < gamma: a block longer than the budget must be cut, never overflow.
  fam = families('original')
  out = fam.spec(gamma, max_new_tokens=max_new)
  ar = fam.ar()
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens)[:, :max_new])
  np.testing.assert_array_equal(np.asarray(out.lengths),
                                np.minimum(np.asarray(ar.lengths), max_new))
  assert (np.asarray(out.lengths) == max_new).sum() >= B // 2
  assert (np.asarray(out.stats.target_calls) <= max_new).all()


def test_max_length_reached_with_full_blocks(families):
  # draft == target: every block is fully accepted, M = 4 * (gamma + 1) is hit exactly by a
  # full block plus bonus token (the draft's 2-token catch-up path every iteration).
  fam = families('original')
  gamma = 3
  assert M % (gamma + 1) == 0
  fam.spec(gamma)  # (same program; keeps test_no_retrace's first-compile bookkeeping order-free)
  out = fam.spec(gamma, draft=fam.target)
  _assert_same(out, fam.ar().tokens, fam.ar().lengths, 'draft == target')
  hist = np.asarray(out.stats.accepted_hist)
  assert hist[:, :gamma].sum() == 0 and hist[:, gamma].sum() > 0, hist
  assert abs(out.stats.alpha - 1.0) < 1e-6  # greedy p, q are identical one-hots
  reach = np.asarray(out.lengths) == M
  assert reach.sum() >= 2
  np.testing.assert_array_equal(np.asarray(out.stats.target_calls)[reach], M // (gamma + 1))


# ----------------------------------------------------------------------------- dtype / NaN


def test_bfloat16_greedy(families):
  # bf16 weights: softmax/acceptance stay float32 and the result is still the greedy sequence.
  fam = families('original')
  target = fam.target.astype(jnp.bfloat16)
  draft = fam.draft.astype(jnp.bfloat16)
  spec = speculative_decode(target, draft, fam.ids, gamma=3, max_new_tokens=M, eos_id=fam.eos)
  ar = autoregressive_decode(target, fam.ids, max_new_tokens=M, eos_id=fam.eos)
  _assert_same(spec, np.asarray(ar.tokens), np.asarray(ar.lengths), 'bf16 speculative vs autoregr.')
  assert np.asarray(spec.stats.accepted_hist)[:, 0].sum() > 0  # the draft still gets rejected


def test_nan_logits_raise(families):
  # NaN weights must raise, not return garbage tokens (same shapes: no new compile).
  fam = families('original')
  fam.spec(3), fam.ar()  # (the same programs; keeps test_no_retrace's bookkeeping order-free)
  params = dict(fam.target.params)
  params['decoder'] = dict(params['decoder'], final_norm=jnp.full_like(
      params['decoder']['final_norm'], jnp.nan))
  bad = fam.target.replace(params=params)
  kw = dict(max_new_tokens=M, eos_id=fam.eos)
  with pytest.raises(FloatingPointError, match='NaN'):
    speculative_decode(bad, fam.draft, fam.ids, gamma=3, **kw)
  with pytest.raises(FloatingPointError, match='NaN'):
    autoregressive_decode(bad, fam.ids, **kw)
  with pytest.raises(FloatingPointError, match='NaN'):  # a NaN draft too
    speculative_decode(fam.target, bad, fam.ids, gamma=3, **kw)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize('change,field', [
    (dict(gamma=0), 'gamma'),
    (dict(max_new_tokens=0), 'max_new_tokens'),
    (dict(temperature=-0.5), 'temperature'),
    (dict(top_p=0.0), 'top_p'),
    (dict(top_p=1.5), 'top_p'),
    (dict(top_k=-1), 'top_k'),
    (dict(draft_vocab=65), 'vocab'),
    (dict(input_ids=np.arange(2, 9)), 'input_ids'),
])
def test_bad_input_raises_before_compiling(families, change, field):
  # Catches validation that happens inside jit (cryptic errors, a wasted compile) or not at all.
  fam = families('original')
  change = dict(change)
  draft = fam.draft
  if 'draft_vocab' in change:  # only the config matters: validation runs before any compute
    draft = draft.replace(config=dataclasses.replace(draft.config,
                                                     vocab_size=change.pop('draft_vocab')))
  kw = dict(input_ids=fam.ids, gamma=3, max_new_tokens=M, eos_id=fam.eos)
  kw.update(change)
  ids = kw.pop('input_ids')
  before = dict(decoding.TRACE_COUNTS)
  with pytest.raises(ValueError, match=field):
    speculative_decode(fam.target, draft, ids, **kw)
  if field not in ('gamma', 'vocab'):  # the same check in the autoregressive entry point
    kw.pop('gamma')
    with pytest.raises(ValueError, match=field):
      autoregressive_decode(fam.target, ids, **kw)
  assert dict(decoding.TRACE_COUNTS) == before
