"""specjax.programs.typed_jit: compiled programs keyed on the classes of their pytree arguments.

jax compares the PyTreeDefs of two flax.struct.dataclass classes with the same fields as equal,
so a cache that matches keys by equality (jit's, once a short hash collides) can serve one class
the program traced for the other. The control shows that an equality-only lookup keyed on the
treedef does exactly that; the fix's key (treedef, node_classes) does not.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.programs import node_classes, typed_jit


@struct.dataclass
class Doubler:
  x: jax.Array
  name: str = struct.field(pytree_node=False, default='d')

  def apply(self):
    return 2 * self.x


@struct.dataclass
class Tripler(Doubler):  # same fields, another method: another program
  def apply(self):
    return 3 * self.x


@typed_jit(static_argnames=('k',))
def run(model, y, *, k):
  return model.apply() + k * y


def _lookup(entries, key):
  """An equality-only cache lookup (what a hash table does once a short hash matches)."""
  return next((prog for k, prog in entries if k == key), None)


def test_an_equality_lookup_on_the_treedef_mixes_classes_up():
  # Control: the key jit uses; if this ever fails, jax compares dataclass classes itself.
  d, t = Doubler(jnp.ones(2)), Tripler(jnp.ones(2))
  entries = [(jax.tree.structure(d), 'Doubler program')]
  assert _lookup(entries, jax.tree.structure(t)) == 'Doubler program'


def test_node_classes_tell_the_classes_apart():
  d, t = Doubler(jnp.ones(2)), Tripler(jnp.ones(2))
  key = lambda m: (jax.tree.structure(m), node_classes(m))  # noqa: E731
  entries = [(key(d), 'Doubler program')]
  assert _lookup(entries, key(t)) is None
  assert _lookup(entries, key(Doubler(jnp.zeros(2)))) == 'Doubler program'  # same class: a hit
  # nested nodes count too
  assert node_classes({'a': (d,)}) != node_classes({'a': (t,)})


def test_typed_jit_runs_each_class_own_program():
  y = jnp.ones(2)
  before = run._cache_size()  # pylint: disable=protected-access
  np.testing.assert_array_equal(run(Doubler(jnp.ones(2)), y, k=1), [3, 3])
  np.testing.assert_array_equal(run(Tripler(jnp.ones(2)), y, k=1), [4, 4])
  np.testing.assert_array_equal(run(Doubler(jnp.ones(2) * 2), y, k=1), [5, 5])  # reused
  assert run._cache_size() - before == 2  # pylint: disable=protected-access
  np.testing.assert_array_equal(run.lower(Tripler(jnp.ones(2)), y, k=2).compile()(
      Tripler(jnp.ones(2)), y), [5, 5])
