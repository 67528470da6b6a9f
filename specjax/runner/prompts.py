"""A task's prompts as fixed-shape batches (few distinct shapes, so few compiles).

Shapes: N batches, B batch size, S source length (padded to a multiple of 8, at most
max_source_len).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass
class Prompts:
  """batches_NxBxS: the prompts, the last batch padded with copies of the first prompt; `n` real
  prompts (statistics and outputs use only those)."""
  batches_NxBxS: np.ndarray
  n: int
  sources: list[str]
  references: list[str]

  @property
  def rows_valid(self) -> list[int]:
    """Real (not padding) rows of each batch."""
    b = self.batches_NxBxS.shape[1]
    return [min(b, self.n - i * b) for i in range(self.batches_NxBxS.shape[0])]


def make_prompts(tokenizer, sources, references, *, max_source_len: int, batch_size: int,
                 pad_id: int) -> Prompts:
  ids = [tokenizer(s, truncation=True, max_length=max_source_len)['input_ids'] for s in sources]
  longest = max(len(x) for x in ids)
  s_len = min(max_source_len, int(math.ceil(longest / 8) * 8))
  b = batch_size
  n_batches = int(math.ceil(len(ids) / b))
  arr = np.full((n_batches * b, s_len), pad_id, np.int32)
  for i in range(n_batches * b):
    row = ids[i] if i < len(ids) else ids[0]
    arr[i, :len(row)] = row[:s_len]
  return Prompts(arr.reshape(n_batches, b, s_len), len(ids), list(sources), list(references))


def unbatch(outputs, n: int) -> tuple[np.ndarray, np.ndarray]:
  """Tokens [n, M] and lengths [n] of the real prompts from per-batch decode outputs."""
  tokens = np.concatenate([np.asarray(o.tokens) for o in outputs])[:n]
  lengths = np.concatenate([np.asarray(o.lengths) for o in outputs])[:n]
  return tokens, lengths
