"""speculative_decode's settings: one SpecOptions at one boundary, each field one type, one-line
errors naming the field before anything compiles, and the deprecated spellings still working.

Shapes: B = 3 prompts, M new tokens, V vocab.
"""

import functools
import warnings

import jax
import numpy as np
import pytest

from specjax import stopping, testing
from specjax.decoding import acceptance, loop
from specjax.decoding.auto import Auto
from specjax.decoding.options import SpecOptions
from specjax.decoding.shapes import TreeShape, Wide


@functools.lru_cache(maxsize=None)
def pair():
  target, draft = testing.spread_pair()
  ids = np.random.RandomState(0).randint(2, 64, (3, 5)).astype(np.int32)
  return target, draft, ids


def test_keywords_become_typed_fields():
  opts = SpecOptions.from_kwargs(gamma=np.int64(4), max_new_tokens=8, temperature=1,
                                 stop='confidence:0.4', verifier='block')
  assert opts.gamma == 4 and type(opts.gamma) is int  # pylint: disable=unidiomatic-typecheck
  assert opts.sampling.temperature == 1.0 and opts.stop == stopping.Confidence(0.4)
  assert isinstance(opts.verifier, acceptance.BlockVerifier) and opts.auto is None
  auto = SpecOptions.from_kwargs(gamma='auto:3', max_new_tokens=8)
  assert auto.auto == Auto(g_max=3) and auto.gamma == 3 and auto.queued
  tree = SpecOptions.from_kwargs(tree='wide:3,2', max_new_tokens=8)
  assert tree.tree == Wide(3, 2) and tree.tree.branching == (3, 1) and tree.width == 2
  assert hash(opts) == hash(SpecOptions.from_kwargs(gamma=4, max_new_tokens=8, temperature=1.0,
                                                    stop=stopping.Confidence(0.4),
                                                    verifier=acceptance.BlockVerifier()))


@pytest.mark.parametrize('kw,message', [
    (dict(gamma=4, max_new_tokens=8, temprature=1.0), "unknown argument 'temprature'; did you mean"),
    (dict(gamma=0, max_new_tokens=8), 'gamma must be an integer >= 1'),
    (dict(gamma=4, max_new_tokens=0), 'max_new_tokens must be an integer >= 1'),
    (dict(max_new_tokens=8), 'gamma is required'),
    (dict(gamma='often', max_new_tokens=8), "gamma 'often'"),
    (dict(gamma=2.5, max_new_tokens=8), "gamma 2.5"),
    (dict(gamma=4, max_new_tokens=8, slots=0), 'slots must be an integer >= 1'),
    (dict(gamma=4, max_new_tokens=8, verifier='blok'), "verifier 'blok' unknown; did you mean"),
    (dict(gamma=4, max_new_tokens=8, stop='confident:0.4'), "stop rule 'confident' unknown"),
    (dict(tree=(2, 2), max_new_tokens=8, verifier='block'), 'has no tree form'),
    (dict(tree=(2, 2), max_new_tokens=8, slots=4), 'does not combine with slots'),
    (dict(tree=(2, 2), max_new_tokens=8, stop='confidence:0.3'), 'does not take trace or stop'),
    (dict(tree='wide:x', max_new_tokens=8), "tree 'wide:x'"),
    (dict(tree='bushy:3', max_new_tokens=8), "tree shape 'bushy' unknown"),
    (dict(gamma=4, max_new_tokens=8, trace=True, slots=2), 'trace=True does not combine'),
    (dict(gamma=4, max_new_tokens=8, temperature=-1.0), 'Sampling.temperature'),
])
def test_bad_settings_are_one_line_errors_naming_the_field(kw, message):
  target, draft, ids = pair()
  with pytest.raises(ValueError, match=message.replace('(', r'\(')) as e:
    loop.speculative_decode(target, draft, ids, **kw)
  assert '\n' not in str(e.value)


def test_options_object_and_keywords_agree():
  target, draft, ids = pair()
  kw = dict(gamma=3, max_new_tokens=8, temperature=1.0)
  by_kw = loop.speculative_decode(target, draft, ids, rng=5, **kw)
  by_opts = loop.speculative_decode(target, draft, ids, SpecOptions.from_kwargs(**kw), rng=5)
  np.testing.assert_array_equal(by_kw.tokens, by_opts.tokens)
  with pytest.raises(ValueError, match='not both'):
    loop.speculative_decode(target, draft, ids, SpecOptions.from_kwargs(**kw), gamma=3)


def always_accept(key, draft_tokens_G, q_GxV, p_G1xV, n):
  return n, jax.numpy.argmax(p_G1xV[n]).astype(jax.numpy.int32)


def test_deprecated_spellings_warn_once_and_still_work():
  target, draft, ids = pair()
  with pytest.warns(DeprecationWarning, match='verify_fn'):
    old = loop.speculative_decode(target, draft, ids, gamma=3, max_new_tokens=8,
                                  verify_fn=always_accept)
  new = loop.speculative_decode(target, draft, ids, gamma=3, max_new_tokens=8,
                                verifier=acceptance.FunctionVerifier(always_accept))
  np.testing.assert_array_equal(old.tokens, new.tokens)
  assert int(np.sum(old.stats.accepted)) == int(np.sum(old.stats.proposed))  # it ran, greedy too
  auto = Auto(g_max=2, costs=((1.0, 1.5, 2.0), 0.1))
  with pytest.warns(DeprecationWarning, match='auto=Auto'):
    old = loop.speculative_decode(target, draft, ids, gamma=auto, max_new_tokens=8, slots=2)
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    new = loop.speculative_decode(target, draft, ids, auto=auto, max_new_tokens=8, slots=2)
  np.testing.assert_array_equal(old.tokens, new.tokens)


def test_tree_shapes_equal_by_branching_and_kind():
  assert TreeShape((3, 1)) == TreeShape((3, 1)) and Wide(3, 2) != TreeShape((3, 1))
  assert str(Wide(4, 3)) == '(4,1,1)'
