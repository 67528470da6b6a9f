"""Dynamic trees (specjax.decoding.dynamic_tree): the chosen nodes, the per-row tree block, the law.

Shapes: B rows, V vocab, Mt template nodes, M the budget, M1 = M + 1.

Law tests reuse tests/test_tree.py's setup (a V = 12 target, 'near' and 'far' model drafts,
20,000 copies of one prompt, chi-square of the first three tokens against the enumerated law) and
tests/test_feature_head.py's for the head. The negative control is EAGLE-2's own rerank ('path':
a node is kept for its own token's probability), which the exactness argument says is biased.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import test_feature_head as fh
import test_head_modes as hm
import test_tree as tt
from specjax.decoding import dynamic_tree as dyn
from specjax.decoding import loop
from specjax.decoding.shapes import DynamicTree, TreeShape, parse_tree, parse_trees
from specjax.models import t5 as t5_lib

TEMPLATE = TreeShape((3, 2, 1))  # 3 + 6 + 6 = 15 nodes


# ----------------------------------------------------------------------------- spelling


def test_dynamic_tree_spelling_and_errors():
  shape = parse_tree('dynamic:4,3,2,1')
  assert shape == DynamicTree(4, TEMPLATE) and str(shape) == 'dynamic:4,3,2,1'
  assert (shape.depth, shape.nodes, shape.branching) == (3, 4, (3, 2, 1))
  assert parse_trees("('dynamic:4,3,2,1', (2, 2))") == (shape, TreeShape((2, 2)))
  assert parse_trees('dynamic:4,3,2,1; (2,2);') == (shape, TreeShape((2, 2)))
  with pytest.raises(ValueError, match='at least one tree'):
    parse_trees(';')
  with pytest.raises(ValueError, match='budget must be an integer in 1 .. 15'):
    parse_tree('dynamic:16,3,2,1')
  with pytest.raises(ValueError, match='a budget and a template'):
    parse_tree('dynamic:4')
  with pytest.raises(ValueError, match='score must be one of'):
    DynamicTree(4, TEMPLATE, score='eagle')
  reach = parse_tree('dynamic:4,3,2,1:reach=0.25')
  assert reach == DynamicTree(4, TEMPLATE, 'reach', 0.25) and str(reach) == 'dynamic:4,3,2,1:reach=0.25'
  assert parse_tree('dynamic:4,3,2,1:path').score == 'path' and parse_tree(str(reach)) == reach
  assert parse_tree('dynamic:4,3,2,1:mass') == shape
  with pytest.raises(ValueError, match=r'power \(reach=LAMBDA\) must be in \(0, 1\], got 0.0'):
    parse_tree('dynamic:4,3,2,1:reach=0')
  with pytest.raises(ValueError, match="power applies to score 'reach' only, got score 'mass'"):
    DynamicTree(8, TreeShape((2, 1, 1, 1, 1)), 'mass', 0.5)
  with pytest.raises(ValueError, match='expected reach=LAMBDA'):
    parse_tree('dynamic:4,3,2,1:reach=x')
  with pytest.raises(ValueError, match='only reach takes a value'):
    parse_tree('dynamic:4,3,2,1:mass=2')


# ----------------------------------------------------------------------------- the choice


def random_template_proposal(seed, greedy, v=7, b=64):
  """Template tokens drawn without replacement from random laws, their q_i and confidences."""
  from specjax.decoding import candidates
  from specjax.decoding.sampling import Sampling
  rng = jax.random.PRNGKey(seed)
  sampling = Sampling(temperature=0.0 if greedy else 1.0)
  tokens, qs, confs = [jnp.zeros((b, 1), jnp.int32)], [], []
  for d, br in enumerate(TEMPLATE.branching):
    k = TEMPLATE.level_size[d]
    logits = 2.0 * jax.random.normal(jax.random.fold_in(rng, d), (b, k, v))
    keys = jax.random.split(jax.random.fold_in(rng, 100 + d), b)
    tok, q = candidates.draw_children(logits, keys, br, sampling, 'wor')
    tokens.append(tok.reshape(b, -1))
    qs.append(q.reshape(b, k * br, v))
    confs.append(candidates.confidence(logits, tok).reshape(b, -1))
  return (jnp.concatenate(tokens, 1), jnp.concatenate(qs, 1), jnp.concatenate(confs, 1))


def closed(sel_BxM1, template):
  """Whether every row's chosen set holds each chosen node's parent and earlier siblings."""
  parent = template.parent()
  ok = True
  for row in np.asarray(sel_BxM1):
    s = set(row.tolist())
    for j in row[1:]:
      ok &= parent[j] in s
      ok &= all(i in s for i in range(j) if parent[i] == parent[j])
  return bool(ok)


@pytest.mark.parametrize('score', ['mass', 'reach=0.2', 'reach=1'])
@pytest.mark.parametrize('greedy', [False, True])
def test_exact_choices_are_closed_under_parents_and_earlier_siblings(greedy, score):
  tokens, q, conf = random_template_proposal(0, greedy)
  name, _, power = score.partition('=')
  scores = dyn.inclusion_scores(tokens, q, conf, TEMPLATE, greedy, name, float(power or 1))
  for budget in range(1, TEMPLATE.nodes + 1):
    sel = dyn.choose(scores, budget)
    assert sel.shape == (tokens.shape[0], budget + 1)
    assert closed(sel, TEMPLATE), budget
  if not greedy:  # sampled siblings come in no order of q: 'path' (a node kept for its own
    # probability) then breaks the closure, the control's bias. (Greedy siblings are the top-b,
    # in order: there 'path' is closed too, and every choice is exact.)
    path = dyn.inclusion_scores(tokens, q, conf, TEMPLATE, greedy, 'path')
    assert not all(closed(dyn.choose(path, m), TEMPLATE) for m in range(2, 8))


def test_mass_scores_by_hand():
  """One row, template (2,): R_1 = 1, R_2 = 1 - q(x_1); I = R (the root's P is 1)."""
  shape = TreeShape((2, 1))
  tokens = jnp.array([[0, 1, 2, 0, 0]])
  q = jnp.zeros((1, 4, 3))
  q = q.at[0, 0].set(jnp.array([0.2, 0.7, 0.1]))   # x_1 = 1 drawn from q
  q = q.at[0, 1].set(jnp.array([2 / 3, 0.0, 1 / 3]))  # x_2 = 2 from q without x_1
  q = q.at[0, 2, 0].set(1.0).at[0, 3, 0].set(1.0)   # the children below: token 0, q = 1
  s = dyn.inclusion_scores(tokens, q, None, shape, False, 'mass')
  np.testing.assert_allclose(s[0], [1.0, 0.3, 0.7, 0.1], rtol=1e-6)
  p = dyn.inclusion_scores(tokens, q, None, shape, False, 'path')
  np.testing.assert_allclose(p[0], [0.7, 0.1, 0.7, 0.1], rtol=1e-6)
  # reach: h = q(x)^0.5; the root's children are tested with 1 and 1 - h(x_1); a child below
  # with its parent's reach times h(parent).
  h1, h2 = 0.7 ** 0.5, 0.1 ** 0.5
  r = dyn.inclusion_scores(tokens, q, None, shape, False, 'reach', 0.5)
  np.testing.assert_allclose(r[0], [1.0, 1 - h1, h1, (1 - h1) * h2], rtol=1e-6)


# ----------------------------------------------------------------------------- the block


def test_per_row_tree_block_equals_the_template_block_at_the_chosen_nodes():
  """Each row's chosen subtree through t5.decode_tree (depth [B, M1], ancestors [B, M1, M1]) gives
  the logits the whole template gives at those nodes: a node sees only its ancestors."""
  target = tt.models()[0]
  b, mt1 = 4, TEMPLATE.nodes + 1
  ids = np.repeat(tt.PROMPT, b, axis=0)
  cache = target.init_cache(ids, 8 + mt1)
  lengths = jnp.array([0, 1, 2, 3], jnp.int32)
  prefix = jnp.asarray(np.random.RandomState(0).randint(1, 12, (b, 3)), jnp.int32)
  cache_p = target.decode(cache, prefix, jnp.zeros((b,), jnp.int32))[1]
  tokens = jnp.asarray(np.random.RandomState(1).randint(1, 12, (b, mt1)), jnp.int32)
  full, _ = target.decode_tree(cache_p, tokens, lengths, TEMPLATE.depth_of(), TEMPLATE.ancestors())
  scores = jnp.asarray(np.random.RandomState(2).rand(b, mt1 - 1), jnp.float32)
  sel = dyn.choose(dyn.inclusion_scores(tokens, jnp.ones((b, mt1 - 1, 12)) / 12, scores,
                                        TEMPLATE, True), 6)
  depth, anc = dyn.chosen_structure(sel, TEMPLATE)
  part, _ = target.decode_tree(cache_p, jnp.take_along_axis(tokens, sel, 1), lengths, depth, anc)
  np.testing.assert_allclose(part, jnp.take_along_axis(full, sel[:, :, None], 1), atol=2e-5)
  assert not np.array_equal(np.asarray(sel), np.broadcast_to(np.asarray(sel[:1]), sel.shape))


# ----------------------------------------------------------------------------- greedy


def test_greedy_dynamic_tree_is_token_identical_with_a_model_draft():
  target, draft = tt.models()[0], tt.drafts()['near']
  rng = np.random.RandomState(3)
  ids = rng.randint(2, 12, (6, 5)).astype(np.int32)
  base = loop.autoregressive_decode(target, ids, max_new_tokens=12, eos_id=-1)
  for tree in ('dynamic:4,3,2,1', 'dynamic:1,2,2', 'dynamic:7,2,2,2', 'dynamic:5,2,1,1:reach=0.2'):
    out = loop.speculative_decode(target, draft, ids, tree=tree, max_new_tokens=12, eos_id=-1)
    np.testing.assert_array_equal(out.tokens, base.tokens, err_msg=tree)
    assert float(out.stats.nodes_per_target_call) == parse_tree(tree).budget


def test_greedy_dynamic_tree_is_token_identical_with_the_head():
  target, head, ids, eos, base = hm.greedy_case()
  out = loop.speculative_decode(target, head, ids, max_new_tokens=14, eos_id=eos,
                                tree='dynamic:5,3,2,1')
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  hist = np.asarray(out.stats.accepted_hist).sum(0)
  assert hist[0] > 0 and hist[1:].sum() > 0, hist


def test_greedy_dynamic_tree_control_is_detected():
  # Control: the same comparison with the tree rule that accepts the first children blindly.
  target, head, ids, eos, base = hm.greedy_case()
  out = loop.speculative_decode(target, head, ids, max_new_tokens=14, eos_id=eos,
                                tree='dynamic:5,3,2,1',
                                verifier=hm.BROKEN['tree (3,2,1)'])
  assert not np.array_equal(out.tokens, base.tokens)


# ----------------------------------------------------------------------------- the law


LAW = {'near/T1/(3,2,1):4': ('near', 'temp1', DynamicTree(4, TEMPLATE)),
       'far/T0.7/(3,2,1):4': ('far', 'temp0.7', DynamicTree(4, TEMPLATE)),
       'near/T1/(4,1,1):5': ('near', 'temp1', DynamicTree(5, TreeShape((4, 1, 1)))),
       'near/T1/(3,2,1):4:reach=0.2': ('near', 'temp1', DynamicTree(4, TEMPLATE, 'reach', 0.2)),
       'far/T0.7/(3,2,1):4:reach=0.2': ('far', 'temp0.7',
                                        DynamicTree(4, TEMPLATE, 'reach', 0.2))}


@pytest.mark.parametrize('name', list(LAW))
def test_dynamic_tree_follows_target_law(name):
  draft, setting, shape = LAW[name]
  p, stats = tt.law_pvalue(f'dynamic {name}', tt.SETTINGS[setting], draft, tree=shape)
  hist = np.asarray(stats.accepted_hist).sum(0)
  print(f'dynamic {name}: p = {p:.3g}, accepted path lengths {hist}')
  assert hist[:3].min() > 200, hist
  assert p > 1e-3, (name, p)


@pytest.mark.parametrize('setting,score', [('temp1', 'mass'), ('temp0.7', 'mass'),
                                           ('temp1', 'reach')])
def test_dynamic_tree_with_the_head_follows_target_law(setting, score):
  tree = DynamicTree(4, TEMPLATE, score, 0.2 if score == 'reach' else 1.0)
  p, stats = fh.law_pvalue(tt.SETTINGS[setting], gamma=None, tree=tree)
  print(f'head dynamic tree {setting}: p = {p:.3g}, alpha {stats.alpha:.3f}')
  assert p > 1e-3, p


def test_eagle2_path_rerank_is_detected():
  # Control: rank by the node's own path probability (EAGLE-2): it reads x_j before deciding
  # whether x_j is verified.
  p, _ = tt.law_pvalue('control:path', tt.SETTINGS['temp1'], 'far',
                       tree=DynamicTree(3, TreeShape((4, 1, 1)), score='path'))
  print(f'control path rerank: p = {p:.3g}')
  assert p < 1e-6, p
