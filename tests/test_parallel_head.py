"""The feature head's parallel mode (FeatureHeadDraft parallel=True, HeadConfig.parallel_depth):
one head pass drafts the whole block.

Shapes: N rows, V vocab, M = 3 generated tokens.

Draft 1 of a parallel block is the sequential mode's draft 1 (the same window pass, the same q);
drafts 2 .. gamma read the parallel blocks' states, so q_k depends on the verified prefix only and
the block is drafted in one pass. Greedy output is token-identical to autoregressive decoding (on
XLA and on the CPU kernels); the joint law of the first three tokens matches the target's at
T = 1 and 0.7 (chi-square, N = 20,000 rows), and two controls are rejected with the same head:
always accepting, and drafting every token of a block with one shared uniform (tokens of a block
dependent, so the drafts do not follow the q they report). Bad options are one-line errors
before anything compiles; heads without parallel blocks load as before.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from chi2 import chi2_pvalue  # tests/chi2.py
from specjax.decoding import loop
from specjax.decoding import stopping
from specjax.decoding.feature_head import FeatureHeadDraft
from specjax.decoding.sampling import Sampling
from specjax.models import cpu_kernels
from specjax.models import head as head_lib
from test_feature_head import (ALWAYS_ACCEPT, M, N, PROMPT, SEED, _greedy_pair, _head, _target,
                               counts_of, exact_law, reused_step_noise)

DEPTH = 2  # parallel blocks: drafts 2 and 3 of a block


MODES = [False, True]  # parallel_tokens: Medusa-style blocks on z, or a chain through the drafts


@functools.lru_cache(maxsize=None)
def law_pair(tokens):
  target = _target()
  return target, _head(target, parallel=True, parallel_depth=DEPTH, parallel_ff=8,
                       parallel_tokens=tokens)


@functools.lru_cache(maxsize=None)
def greedy_pair(tokens=False):
  target, _ = _greedy_pair()
  return target, _head(target, seed=4, scale=2.0, parallel=True, parallel_depth=3,
                       parallel_ff=8, parallel_tokens=tokens)


@struct.dataclass
class ReusedNoiseParallelHead(FeatureHeadDraft):
  """Control: a parallel head of its own class (its own programs), run with one uniform for every
  draft of a block (`reused_step_noise`)."""


def _with_class(cls, draft):
  return cls(**{f: getattr(draft, f) for f in ('params', 'target_embed_VxDf', 'config',
                                               'candidates', 'packed', 'slot_V', 'parallel')})


@pytest.mark.parametrize('tokens', MODES)
def test_parallel_block_is_one_pass_with_the_sequential_first_draft(tokens):
  target, par = law_pair(tokens)
  seq = par.replace(parallel=False)
  ids = jnp.asarray(np.repeat(PROMPT, 4, axis=0))
  state = jax.jit(lambda i: par.init(i, 8, target_cache=target.init_cache(i, 8)))(ids)
  seq_BxN = jnp.zeros((4, 9), jnp.int32).at[:, 1].set(jnp.array([3, 5, 7, 2]))
  lengths = jnp.array([0, 1, 1, 1], jnp.int32)
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  sampling = Sampling(temperature=1.0)

  def propose(draft):
    return jax.jit(lambda s: draft.propose(s, seq_BxN, lengths, keys, 3, sampling,
                                           stop=stopping.Fixed(), limit_B=jnp.full((4,), 3)))(
                                               state)

  a, b = propose(par), propose(seq)
  assert int(a.passes) == 1 and int(b.passes) == 3
  np.testing.assert_allclose(np.asarray(a.q_BxGxV[:, 0]), np.asarray(b.q_BxGxV[:, 0]),
                             rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(np.asarray(a.tokens_BxG[:, 0]), np.asarray(b.tokens_BxG[:, 0]))
  np.testing.assert_array_equal(np.asarray(a.n_B), 3)
  # q_k is the output layer on the k-th parallel state of the window's last position (with
  # parallel_tokens, the chain through the drafts the proposal drew).
  z, _ = jax.jit(lambda s: par.window_state(s, seq_BxN, lengths, 3))(state)
  states = [z]
  for k in range(2):
    states.append(head_lib.parallel_step(par.params, par.config, states[-1], z, k,
                                         par.target_embed_VxDf[a.tokens_BxG[:, k]]))
  _, logits = head_lib.outputs(par.params, par.config, jnp.stack(states, 1))
  np.testing.assert_allclose(np.asarray(a.q_BxGxV), np.asarray(jax.nn.softmax(logits, -1)),
                             rtol=1e-5, atol=1e-6)
  if not tokens:
    np.testing.assert_allclose(
        np.asarray(jnp.stack(states, 1)),
        np.asarray(head_lib.parallel_states(par.params, par.config, z, 3)), rtol=1e-6)
  # The blocks matter: drafts 2 and 3 are not drafted from draft 1's law.
  assert float(jnp.max(jnp.abs(a.q_BxGxV[:, 1] - a.q_BxGxV[:, 0]))) > 1e-2
  # The head's cache holds the window's entries (true features) up to each row's length, as
  # the sequential mode's (beyond it the next window rewrites whatever either wrote).
  for row, length in enumerate(np.asarray(lengths)):
    np.testing.assert_array_equal(np.asarray(a.state.cache.self_k[row, :, :length + 1]),
                                  np.asarray(b.state.cache.self_k[row, :, :length + 1]))


def _greedy_identical(target, head):
  ids = np.random.RandomState(0).randint(2, 48, (3, 9)).astype(np.int32)
  ids[1, 6:] = 0
  base = loop.autoregressive_decode(target, ids, max_new_tokens=14)
  for gamma in (1, 2, 4):
    out = loop.speculative_decode(target, head, ids, max_new_tokens=14, gamma=gamma)
    np.testing.assert_array_equal(out.tokens, base.tokens, err_msg=f'gamma={gamma}')
  out = loop.speculative_decode(target, head, ids, max_new_tokens=14, gamma=4,
                                stop=stopping.Confidence(0.3))
  np.testing.assert_array_equal(out.tokens, base.tokens, err_msg='confidence stop')


@pytest.mark.parametrize('tokens', MODES)
def test_parallel_head_greedy_identical(tokens):
  _greedy_identical(*greedy_pair(tokens))


@pytest.mark.skipif(not cpu_kernels.available(), reason=cpu_kernels.status())
@pytest.mark.parametrize('tokens', MODES)
def test_parallel_head_on_the_kernels(tokens):
  target, head = greedy_pair(tokens)
  target = target.pack()
  head = FeatureHeadDraft.for_target(target, (head.params, head.config), parallel=True)
  assert head.packed is not None and head.parallel
  _greedy_identical(target, head)


@functools.lru_cache(maxsize=None)
def law_pvalue(temperature, tokens, verifier='token', draft_cls=None):
  target, draft = law_pair(tokens)
  if draft_cls is not None:
    draft = _with_class(draft_cls, draft)
  out = loop.speculative_decode(target, draft, np.repeat(PROMPT, N, axis=0), gamma=DEPTH + 1,
                                max_new_tokens=M, temperature=temperature,
                                rng=jax.random.PRNGKey(SEED), eos_id=-1, verifier=verifier)
  assert (np.asarray(out.lengths) == M).all()
  hist = np.asarray(jax.device_get(out.stats.accepted_hist)).sum(0)
  return chi2_pvalue(counts_of(out.tokens), exact_law(Sampling(temperature=temperature))), hist


@pytest.mark.parametrize('tokens', MODES)
@pytest.mark.parametrize('temperature', [1.0, 0.7])
def test_parallel_head_follows_target_law(temperature, tokens):
  p, hist = law_pvalue(temperature, tokens)
  print(f'parallel head (tokens {tokens}) T={temperature}: chi-square p = {p:.3g}, accepted '
        f'hist {hist}')
  assert hist[:3].min() > 1000, hist  # rejections at every draft, full acceptances
  assert p > 1e-3


@pytest.mark.parametrize('tokens', MODES)
def test_parallel_head_law_controls_are_rejected(tokens):
  p, _ = law_pvalue(1.0, tokens, ALWAYS_ACCEPT)
  print(f'parallel head (tokens {tokens}), always-accept control: chi-square p = {p:.3g}')
  assert p < 1e-6
  with reused_step_noise():
    p, _ = law_pvalue(1.0, tokens, draft_cls=ReusedNoiseParallelHead)
  print(f'parallel head (tokens {tokens}), one uniform per block control: chi-square p = '
        f'{p:.3g}')
  assert p < 1e-6


def test_parallel_options_are_one_line_errors(tmp_path):
  target, head = greedy_pair(True)
  plain = _head(target, seed=4)
  assert 'par_in' not in plain.params and plain.config.parallel_depth == 0
  with pytest.raises(ValueError, match='parallel=1 needs a head trained with parallel') as e:
    FeatureHeadDraft.for_target(target, (plain.params, plain.config), parallel=True)
  assert '\n' not in str(e.value)
  ids = np.random.RandomState(0).randint(2, 48, (2, 6)).astype(np.int32)
  with pytest.raises(ValueError, match='gamma=5 exceeds the 4 drafts') as e:
    loop.speculative_decode(target, head, ids, max_new_tokens=6, gamma=5)
  with pytest.raises(ValueError, match='drafts chains'):
    loop.speculative_decode(target, head, ids, max_new_tokens=6, tree=(2, 1))
  # Saved and loaded with its blocks; a head file without them still loads as a plain head.
  head_lib.save_head(head.params, head.config, tmp_path / 'par')
  params, config = head_lib.load_head(tmp_path / 'par')
  assert config.parallel_depth == 3 and config.parallel_tokens
  assert params['par_in'].shape == (3, 8 + target.config.d_model, 8)
  head_lib.save_head(plain.params, plain.config, tmp_path / 'old')
  cfg_file = tmp_path / 'old' / head_lib.CONFIG_NAME
  text = cfg_file.read_text()
  for field in ('"parallel_depth": 0', '"parallel_ff": 256', '"parallel_tokens": false'):
    text = text.replace(f'  {field},\n', '')  # as written before the parallel mode
  cfg_file.write_text(text)
  assert 'parallel' not in cfg_file.read_text()
  params, config = head_lib.load_head(tmp_path / 'old')
  assert config == plain.config and 'par_in' not in params


def test_runner_parallel_option(tmp_path):
  from specjax.errors import ConfigError  # pylint: disable=import-outside-toplevel
  from specjax.runner import config as config_lib  # pylint: disable=import-outside-toplevel
  from specjax.runner import drafts  # pylint: disable=import-outside-toplevel
  target, head = greedy_pair(True)
  d, plain = str(tmp_path / 'par'), str(tmp_path / 'plain')
  head_lib.save_head(head.params, head.config, d)
  head_lib.save_head(_head(target, seed=4).params, _head(target, seed=4).config, plain)
  assert drafts.head_spec(d + ':parallel=1') == (d, {'parallel': 1})
  config_lib.check_head('drafts[0]', d + ':parallel=1', (1, 3, 4))
  built = drafts.build(None, d + ':parallel=1', target, None, 'task')
  assert isinstance(built, FeatureHeadDraft) and built.parallel
  assert not drafts.build(None, d, target, None, 'task').parallel
  from specjax.runner import report  # pylint: disable=import-outside-toplevel
  assert report.describe(d + ':parallel=1').endswith('M, parallel')
  assert not report.describe(d).endswith('parallel')
  with pytest.raises(ValueError, match='parallel=.2. .*1 or left out'):
    drafts.head_spec(d + ':parallel=2')
  for name, gammas, trees, match in (
      (plain, (3,), '', r'config.drafts\[0\]: parallel=1 needs a head trained with parallel'),
      (d, (3, 5), '', r'config.gammas: 5 exceeds the 4 drafts one pass'),
      (d, (3,), '(2,1)', r'config.trees: .*parallel=1 drafts chains only')):
    with pytest.raises(ConfigError, match=match) as e:
      config_lib.check_head('drafts[0]', name + ':parallel=1', gammas, trees)
    assert '\n' not in str(e.value)
