"""Token-tree shapes: static topologies that tree decoding verifies in one target call.

Shape legend: D depth, D1 = D + 1, M nodes below the root, M1 = M + 1 (with the root).

A shape is its branching per depth: `TreeShape((3, 2, 1))` gives the root 3 children, each of
them 2, each of those 1. Nodes are numbered depth by depth (node 0 the root = the last committed
token); the children of node j at depth d, the i-th of its level, are the nodes
level_start[d+1] + i * b_{d+1} + c, c < b_{d+1}. The depth D plays the role of gamma. A shape is
hashable (a static argument of jit): one compiled program per shape.

Shape kinds (registry TREE_SHAPES) are subclasses that compute their branching from a few numbers
and are spelled 'name:args' ('wide:4,3' = (4, 1, 1)); a plain tuple '(3,2,1)' is a TreeShape.
'dynamic:8,4,2,1' is a DynamicTree: 8 nodes per row chosen per iteration from the template
(4, 2, 1).
"""

from __future__ import annotations

import ast
import dataclasses

import numpy as np

from specjax.decoding.registry import TREE_SHAPES

register = TREE_SHAPES.register


@dataclasses.dataclass(frozen=True)
class TreeShape:
  """A static tree given by its branching per depth (hashable: a jit static argument)."""
  branching: tuple[int, ...]

  def __post_init__(self):
    b = self.branching
    if (not isinstance(b, tuple) or not b
        or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 1
                   for x in b)):
      raise ValueError(f'tree must be a non-empty tuple of branching factors >= 1, got {b!r}')
    object.__setattr__(self, 'branching', tuple(int(x) for x in b))

  @classmethod
  def from_spec(cls, arg: str) -> TreeShape:
    """The shape from the text after 'name:' (comma-separated integers by default)."""
    return cls(*(int(x) for x in arg.split(',')))

  @property
  def depth(self) -> int:
    return len(self.branching)

  @property
  def level_size(self) -> tuple[int, ...]:
    """Nodes per depth 0 .. D (the root level has 1)."""
    return tuple(int(np.prod(self.branching[:d])) for d in range(self.depth + 1))

  @property
  def level_start(self) -> tuple[int, ...]:
    """Index of the first node of each depth 0 .. D, and the total M1 at the end."""
    return tuple(int(x) for x in np.concatenate([[0], np.cumsum(self.level_size)]))

  @property
  def nodes(self) -> int:
    """M: nodes below the root (the tokens the target verifies per call)."""
    return self.level_start[-1] - 1

  @property
  def internal(self) -> int:
    """P: nodes with children (depth < D), the root included."""
    return self.level_start[self.depth]

  def parent(self) -> np.ndarray:
    """[M1] parent index of every node (-1 for the root)."""
    par = [-1]
    for d, b in enumerate(self.branching):
      par += [self.level_start[d] + i // b for i in range(self.level_size[d + 1])]
    return np.asarray(par, np.int32)

  def first_child(self, d: int, node):
    """Index of the first child of `node` (an index, or an array of indices, at depth d < D)."""
    return self.level_start[d + 1] + (node - self.level_start[d]) * self.branching[d]

  def depth_of(self) -> np.ndarray:
    """[M1] depth of every node."""
    return np.repeat(np.arange(self.depth + 1), self.level_size).astype(np.int32)

  def ancestors(self) -> np.ndarray:
    """[M1, M1] bool: anc[j, i] iff node i is node j or one of its ancestors."""
    par, m1 = self.parent(), self.nodes + 1
    anc = np.eye(m1, dtype=bool)
    for j in range(1, m1):
      anc[j] |= anc[par[j]]
    return anc

  def paths(self) -> np.ndarray:
    """[leaves, D1] the node indices of every root-to-leaf path."""
    anc, depth = self.ancestors(), self.depth_of()
    leaves = range(self.level_start[self.depth], self.nodes + 1)
    return np.asarray([sorted(np.nonzero(anc[j])[0], key=lambda i: depth[i]) for j in leaves],
                      np.int32)

  def __str__(self) -> str:
    return '(' + ','.join(map(str, self.branching)) + ')'


@register('wide')
@dataclasses.dataclass(frozen=True, init=False)
class Wide(TreeShape):
  """'wide:K,D': K candidates for the first token, then one chain below each: (K, 1, .., 1)."""

  def __init__(self, k: int, depth: int):
    super().__init__((int(k),) + (1,) * (int(depth) - 1))


SCORES = ('mass', 'reach', 'path')


@register('dynamic')
@dataclasses.dataclass(frozen=True)
class DynamicTree:
  """'dynamic:M,b1,b2,..[:SCORE]': per row and iteration, the M nodes of the drafted template tree
  (b1, b2, ..) that the draft rates most likely to be accepted (specjax.decoding.dynamic_tree).

  The draft expands the whole template; the target verifies only M + 1 nodes (a compiled block of
  fixed size, its shape chosen per row), so M is the verify budget and the template bounds the
  shapes it can take. `score` (spelled after a second ':'): 'mass' (the default) and
  'reach=LAMBDA' (`power` LAMBDA in (0, 1]: each node's estimated chance of being tested, an
  ancestor's acceptance taken as q(x)^LAMBDA) are exact; 'path' (EAGLE-2's path probability,
  which looks at each node's own token) is biased at temperature > 0 and kept for research and as
  a negative control.
  """
  budget: int
  template: TreeShape
  score: str = 'mass'
  power: float = 1.0

  def __post_init__(self):
    if not isinstance(self.template, TreeShape):
      object.__setattr__(self, 'template', TreeShape(tuple(self.template)))
    if (isinstance(self.budget, bool) or not isinstance(self.budget, (int, np.integer))
        or not 1 <= self.budget <= self.template.nodes):
      raise ValueError(f'dynamic tree budget must be an integer in 1 .. {self.template.nodes} '
                       f'(the template {self.template} has {self.template.nodes} nodes), got '
                       f'{self.budget!r}')
    object.__setattr__(self, 'budget', int(self.budget))
    if self.score not in SCORES:
      raise ValueError(f'dynamic tree score must be one of {SCORES}, got {self.score!r}')
    if (isinstance(self.power, bool) or not isinstance(self.power, (int, float, np.floating))
        or not 0 < self.power <= 1):
      raise ValueError(f'dynamic tree power (reach=LAMBDA) must be in (0, 1], got {self.power!r}')
    object.__setattr__(self, 'power', float(self.power))
    if self.score != 'reach' and self.power != 1.0:  # it would be ignored: say so
      raise ValueError(f"dynamic tree power applies to score 'reach' only, got score "
                       f'{self.score!r} with power {self.power:g}')

  @classmethod
  def from_spec(cls, arg: str) -> DynamicTree:
    """'M,b1,b2,..' (the budget, then the template's branching), then optionally ':mass',
    ':path' or ':reach=LAMBDA'."""
    arg, _, score = arg.partition(':')
    nums = [int(x) for x in arg.split(',')]
    if len(nums) < 2:
      raise ValueError('expected dynamic:BUDGET,b1,b2,.. (a budget and a template)')
    name, _, power = score.strip().partition('=')
    if name == 'reach':
      try:
        return cls(nums[0], TreeShape(tuple(nums[1:])), 'reach', float(power))
      except ValueError as e:
        if 'power' in str(e):
          raise
        raise ValueError(f'expected reach=LAMBDA with LAMBDA in (0, 1], got {score!r}') from None
    if power:
      raise ValueError(f'only reach takes a value (reach=LAMBDA), got {score!r}')
    return cls(nums[0], TreeShape(tuple(nums[1:])), name or 'mass')

  @property
  def depth(self) -> int:
    return self.template.depth

  @property
  def nodes(self) -> int:
    """M: the nodes the target verifies per call (the budget)."""
    return self.budget

  @property
  def branching(self) -> tuple[int, ...]:
    return self.template.branching

  def __str__(self) -> str:
    score = {'mass': '', 'reach': f':reach={self.power:g}'}.get(self.score, f':{self.score}')
    return f'dynamic:{self.budget},' + ','.join(map(str, self.branching)) + score


def parse_tree(spec) -> TreeShape | DynamicTree:
  """A TreeShape from a tuple/list of ints, a TreeShape, '(3,2,1)' / '3,2,1' or 'name:args'
  ('dynamic:8,4,2,1' a DynamicTree)."""
  if isinstance(spec, (TreeShape, DynamicTree)):
    return spec
  if isinstance(spec, str) and ':' in spec:
    name, _, arg = spec.strip().partition(':')
    try:
      return TREE_SHAPES.lookup(name.strip()).from_spec(arg)
    except (TypeError, ValueError) as e:
      raise ValueError(f'tree {spec!r}: {e}') from None
  if isinstance(spec, str):
    try:
      spec = ast.literal_eval(spec.strip() if spec.strip().startswith('(') else f'({spec},)')
    except (ValueError, SyntaxError):
      raise ValueError(f'tree must look like (3,2,1), got {spec!r}') from None
  if isinstance(spec, int):
    spec = (spec,)
  if not isinstance(spec, (tuple, list)):
    raise ValueError(f'tree must be a tuple of branching factors like (3,2,1), got {spec!r}')
  return TreeShape(tuple(spec))


def parse_trees(spec) -> tuple[TreeShape | DynamicTree, ...]:
  """Several trees: '(3,2,1);dynamic:8,2,1,1,1' (';'-separated), '((3,2,1), (2,2,2,1))', a list
  of trees, or one tree."""
  if isinstance(spec, str) and ';' in spec:
    trees = tuple(parse_tree(s) for s in spec.split(';') if s.strip())
    if not trees:
      raise ValueError(f'trees must name at least one tree, got {spec!r}')
    return trees
  if isinstance(spec, str) and ':' in spec and not spec.strip().startswith('('):
    return (parse_tree(spec),)
  if isinstance(spec, str):
    try:
      spec = ast.literal_eval(spec.strip())
    except (ValueError, SyntaxError):
      raise ValueError(f'trees must look like ((3,2,1), (2,2,2,1)), got {spec!r}') from None
  if isinstance(spec, (TreeShape, DynamicTree)) or (
      isinstance(spec, (tuple, list)) and spec and all(isinstance(x, int) for x in spec)):
    return (parse_tree(spec),)
  if not isinstance(spec, (tuple, list)) or not spec:
    raise ValueError(f'trees must be a non-empty list of trees like ((3,2,1),), got {spec!r}')
  return tuple(parse_tree(s) for s in spec)
