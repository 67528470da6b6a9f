"""One registry per extension kind: drafts, stop rules, verifiers and tree shapes.

Adding an extension is one class in one file, decorated with its kind's `register(name)`:

  @stopping.register('patience')        a stop rule    (specjax.decoding.stopping)
  @acceptance.register('lenient')       a verifier     (specjax.decoding.acceptance)
  @shapes.register('wide')              a tree shape   (specjax.decoding.shapes)
  @drafts.register('source_bigram')     a draft        (specjax.decoding.drafts)

The name is how configs and strings select it ('patience:3', verifier='lenient', tree='wide:4,3',
--config.drafts="('source_bigram',)"). Registries are filled when their modules are imported and
only read afterwards; the runner validates names against them before anything is compiled.
"""

from __future__ import annotations

import difflib


class Registry(dict):
  """name -> entry (the class, or for verifiers an instance) of one extension kind."""

  def __init__(self, kind: str, instances: bool = False):
    super().__init__()
    self.kind = kind
    self.instances = instances

  def register(self, name: str):
    """Class decorator: registers the class (an instance of it when `instances`) under `name`."""
    def wrap(cls):
      old = self.get(name)
      if old is not None and (old if isinstance(old, type) else type(old)) is not cls:
        raise ValueError(f'{self.kind} {name!r} is registered already ({old!r})')
      self[name] = cls() if self.instances else cls
      return cls
    return wrap

  def lookup(self, name: str):
    """The entry called `name`, or a one-line ValueError with the closest known name."""
    if name in self:
      return self[name]
    close = difflib.get_close_matches(str(name), list(self), 1, 0.75)
    hint = f'; did you mean {close[0]!r}?' if close else f' (choose from {", ".join(sorted(self))})'
    raise ValueError(f'{self.kind} {name!r} unknown{hint}')

  def name_of(self, obj) -> str | None:
    """The name `obj` (a registered class or an instance of one) is registered under, if any."""
    cls = obj if isinstance(obj, type) else type(obj)
    for name, entry in self.items():
      if entry is cls or type(entry) is cls:  # pylint: disable=unidiomatic-typecheck
        return name
    return None


DRAFTS = Registry('draft')
STOP_RULES = Registry('stop rule')
VERIFIERS = Registry('verifier', instances=True)
TREE_SHAPES = Registry('tree shape')
