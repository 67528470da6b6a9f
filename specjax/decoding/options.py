"""The settings of one speculative_decode call: one frozen object, each field of one type.

speculative_decode keeps its keyword arguments (gamma, max_new_tokens, temperature, top_k, top_p,
eos_id, stop, verifier, tree, slots, trace); `SpecOptions.from_kwargs` turns them into this object
at one boundary, with a one-line ValueError naming the field for anything wrong, before a model
is touched. The loops (chain, tree, refill) read only SpecOptions.
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from typing import Any

import numpy as np

from specjax.decoding import acceptance, engine, protocol, stopping
from specjax.decoding.auto import Auto, parse_gamma
from specjax.decoding.model_draft import as_draft
from specjax.decoding.registry import DRAFTS
from specjax.decoding.sampling import Sampling
from specjax.decoding.shapes import DynamicTree, TreeShape, parse_tree


@dataclasses.dataclass(frozen=True)
class SpecOptions:
  """Static settings of a speculative call (hashable).

  max_new_tokens  tokens to generate per row (>= 1)
  gamma           the block width: drafts per iteration; G_MAX under a stop rule or `auto`; a
                  tree's depth with `tree`
  sampling        temperature / top-k / top-p, applied alike to the target and the draft
  eos_id          the token that ends a row (None: the target's eos_token_id; -1: never)
  stop            how many of the gamma slots each row proposes (specjax.stopping)
  verifier        the verification rule (acceptance.VERIFIERS)
  tree            verify a token tree of this shape instead of a chain (gamma = its depth); a
                  DynamicTree ('dynamic:8,4,2,1') verifies per row the budget's best nodes of
                  its template
  auto            choose gamma in 0 .. auto.g_max per iteration (gamma='auto'; runs with slots)
  slots           decode the rows as a queue through this many rows of one loop
  trace           record every iteration's drafts (chains without slots)
  """
  max_new_tokens: int
  gamma: int | None = None
  sampling: Sampling = Sampling()
  eos_id: int | None = None
  stop: stopping.StopRule = stopping.Fixed()
  verifier: acceptance.Verifier = acceptance.TokenVerifier()
  tree: TreeShape | DynamicTree | None = None
  auto: Auto | None = None
  slots: int | None = None
  trace: bool = False

  def __post_init__(self):
    for name in ('max_new_tokens', 'gamma', 'slots'):
      value = getattr(self, name)
      if value is not None and (isinstance(value, bool) or int(value) < 1):
        raise ValueError(f'{name} must be an integer >= 1, got {value!r}')
      object.__setattr__(self, name, None if value is None else int(value))
    if not isinstance(self.stop, stopping.StopRule):
      raise ValueError(f'stop must be a specjax.stopping rule, got {self.stop!r}')
    self.sampling.validate()
    if self.tree is not None:
      self._check_tree()
    elif self.gamma is None:
      raise ValueError('speculative_decode: gamma is required (or tree=)')
    if self.trace and self.queued:
      raise ValueError('speculative_decode: trace=True does not combine with slots= or gamma=auto')

  def _check_tree(self):
    shape = self.tree
    if self.gamma is not None and int(self.gamma) != shape.depth:
      raise ValueError(f'gamma={self.gamma} but tree={shape} has depth {shape.depth} (gamma = '
                       'depth)')
    if self.queued:
      raise ValueError("tree= does not combine with slots= or gamma='auto'")
    if self.trace or type(self.stop) not in (stopping.StopRule, stopping.Fixed):
      raise ValueError('tree= does not take trace or stop (every row proposes its whole tree)')
    if type(self.verifier).verify_tree is acceptance.Verifier.verify_tree:
      raise ValueError(f'verifier {self.verifier!r} has no tree form (tree= needs one, e.g. '
                       "'token')")

  @property
  def queued(self) -> bool:
    """Slot refill runs the call (slots=, or gamma chosen per iteration)."""
    return self.slots is not None or self.auto is not None

  @property
  def width(self) -> int:
    """The widest block: gamma, auto's G_MAX or the tree's depth."""
    if self.tree is not None:
      return self.tree.depth
    return self.auto.g_max if self.auto is not None else int(self.gamma)

  def eos_for(self, target) -> int:
    return engine.eos_of(target, self.eos_id)

  @classmethod
  def from_kwargs(cls, **kw) -> SpecOptions:
    """The options from speculative_decode's keyword arguments (module docstring)."""
    unknown = sorted(set(kw) - KEYWORDS)
    if unknown:
      close = difflib.get_close_matches(unknown[0], sorted(KEYWORDS), 1, 0.75)
      hint = f'; did you mean {close[0]!r}?' if close else ''
      raise ValueError(f'speculative_decode: unknown argument {unknown[0]!r}{hint}')
    if 'max_new_tokens' not in kw or kw['max_new_tokens'] is None:
      raise ValueError('speculative_decode: max_new_tokens is required')
    kw = dict(kw)
    kw['sampling'] = Sampling(temperature=float(kw.pop('temperature', 0.0)),
                              top_k=int(kw.pop('top_k', 0)), top_p=float(kw.pop('top_p', 1.0)))
    _gamma_fields(kw)
    _verifier_field(kw)
    if isinstance(kw.get('stop'), str):
      kw['stop'] = stopping.parse(kw['stop'])
    kw['stop'] = kw.get('stop') or stopping.Fixed()
    if kw.get('tree') is not None:
      kw['tree'] = parse_tree(kw['tree'])
    kw['trace'] = bool(kw.get('trace', False))
    return cls(**{k: v for k, v in kw.items() if v is not None or k == 'eos_id'})


KEYWORDS = frozenset({f.name for f in dataclasses.fields(SpecOptions)} - {'sampling'}
                     | {'temperature', 'top_k', 'top_p', 'verify_fn'})


def _gamma_fields(kw: dict[str, Any]) -> None:
  """gamma: an int, 'auto' / 'auto:G_MAX' (-> auto), or (deprecated) an Auto."""
  gamma = kw.get('gamma')
  if isinstance(gamma, Auto):
    warnings.warn('speculative_decode(gamma=Auto(...)) is deprecated: pass auto=Auto(...)',
                  DeprecationWarning, stacklevel=4)
  if isinstance(gamma, (str, Auto)):
    _, kw['auto'] = parse_gamma(gamma)
  if kw.get('auto') is not None:
    kw['gamma'] = kw['auto'].g_max
  elif gamma is not None and not isinstance(gamma, (int, np.integer)):
    raise ValueError(f"gamma {gamma!r}: expected an int >= 1, 'auto' or 'auto:G_MAX'")


def _verifier_field(kw: dict[str, Any]) -> None:
  """verifier: a registered name or a Verifier; (deprecated) verify_fn, a bare function."""
  fn = kw.pop('verify_fn', None)
  if fn is not None:
    warnings.warn('speculative_decode(verify_fn=f) is deprecated: pass verifier=a '
                  'specjax.acceptance.Verifier', DeprecationWarning, stacklevel=4)
    kw['verifier'] = acceptance.FunctionVerifier(fn)
  kw['verifier'] = acceptance.verifier_for(kw.get('verifier') or 'token')


def check_call(target, draft, input_ids, opts: SpecOptions):
  """The checks that need the models and the input, before anything is compiled; returns the
  draft in the form the call runs (a registered draft's name built for the target, a T5Model
  wrapped, a tree draft for tree=)."""
  if isinstance(draft, str):
    draft = DRAFTS.lookup(draft).from_target(target)
  draft = as_draft(draft)
  if opts.tree is not None:
    if not hasattr(target, 'decode_tree'):
      raise ValueError(f'tree=: the target {type(target).__name__} has no decode_tree '
                       '(a specjax T5Model is needed)')
    draft = protocol.tree_draft(draft)
  engine.check_inputs(input_ids, opts.max_new_tokens, opts.width, opts.sampling,
                      target.config.vocab_size, engine.draft_vocab(draft))
  return draft
