"""Tree speculative decoding (specjax.decoding.tree): the T5 tree block, exactness, greedy identity.

Shapes: N rows, V vocab, M tree nodes below the root, D depth.

The law tests follow tests/test_exactness.py: one batched call decodes the first 3 tokens of
N = 20,000 copies of one prompt with a depth-3 tree, and the V^3 counts are compared by
chi-square with the target law enumerated from teacher-forced logits (exact_law there). A full
acceptance emits 3 path tokens + a bonus, a rejection at any depth emits a residual draw and a
second iteration follows (the gathered caches are then read). Each negative control breaks one
ingredient of the rule and must be rejected with p < 1e-6 on the same setup.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from chi2 import chi2_pvalue  # tests/chi2.py
from test_exactness import PROMPT, exact_law, models  # the V = 12 pair and its enumerated law
from specjax.decoding import acceptance, candidates
from specjax.decoding import tree as tree_lib
from specjax.decoding.loop import autoregressive_decode, speculative_decode
from specjax.decoding.sampling import Sampling
from specjax.models import t5 as t5_lib
from specjax.testing import add_noise, spread_params, tiny_config, tiny_t5

N, M_TOKENS, SEED = 20_000, 3, 17
TREE = (2, 2, 1)  # the law tests: branching at two depths
WIDE = (4, 1, 1)  # schemes and controls: 4 siblings at the root make sibling-law errors visible
V = 12
PAD = 16  # teacher-forced references padded to one length (one compile; the decoder is causal)


# ----------------------------------------------------------------------------- tree shape


def test_tree_shape_indexing():
  shape = tree_lib.TreeShape((3, 2, 1))
  assert shape.level_size == (1, 3, 6, 6) and shape.level_start == (0, 1, 4, 10, 16)
  assert shape.nodes == 15 and shape.internal == 10 and shape.depth == 3
  assert shape.parent().tolist() == [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7, 8, 9]
  assert shape.paths().tolist()[:2] == [[0, 1, 4, 10], [0, 1, 5, 11]]
  anc = shape.ancestors()
  assert anc[11].nonzero()[0].tolist() == [0, 1, 5, 11]
  assert tree_lib.parse_tree('(3,2,1)') == shape == tree_lib.parse_tree([3, 2, 1])
  assert tree_lib.parse_trees('((3,2,1), (2,2,2,1))')[1].branching == (2, 2, 2, 1)
  assert tree_lib.parse_trees('(3,2,1)') == (shape,)
  for bad in ['(3,0)', '()', 'x', (2.5,), '((1,2),(0,))']:
    with pytest.raises(ValueError, match='tree'):
      tree_lib.parse_trees(bad)


# ----------------------------------------------------------------------------- T5 tree block


@functools.lru_cache(maxsize=None)
def spread_pair(family='v11', noise=0.3):
  cfg = tiny_config(family)
  target = tiny_t5(cfg, seed=0)
  target = target.replace(params=spread_params(target.params, 0))
  return target, add_noise(target, noise, 1)


decode_tree = jax.jit(lambda m, c, t, l, d, a, o: m.decode_tree(c, t, l, d, a, o),
                      static_argnums=(4, 5, 6))
gather_path = jax.jit(t5_lib.gather_path)
decode = jax.jit(lambda m, c, t, l: m.decode(c, t, l))


class _Static:
  """A numpy array usable as a static jit argument (hash by content)."""

  def __init__(self, a):
    self.a = np.asarray(a)

  def __hash__(self):
    return hash((self.a.shape, self.a.tobytes()))

  def __eq__(self, other):
    return isinstance(other, _Static) and np.array_equal(self.a, other.a)

  def __array__(self, dtype=None, copy=None):
    return self.a if dtype is None else self.a.astype(dtype)


def _tree_args(shape):
  return _Static(shape.depth_of()), _Static(shape.ancestors())


def chain_logits(model, src_1xS, dec):
  """Teacher-forced logits of one decoder input, padded to PAD tokens (one compiled shape)."""
  padded = np.zeros((1, PAD), np.int32)
  padded[0, :len(dec)] = dec
  return np.asarray(model.logits(src_1xS, padded))[0, :len(dec)]


def _ragged_case(shape, b=3, seed=0):
  rng = np.random.default_rng(seed)
  src = rng.integers(2, 60, (b, 7)).astype(np.int32)
  src[1, 4:] = 0
  lengths = np.array([0, 3, 5], np.int32)[:b]
  prefix = rng.integers(2, 60, (b, 8)).astype(np.int32)
  prefix[:, 0] = 0
  toks = rng.integers(2, 60, (b, shape.nodes + 1)).astype(np.int32)
  toks[:, 0] = prefix[np.arange(b), lengths]
  return src, lengths, prefix, toks


@pytest.mark.parametrize('family', ['original'])  # v11: the gather test below
def test_tree_block_logits_equal_chain_logits_of_every_path(family):
  # Rows at different offsets; every root-to-leaf path scored as a chain separately must give the
  # tree block's rows (mask: prefix + ancestors only; positions by depth; cross-attention as is).
  target, _ = spread_pair(family)
  shape = tree_lib.TreeShape((3, 2, 1))
  src, lengths, prefix, toks = _ragged_case(shape)
  cache = target.init_cache(src, 8 + shape.nodes + 1)
  _, cache = decode(target, cache, prefix, jnp.zeros((3,), jnp.int32))  # slots >= L: leftovers
  logits = np.asarray(decode_tree(target, cache, toks, lengths, *_tree_args(shape), 0)[0])
  for b in range(3):
    for path in shape.paths():
      dec = np.concatenate([prefix[b, :lengths[b]], toks[b, path]])
      ref = chain_logits(target, src[b:b + 1], dec)[lengths[b]:]
      np.testing.assert_allclose(logits[b, path], ref, atol=2e-4, rtol=2e-4)


def test_level_by_level_feeding_and_gather_path_give_a_chain_cache():
  # The draft feeds the tree one level at a time (offset = level start); after gather_path of a
  # path, an ordinary chain decode at the next slot sees exactly that path as its prefix.
  target, _ = spread_pair('v11')
  shape = tree_lib.TreeShape((2, 3, 2))
  src, lengths, prefix, toks = _ragged_case(shape, seed=1)
  cache = target.init_cache(src, 8 + shape.nodes + 2)
  _, cache = decode(target, cache, prefix, jnp.zeros((3,), jnp.int32))
  depth, anc = _tree_args(shape)
  starts = shape.level_start
  whole = np.asarray(decode_tree(target, cache, toks, lengths, depth, anc, 0)[0])
  rows = []
  for d in range(shape.depth + 1):
    lo, hi = starts[d], starts[d + 1]
    out, cache = decode_tree(target, cache, toks[:, lo:hi], lengths, depth, anc, lo)
    rows.append(np.asarray(out))
  np.testing.assert_allclose(np.concatenate(rows, 1), whole, atol=2e-4, rtol=2e-4)
  path = shape.paths()[[4, 0, 9]]  # a different path per row
  moved = gather_path(cache, lengths, jnp.asarray(path))
  nxt = np.full((3, 1), 7, np.int32)
  got = np.asarray(decode(target, moved, nxt, jnp.asarray(lengths + shape.depth + 1))[0])[:, 0]
  for b in range(3):
    dec = np.concatenate([prefix[b, :lengths[b]], toks[b, path[b]], [7]])
    ref = chain_logits(target, src[b:b + 1], dec)[-1]
    np.testing.assert_allclose(got[b], ref, atol=2e-4, rtol=2e-4)


# ----------------------------------------------------------------------------- greedy


def test_greedy_tree_is_token_identical_to_greedy_decoding_ragged_batch():
  # Batch 4 with different source paddings; EOS on, so rows end at different iterations.
  target, draft = spread_pair('v11', noise=0.2)
  rng = np.random.default_rng(3)
  src = rng.integers(2, 60, (4, 9)).astype(np.int32)
  src[1, 5:] = 0
  src[3, 2:] = 0
  ref = autoregressive_decode(target, src, max_new_tokens=24, eos_id=7)
  out = speculative_decode(target, draft, src, tree=(3, 2, 1), max_new_tokens=24, eos_id=7)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  assert len(set(np.asarray(ref.lengths).tolist())) > 1, ref.lengths  # really ragged
  s = out.stats.summary()
  assert s['nodes_per_target_call'] == 15 and s['draft_passes'] == 3 * s['iterations']
  hist = s['accepted_hist']
  assert hist[0] > 0 and sum(hist[1:]) > 0, hist  # both matches and mismatches happened
  assert s['tokens_per_target_call'] > 1.0


def test_tree_argument_errors():
  target, draft = spread_pair('v11')
  ids = np.ones((1, 4), np.int32)
  with pytest.raises(ValueError, match='tree'):
    speculative_decode(target, draft, ids, tree=(2, 0), max_new_tokens=4)
  with pytest.raises(ValueError, match='gamma'):
    speculative_decode(target, draft, ids, tree=(2, 2), gamma=3, max_new_tokens=4)
  from specjax.decoding.drafts import UnigramDraft
  with pytest.raises(ValueError, match='model draft'):
    speculative_decode(target, UnigramDraft(jnp.zeros((64,))), ids, tree=(2,), max_new_tokens=4)


# ----------------------------------------------------------------------------- the law


SETTINGS = {'temp1': Sampling(temperature=1.0), 'temp0.7': Sampling(temperature=0.7)}


@functools.lru_cache(maxsize=None)
def drafts():
  """near: the target with weight noise (alpha high); far: an independent random T5."""
  target, far = models()
  return {'near': add_noise(target, 0.5, 5), 'far': far}


@functools.lru_cache(maxsize=None)
def generate(sampling, draft_name, tree=TREE, candidates='wor', verifier='token', draft_cls=None,
             extra_tokens=0):
  """Counts of the first M_TOKENS tokens. `extra_tokens` > 0 gives a mislabelled draft a program
  of its own (a longer loop): its draft differs from another only in a method, and a control
  once ran the iid-as-wor draft's compiled program (its counts equalled that run's)."""
  target = models()[0]
  draft = (draft_cls or tree_lib.TreeModelDraft)(drafts()[draft_name], candidates)
  m = M_TOKENS + extra_tokens
  out = speculative_decode(target, draft, np.repeat(PROMPT, N, axis=0), tree=tree,
                           max_new_tokens=m, temperature=sampling.temperature,
                           rng=jax.random.PRNGKey(SEED), eos_id=-1, verifier=verifier)
  tokens = np.asarray(out.tokens)
  assert tokens.shape == (N, m) and (np.asarray(out.lengths) == m).all()
  first = tokens[:, :M_TOKENS]
  return np.bincount(first @ np.array([V * V, V, 1]), minlength=V ** 3), out.stats


def law_pvalue(name, sampling, draft_name, **kw):
  counts, stats = generate(sampling, draft_name, **kw)
  p = chi2_pvalue(counts, exact_law(sampling))
  print(f'{name}: chi-square p = {p:.3g}, accepted path lengths {stats.summary()["accepted_hist"]}')
  return p, stats


@pytest.mark.parametrize('draft_name', ['near', 'far'])
@pytest.mark.parametrize('setting', list(SETTINGS))
def test_tree_first_three_tokens_follow_target_law(setting, draft_name):
  p, stats = law_pvalue(f'{setting}/{draft_name}', SETTINGS[setting], draft_name)
  hist = np.asarray(stats.accepted_hist).sum(0)
  assert hist[:3].min() > 200, hist  # rejections at every depth and full paths both frequent
  assert p > 1e-3, (setting, draft_name, p, hist)


@pytest.mark.parametrize('candidates', ['wor', 'iid'])
def test_wide_tree_both_candidate_schemes_follow_target_law(candidates):
  p, _ = law_pvalue(f'temp0.7/far/{WIDE}/{candidates}', SETTINGS['temp0.7'], 'far', tree=WIDE,
                    candidates=candidates)
  assert p > 1e-3, (candidates, p)


# ----------------------------------------------------------------------------- negative controls


def verify_stale_residual(key, tokens_M1, q_MxV, p_M1xV, shape):
  """(a) Siblings verified against p itself: the residual is never updated after a rejection."""
  return tree_lib.verify_tree(key, tokens_M1, q_MxV, p_M1xV, shape, residual_fn=lambda r, q: r)


STALE_RESIDUAL = acceptance.FunctionVerifier(verify_stale_residual)


def relabel(prop, shape, scheme):
  """The proposal with every sibling group's laws recomputed as `scheme` reports them, from the
  group's first law (q itself under both schemes; tokens unchanged)."""
  qs = []
  for d, b in enumerate(shape.branching):
    lo, hi = shape.level_start[d + 1], shape.level_start[d + 2]
    q_BxCxV = prop.q_BxMxV[:, lo - 1:hi - 1]
    bsz, c, v = q_BxCxV.shape
    first_BxKxV = q_BxCxV.reshape(bsz, c // b, b, v)[:, :, 0]
    tok_BxKxb = prop.tokens_BxM1[:, lo:hi].reshape(bsz, c // b, b)
    qs.append(candidates.sibling_laws(first_BxKxV, tok_BxKxb, scheme).reshape(bsz, c, v))
  return prop.replace(q_BxMxV=jnp.concatenate(qs, axis=1))


@struct.dataclass
class IidLabeledWor(tree_lib.TreeModelDraft):
  """Candidates drawn i.i.d. (build it with candidates='iid') but reported with the
  without-replacement laws. NOT a broken sampler: given the earlier siblings, an i.i.d. candidate
  that repeats one has q_i(x) = 0 and is skipped (r_i(x) = 0 there anyway), and one that does not
  is distributed exactly as q_i, so the rule is a mixture of exact procedures. Shown by the law
  test below."""

  def propose_tree(self, cache, seq_BxN, lengths_B, keys_B, shape, sampling):
    return relabel(super().propose_tree(cache, seq_BxN, lengths_B, keys_B, shape, sampling),
                   shape, 'wor')


def test_iid_candidates_verified_with_the_without_replacement_laws_are_exact():
  p, _ = law_pvalue('temp0.7/far/iid-as-wor', SETTINGS['temp0.7'], 'far', tree=WIDE,
                    candidates='iid', draft_cls=IidLabeledWor, extra_tokens=1)
  assert p > 1e-3, p


@struct.dataclass
class WorLabeledIid(tree_lib.TreeModelDraft):
  """(c) Candidates drawn without replacement but reported as i.i.d. draws from q."""

  def propose_tree(self, cache, seq_BxN, lengths_B, keys_B, shape, sampling):
    return relabel(super().propose_tree(cache, seq_BxN, lengths_B, keys_B, shape, sampling),
                   shape, 'iid')


CONTROLS = {
    'stale_residual': dict(verifier=STALE_RESIDUAL),
    'wor_verified_as_iid': dict(draft_cls=WorLabeledIid, extra_tokens=2),
}


@pytest.mark.parametrize('name', list(CONTROLS))
def test_tree_negative_controls_are_detected(name):
  p, _ = law_pvalue(f'control:{name}', SETTINGS['temp0.7'], 'far', tree=WIDE, **CONTROLS[name])
  assert p < 1e-6, (name, p)


# ----------------------------------------------------------------------------- the runner


def test_runner_sweeps_trees_beside_gammas(tmp_path, monkeypatch):
  import os
  import sys
  from specjax import testing
  from specjax.data import bible_tokenizer
  from specjax.errors import ConfigError
  from specjax.runner import config as config_lib
  from specjax.runner import experiment
  from specjax.runner import metrics
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from configs import tiny  # pylint: disable=import-outside-toplevel

  monkeypatch.setattr(metrics, 'measure_c', lambda *a, **k: 0.25)  # timing is not tested here
  testing.write_random_pair(tmp_path / 'pair', bible_tokenizer())
  c = tiny.get_config('smoke')
  c.target, c.drafts = str(tmp_path / 'pair' / 'target'), (str(tmp_path / 'pair' / 'draft'),)
  c.output_dir, c.compilation_cache = str(tmp_path / 'out'), ''
  c.temperatures, c.gammas, c.num_examples, c.batch_size, c.max_new_tokens = (0.0,), (2,), 2, 2, 8
  c.trees, c.repeats = '((2,1),)', 1
  with pytest.raises(ConfigError, match='config.trees'):
    config_lib.run_spec(c.to_dict() | {'trees': '((2,0),)'})
  rows = experiment.run(config_lib.run_spec(c))
  assert sorted((r.get('tree', ''), r['gamma']) for r in rows) == [('', 2), ('(2,1)', 2)]
  tree_row = next(r for r in rows if r.get('tree'))
  assert tree_row['identical_to_baseline'] and tree_row['nodes_per_target_call'] == 4
  assert tree_row['tokens_per_target_call'] >= 1
