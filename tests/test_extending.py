"""docs/extending.md's "Extend it in a few lines": every block runs as written and does what it says.

Shapes: B = 4 prompts, M = 16 new tokens, V vocab.

Each block registers one extension (a draft, a stop rule, a verifier, a tree shape) and decodes
with it by name. Greedy blocks must give autoregressive decoding's tokens; the verifier, which
spells Algorithm 1 out from acceptance's parts, must draw exactly the built-in 'token' rule's
tokens at T = 1 (same keys). Control: the verifier block with the residual replaced by p (a
broken rule) must fail that same check.
"""

import functools
import pathlib
import re

import numpy as np
import pytest

from specjax import testing
from specjax.decoding import loop, registry

ROOT = pathlib.Path(__file__).resolve().parents[1]
KINDS = ('repeat_last', 'cap', 'spelled_out', 'binary')


def blocks() -> list[str]:
  text = (ROOT / 'docs' / 'extending.md').read_text()
  section = text.split('## Extend it in a few lines', 1)[1].split('\n## ', 1)[0]
  return re.findall(r'```python\n(.*?)```', section, re.S)


@functools.lru_cache(maxsize=None)
def pair():
  target, draft = testing.spread_pair()
  ids = np.random.RandomState(0).randint(2, 64, (4, 6)).astype(np.int32)
  ids[1, 3:] = 0
  return target, draft, ids


@pytest.fixture
def clean_registries():
  """The registries as they were before the test (the blocks add to them)."""
  saved = [(r, dict(r)) for r in (registry.DRAFTS, registry.STOP_RULES, registry.VERIFIERS,
                                  registry.TREE_SHAPES)]
  yield
  for r, before in saved:
    r.clear()
    r.update(before)


def run_block(code: str):
  target, draft, ids = pair()
  namespace = {'target': target, 'draft': draft, 'ids': ids}
  exec(compile(code, 'docs/extending.md', 'exec'), namespace)  # pylint: disable=exec-used
  return namespace['out']


def test_four_blocks_of_at_most_15_lines():
  found = blocks()
  assert len(found) == 4
  for code, name in zip(found, KINDS):
    assert f"register('{name}')" in code
    body = [line for line in code.splitlines()
            if line.strip() and not line.startswith(('import ', 'from '))]
    assert len(body) <= 15, (name, len(body))


@pytest.mark.parametrize('index', [0, 1, 3], ids=['draft', 'stop rule', 'tree shape'])
def test_greedy_block_gives_greedy_tokens(index, clean_registries):
  target, _, ids = pair()
  out = run_block(blocks()[index])
  ref = loop.autoregressive_decode(target, ids, max_new_tokens=16)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  assert KINDS[index] in {**registry.DRAFTS, **registry.STOP_RULES, **registry.TREE_SHAPES}
  if index == 1:  # the cap acts: no row proposes more than 2 drafts
    assert np.asarray(out.stats.proposed_hist).sum(0)[3:].sum() == 0


def test_verifier_block_draws_the_token_rules_tokens(clean_registries):
  target, draft, ids = pair()
  out = run_block(blocks()[2])
  ref = loop.speculative_decode(target, draft, ids, gamma=4, max_new_tokens=16, temperature=1.0)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  assert np.asarray(out.stats.accepted_hist).sum(0)[0] > 0  # rejections: the residual was drawn


def test_verifier_block_control_without_the_residual_differs(clean_registries):
  # Control: the same block with the residual replaced by p itself draws other tokens.
  target, draft, ids = pair()
  broken = blocks()[2].replace("'spelled_out'", "'no_residual'").replace(
      'acceptance.residual(p_G1xV[m], q_V)', 'p_G1xV[m]')
  out = run_block(broken)
  ref = loop.speculative_decode(target, draft, ids, gamma=4, max_new_tokens=16, temperature=1.0)
  assert not np.array_equal(out.tokens, ref.tokens)
