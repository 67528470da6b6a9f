"""results.jsonl, and what makes a stored cell current.

One JSON line per finished cell, rewritten atomically (temp file + rename), so a killed sweep
leaves whole lines only. Every record carries `settings`: everything that changes its numbers
(checkpoint and data identities, lengths, batch, sampling, mesh, dtype, precision, seed, repeats,
the device, and the cell's own task / draft / temperature / gamma) and `settings_id`, their hash.
A rerun resumes a cell only from a record with the same id; a cell whose settings changed is
recomputed, and tables and plots show only records that match the current settings (rows of
other settings stay in the file, untouched, and are never presented as current).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any

# Spec fields that change a cell's numbers (besides the checkpoints, data files and the device).
NUMERIC_FIELDS = ('num_examples', 'max_source_len', 'max_new_tokens', 'batch_size', 'repeats',
                  'top_k', 'top_p', 'dtype', 'matmul_precision', 'seed', 'mesh_shape')


class ResultsFile:
  """results.jsonl: one line per finished cell, rewritten atomically (temp file + rename)."""

  def __init__(self, path: str):
    self.path = path

  def load(self) -> list[dict[str, Any]]:
    if not os.path.exists(self.path):
      return []
    rows = []
    with open(self.path, encoding='utf-8') as f:
      for line in f:
        line = line.strip()
        if line:
          rows.append(json.loads(line))
    return rows

  def done_keys(self) -> set[tuple]:
    return {cell_key(r) for r in self.load()}

  def append(self, record: dict[str, Any]):
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
    existing = ''
    if os.path.exists(self.path):
      with open(self.path, encoding='utf-8') as f:
        existing = f.read()
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(self.path)), suffix='.tmp')
    with os.fdopen(fd, 'w', encoding='utf-8') as f:
      f.write(existing + json.dumps(record, sort_keys=True) + '\n')
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, self.path)


def cell_key(record: dict[str, Any]) -> tuple:
  key = (record['task'], record['draft'], float(record['temperature']), int(record['gamma']))
  rule = (record.get('stop', 'fixed'), record.get('verifier', 'token'))
  key = key if rule == ('fixed', 'token') else key + rule  # the paper's cells keep their key
  return key + ('tree', record['tree']) if record.get('tree') else key


# ----------------------------------------------------------------------------- identities


def path_identity(path: str, *, hash_contents: bool = False) -> Any:
  """A checkpoint directory or data file as it is now: absolute path plus each file's size and
  mtime (and a content hash for data files); a hub id or '' stays as it is."""
  if not path:
    return ''
  expanded = os.path.abspath(os.path.expanduser(path))
  if os.path.isfile(expanded):
    ident = {'path': expanded, 'size': os.path.getsize(expanded),
             'mtime_ns': os.stat(expanded).st_mtime_ns}
    if hash_contents:
      h = hashlib.sha256()
      with open(expanded, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
          h.update(block)
      ident['sha256'] = h.hexdigest()
    return ident
  if os.path.isdir(expanded):
    files = sorted(n for n in os.listdir(expanded) if os.path.isfile(os.path.join(expanded, n)))
    return {'path': expanded, 'files': {n: [os.path.getsize(os.path.join(expanded, n)),
                                            os.stat(os.path.join(expanded, n)).st_mtime_ns]
                                        for n in files}}
  return path  # a hub id


def run_settings(spec, device: str) -> dict[str, Any]:
  """What every cell of this run shares and that changes its numbers."""
  out = {f: getattr(spec, f) for f in NUMERIC_FIELDS}
  out['mesh_shape'] = list(spec.mesh_shape)
  out['target'] = path_identity(spec.target)
  out['local_data'] = path_identity(spec.local_data, hash_contents=True)
  out['device'] = device
  if spec.block_cost:  # its cells carry the measured block cost (absent: the stored identity)
    out['block_cost'] = True
  return out


def draft_settings(spec, draft: str, registry_settings: dict[str, tuple[str, ...]]) -> Any:
  """A registered draft by its name and the spec fields its builder reads; a checkpoint by files."""
  if draft in registry_settings:
    fields = {f: getattr(spec, f) for f in registry_settings[draft]}
    if 'ngram_data' in fields:
      fields['ngram_data'] = path_identity(spec.ngram_data, hash_contents=True)
    return {'name': draft, **fields}
  return path_identity(draft)


def cell_settings(run: dict[str, Any], task: str, draft: Any, temperature: float,
                  gamma: int, stop: str = 'fixed', verifier: str = 'token',
                  tree: str = '') -> dict[str, Any]:
  out = dict(run, task=task, draft=draft, temperature=float(temperature), gamma=int(gamma))
  if (stop, verifier) != ('fixed', 'token'):  # the paper's cells keep their stored identity
    out.update(stop=stop, verifier=verifier)
  if tree:
    out.update(tree=tree)
  return out


def settings_id(settings: dict[str, Any]) -> str:
  return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def differing(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
  """Names of the settings that differ between two records (for the one-line resume notice)."""
  return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
