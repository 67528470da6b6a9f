"""results.jsonl, what makes a stored cell current, and the published records (docs/results/).

One JSON line per finished cell, rewritten atomically (temp file + rename), so a killed sweep
leaves whole lines only. Every record carries `settings`: everything that changes its numbers
(checkpoint and data identities, lengths, batch, sampling, mesh, dtype, precision, seed, repeats,
the device, and the cell's own task / draft / temperature / gamma) and `settings_id`, their hash.
A rerun resumes a cell only from a record with the same id; a cell whose settings changed is
recomputed, and tables and plots show only records that match the current settings (rows of
other settings stay in the file, untouched, and are never presented as current).

Published records: every figure in README.md and docs/ is rendered (scripts/render_docs.py) from
records under docs/results/, one JSON line per measurement run in
docs/results/<benchmark>/<host id>.jsonl, so a run on a new host adds a file and a rerun on the
same host adds a line, never touching another host's. A record:

  {"schema": 1, "benchmark": "bench_transformers" | "run.tiny" | ...,
   "command": the exact command, "commit": "0cefe1fd904d", "dirty": false,
   "created": "2026-12-04T17:31:12Z" (UTC), "host_id": "amd-epyc-2c-47c9b6",
   "host": specjax.runner.machine.host_record(), "load": the load gate's record (or null),
   "smoke": false, "args": {...}, "figures": {...}}

`figures` is the benchmark's own machine-readable result (its --out JSON without host, load and
args; the runner's: its current results.jsonl rows). Paths of the machine are scrubbed (`scrub`).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import tempfile
import time
from typing import Any, Callable, Iterable

REPO = pathlib.Path(__file__).resolve().parents[2]
RECORDS_DIR = REPO / 'docs' / 'results'
RECORD_SCHEMA = 1

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
  from specjax.runner import drafts  # pylint: disable=import-outside-toplevel
  if drafts.is_head_dir(draft) and drafts.head_path(draft) != draft:  # a head with options
    path, options = drafts.head_spec(draft)
    return {**path_identity(path), 'options': options}
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


# ----------------------------------------------------------------------------- published records

_ABS_PATH = re.compile(r'(?<![\w.:/])(/|~/)[^\s\'",:;]*')


def scrub(value: Any) -> Any:
  """`value` with the machine's paths taken out, recursively: a path inside the repository
  becomes relative to it, any other absolute path its last component."""
  if isinstance(value, dict):
    return {k: scrub(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [scrub(v) for v in value]
  if not isinstance(value, str):
    return value

  def one(found):
    path = os.path.expanduser(found.group(0))
    try:
      return pathlib.Path(path).resolve().relative_to(REPO).as_posix()
    except ValueError:
      return os.path.basename(path.rstrip('/')) or '/'
  return _ABS_PATH.sub(one, value)


def make_record(benchmark: str, result: dict[str, Any], *, command: str = '',
                host: dict[str, Any] | None = None, smoke: bool = False) -> dict[str, Any]:
  """A published record of one run: `result` is the benchmark's JSON (its `host`, `load`, `args`
  and `command` keys are lifted out of `figures`). The host is measured now when absent."""
  result = dict(result)
  host = host or result.pop('host', None)
  result.pop('host', None)
  if host is None:
    from specjax.runner import machine  # pylint: disable=import-outside-toplevel
    host = machine.host_record()
  load = result.pop('load', None)
  args = result.pop('args', {})
  command = command or result.pop('command', '')
  result.pop('command', None)
  result.pop('machine', None)  # the short description printed beside the tables; host has it all
  return scrub({
      'schema': RECORD_SCHEMA, 'benchmark': benchmark, 'command': command,
      'commit': host.get('commit'), 'dirty': host.get('dirty'),
      'created': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
      'host_id': host['host_id'], 'host': host, 'load': load, 'smoke': bool(smoke),
      'args': args, 'figures': result,
  })


def append_record(record: dict[str, Any], directory=RECORDS_DIR) -> pathlib.Path:
  """Appends one record as a JSON line to DIR/<benchmark>/<host id>.jsonl (atomically)."""
  path = pathlib.Path(directory) / record['benchmark'] / f"{record['host_id']}.jsonl"
  ResultsFile(str(path)).append(record)
  return path


def load_records(directory=RECORDS_DIR, benchmark: str | None = None) -> list[dict[str, Any]]:
  """Every record under `directory` (of one benchmark when given), oldest first per file."""
  root = pathlib.Path(directory)
  files = sorted((root / benchmark).glob('*.jsonl') if benchmark else root.glob('*/*.jsonl'))
  return [r for f in files for r in ResultsFile(str(f)).load()]


def latest_per_host(records: Iterable[dict[str, Any]], benchmark: str,
                    where: Callable[[dict[str, Any]], bool] = lambda r: True
                    ) -> dict[str, dict[str, Any]]:
  """{host id: its newest non-smoke record of `benchmark` that satisfies `where`}."""
  out: dict[str, dict[str, Any]] = {}
  for r in records:
    if r.get('benchmark') != benchmark or r.get('smoke') or not where(r):
      continue
    if r['host_id'] not in out or r['created'] >= out[r['host_id']]['created']:
      out[r['host_id']] = r
  return out


def closest_host(host: dict[str, Any], candidates: Iterable[dict[str, Any]]):
  """The record (of `candidates`) whose host is closest to `host`: same accelerator first, then
  the same CPU model, core count and L3, then the nearest memory bandwidth; None if none."""
  def distance(rec):
    other = rec['host']
    same = lambda k: other.get(k) == host.get(k)  # noqa: E731
    bw_a, bw_b = host.get('mem_bw_gbs'), other.get('mem_bw_gbs')
    bw = abs(bw_a - bw_b) / max(bw_a, bw_b) if bw_a and bw_b else 1.0
    return (not same('accelerator'), not same('cpu_model'),
            not (other.get('cores_usable') or other.get('cores')) ==
            (host.get('cores_usable') or host.get('cores')), not same('l3_bytes'), bw)
  return min(candidates, key=distance, default=None)
