"""Experiment configs: an ml_collections ConfigDict becomes a frozen, validated RunSpec here, once.

`RunSpec` is the single list of run-config fields: each field's default and one-line doc live in
its `option(...)` below; configs/common.py builds the default ConfigDict from it and
`python -m specjax.run --help` prints it. Every check that can fail on user input runs in
`run_spec`, before any model is loaded or compiled, and raises a one-line `ConfigError` naming the
field or file.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import struct
from typing import Any

from specjax import configuring
from specjax.configuring import option, require
from specjax.errors import ConfigError  # pylint: disable=unused-import  (re-exported)
from specjax.runner import drafts as drafts_lib

TASKS = ('ende', 'cnndm', 'bible_en_es')
HUB_TASKS = ('ende', 'cnndm')  # read with the optional `datasets` package unless local_data is set
DTYPES = ('float32', 'bfloat16')
MATMUL_PRECISIONS = ('', 'default', 'high', 'highest')
WEIGHT_FILES = ('model.safetensors', 'model.safetensors.index.json', 'pytorch_model.bin')


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One experiment: a target, drafts, and the grid of tasks x temperatures x gammas it sweeps."""
  name: str = option('experiment', 'used in output paths and table titles')
  target: str = option('', 'HF checkpoint directory or hub id of the target')
  drafts: tuple[str, ...] = option((), 'checkpoints (dirs or hub ids) or '
                                   + ' / '.join(drafts_lib.REGISTRY))
  tasks: tuple[str, ...] = option(('ende',), "'ende' (WMT14 newstest2014), 'cnndm' "
                                  "(CNN/DM 3.0.0 test), 'bible_en_es' (shipped corpus)")
  temperatures: tuple[float, ...] = option((0.0, 1.0), '0 = greedy (exact argmax); >0 = sampling')
  gammas: tuple[int, ...] = option((1, 2, 3, 5, 7, 10), "drafts per iteration; the paper's gamma "
                                   'is marked in the table')
  stops: tuple[str, ...] = option(('fixed',), "stop rules (specjax.stopping): 'fixed' (the "
                                  "paper), 'confidence:0.4', 'entropy:2.5', 'alpha', 'budget' "
                                  '(gamma = G_MAX)')
  verifiers: tuple[str, ...] = option(('token',), "'token' (the paper's rule) and/or 'block' "
                                      '(block verification, Sun et al. 2025)')
  trees: str = option('', "token trees beside the gammas, e.g. '(3,2,1);dynamic:8,2,1,1,1,1,1,1,1' "
                      "or '((3,2,1), (2,2,2,1))': one cell per tree (branching per depth, or a "
                      'dynamic tree dynamic:BUDGET,b1,..[:reach=L]; gamma = depth; '
                      'specjax.decoding.tree)')
  top_k: int = option(0, 'top-k filtering (0 = off)')
  top_p: float = option(1.0, 'nucleus filtering (1 = off)')
  num_examples: int = option(100, 'prompts per task (from the test split)')
  max_source_len: int = option(512, 'source tokens kept (truncated beyond)')
  max_new_tokens: int = option(128, 'decode length per prompt (stops earlier at EOS)')
  batch_size: int = option(1, "prompts per batch (1 = the paper's setting)")
  repeats: int = option(3, 'timed repeats per cell (median reported; compile excluded)')
  block_cost: bool = option(False, "measure the target's (gamma+1)-token step over its 1-token "
                            'step once per task and predict with it beside Theorem 3.8 (always '
                            'on with stop rules); and pred (call): its terms (fixed cost per '
                            'call, cost per token / iteration, block, proposal) timed in each '
                            "cell's own session beside its decodes")
  dtype: str = option('bfloat16', 'parameter dtype; logits and acceptance are float32 regardless')
  matmul_precision: str = option('', "'' = XLA's default; 'highest' with dtype float32 keeps "
                                 'greedy output token-identical on GPUs (docs/performance.md)')
  seed: int = option(0, 'PRNG seed of the sampled runs')
  output_dir: str = option('results/experiment', 'results.jsonl, table.csv, table.md, plots')
  local_data: str = option('', 'JSONL file of prompts/references instead of the `datasets` '
                           'package (see README, local data)')
  ngram_data: str = option('', 'text/JSONL to fit unigram/bigram drafts (default: task train '
                           'split)')
  ngram_examples: int = option(10000, 'training examples used to fit n-gram drafts')
  mesh_shape: tuple[int, ...] = option((), '() = one device; (data, model) shards over devices')
  compilation_cache: str = option('~/.cache/specjax/xla', "JAX persistent compilation cache "
                                  "('' = off)")
  plots: bool = option(True, 'speedup vs gamma, alpha per draft, a trace picture (PNG)')
  show_examples: int = option(3, 'outputs printed at the end')

  def draft_label(self, draft: str) -> str:
    """Short name used in tables and to match the paper's rows ('t5-small', 'unigram', ...)."""
    return draft if drafts_lib.is_known(draft) else os.path.basename(os.path.normpath(draft))

  @property
  def sampling_grid(self):
    """The decoding.sampling.Sampling of every temperature, in sweep order."""
    from specjax.decoding.sampling import Sampling  # pylint: disable=import-outside-toplevel
    return [Sampling(t, self.top_k, self.top_p) for t in self.temperatures]


def run_spec(cfg: Any) -> RunSpec:
  """Validates a ConfigDict (or dict) and freezes it. Unknown keys are errors."""
  spec = configuring.read(RunSpec, cfg)
  _validate(spec)
  return spec


# ----------------------------------------------------------------------------- checks


def _validate(spec: RunSpec):
  for field in ('drafts', 'tasks', 'gammas', 'temperatures', 'stops', 'verifiers'):
    require(len(getattr(spec, field)) > 0, field, 'a non-empty list', getattr(spec, field))
  labels = {}
  for draft in spec.drafts:  # results, tables and resume key cells by the label
    first = labels.setdefault(spec.draft_label(draft), draft)
    if first != draft:
      raise ConfigError(f'config.drafts: {first!r} and {draft!r} share the name '
                        f'{spec.draft_label(draft)!r} (the last path component); rename one')
  for task in spec.tasks:
    if task not in TASKS:
      raise ConfigError(f'config.tasks: unknown task {task!r}'
                        f'{configuring.did_you_mean(task, TASKS) or " (known: " + ", ".join(TASKS) + ")"}')
  for g in spec.gammas:
    require(g >= 1, 'gammas', 'integers >= 1', g)
  from specjax.decoding import acceptance, stopping  # pylint: disable=import-outside-toplevel
  for i, text in enumerate(spec.stops):
    try:
      stopping.parse(text)
    except ValueError as e:
      raise ConfigError(f'config.stops[{i}]: {e}') from None
  for v in spec.verifiers:
    require(v in acceptance.VERIFIERS, 'verifiers', f'one of {sorted(acceptance.VERIFIERS)}', v)
  if spec.trees:
    from specjax.decoding import tree as tree_lib  # pylint: disable=import-outside-toplevel
    try:
      tree_lib.parse_trees(spec.trees)
    except ValueError as e:
      raise ConfigError(f'config.trees: {e}') from None
  _check_sampling(spec)
  for field in ('num_examples', 'max_source_len', 'max_new_tokens', 'batch_size', 'repeats',
                'ngram_examples'):
    require(getattr(spec, field) >= 1, field, 'positive', getattr(spec, field))
  require(spec.show_examples >= 0, 'show_examples', '>= 0', spec.show_examples)
  require(spec.dtype in DTYPES, 'dtype', f'one of {DTYPES}', spec.dtype)
  require(spec.matmul_precision in MATMUL_PRECISIONS, 'matmul_precision',
          f'one of {MATMUL_PRECISIONS}', spec.matmul_precision)
  require(bool(spec.output_dir), 'output_dir', 'a directory', spec.output_dir)
  require(len(spec.mesh_shape) in (0, 2) and all(d >= 1 or d == -1 for d in spec.mesh_shape),
          'mesh_shape', '() or (data, model)', spec.mesh_shape)
  for field in ('local_data', 'ngram_data'):
    path = getattr(spec, field)
    if path and not os.path.isfile(os.path.expanduser(path)):
      raise ConfigError(f'config.{field}: file not found: {path}')
  if spec.ngram_data.endswith(('.jsonl', '.jsonl.gz')):
    check_jsonl(spec.ngram_data, 'ngram_data')
  if spec.local_data:
    check_jsonl(spec.local_data, 'local_data')
  check_checkpoint('target', spec.target)
  for i, draft in enumerate(spec.drafts):
    drafts_lib.check_name(f'drafts[{i}]', draft)
    if drafts_lib.is_head_dir(draft):
      check_head(f'drafts[{i}]', draft, spec.gammas, spec.trees)
    elif not drafts_lib.is_known(draft):
      check_checkpoint(f'drafts[{i}]', draft)
  _check_vocab(spec)
  check_weights('target', spec.target)
  for i, draft in enumerate(spec.drafts):
    if not drafts_lib.is_known(draft) and not drafts_lib.is_head_dir(draft):
      check_weights(f'drafts[{i}]', draft)


def check_environment(spec: RunSpec):
  """What this machine must have for the run (checked when it starts, before any model loads; a
  config stays valid on a machine without them): the `datasets` package for hub tasks."""
  if spec.local_data:
    return
  hub_tasks = [t for t in spec.tasks if t in HUB_TASKS]
  if hub_tasks and importlib.util.find_spec('datasets') is None:
    raise ConfigError(f'config.tasks: task {hub_tasks[0]!r} needs the optional `datasets` package '
                      f'(pip install datasets) or a local file: --config.local_data=FILE.jsonl')


def _check_sampling(spec: RunSpec):
  """Sampling.validate is the one place sampling settings are checked; here it names the field."""
  for sampling in spec.sampling_grid:
    try:
      sampling.validate()
    except ValueError as e:  # 'Sampling.top_p must be in (0, 1], got 1.5'
      field = str(e).split('.', 1)[1].split(' ', 1)[0]
      why = str(e).split(' ', 1)[1]
      field = 'temperatures' if field == 'temperature' else field
      raise ConfigError(f'config.{field}: {why}') from None


def check_jsonl(path: str, field: str):
  """Every non-empty line of a JSONL file (.jsonl or .jsonl.gz) is a JSON object."""
  import gzip  # pylint: disable=import-outside-toplevel
  expanded = os.path.expanduser(path)
  opener = gzip.open if expanded.endswith('.gz') else open
  try:
    with opener(expanded, 'rt', encoding='utf-8') as f:
      for i, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          row = json.loads(line)
        except ValueError as e:
          raise ConfigError(f'config.{field}: {path} line {i}: not JSON ({e.msg})') from None
        if not isinstance(row, dict):
          raise ConfigError(f'config.{field}: {path} line {i}: not a JSON object')
  except (OSError, UnicodeDecodeError) as e:
    raise ConfigError(f'config.{field}: cannot read {path} ({e})') from None


def _looks_local(path: str) -> bool:
  return path.startswith(('.', '/', '~')) or os.sep in path and not _hub_like(path)


def _hub_like(path: str) -> bool:
  # "org/name" with one slash and no path-like segments is a hub id.
  parts = path.split('/')
  return len(parts) == 2 and all(parts) and not path.startswith(('.', '/', '~'))


def check_checkpoint(field: str, path: str):
  """A local checkpoint directory has a readable config.json; anything else must be a hub id."""
  if not path:
    raise ConfigError(f'config.{field}: empty checkpoint path')
  expanded = os.path.expanduser(path)
  if os.path.isdir(expanded):
    if not os.path.isfile(os.path.join(expanded, 'config.json')):
      raise ConfigError(f'config.{field}: no config.json in checkpoint directory {path}')
    _local_vocab(path)
    return
  if _looks_local(path) or os.path.exists(expanded):
    raise ConfigError(f'config.{field}: checkpoint directory not found: {path}')


def check_head(field: str, name: str, gammas=(), trees: str = ''):
  """A feature-head directory: a readable head_config.json, an intact head.safetensors and valid
  options ('DIR:vocab=1000': a count within the vocabulary and a readable vocab.json;
  'DIR:parallel=1': a head with parallel blocks for every gamma, and no trees;
  'DIR:weights=int8': a storage format, drafts.HEAD_WEIGHTS)."""
  from specjax.models import head as head_lib  # pylint: disable=import-outside-toplevel
  try:
    path, options = drafts_lib.head_spec(name)
  except ValueError as e:
    raise ConfigError(f'config.{field}: {e}') from None
  expanded = os.path.expanduser(path)
  cfg = os.path.join(expanded, head_lib.CONFIG_NAME)
  try:
    with open(cfg, encoding='utf-8') as f:
      config = head_lib.HeadConfig(**json.load(f))
  except (OSError, ValueError, TypeError) as e:
    raise ConfigError(f'config.{field}: unreadable {cfg} ({e})') from None
  weights = os.path.join(path, head_lib.WEIGHTS_NAME)
  if not os.path.isfile(os.path.expanduser(weights)):
    raise ConfigError(f'config.{field}: no {head_lib.WEIGHTS_NAME} in feature head {path}')
  _check_safetensors(field, weights)
  if 'vocab' in options:
    try:
      head_lib.keep_ids(expanded, options['vocab'], config.vocab_size)
    except ValueError as e:
      raise ConfigError(f'config.{field}: {e}') from None
  if options.get('parallel'):
    depth = config.parallel_depth + 1
    if depth == 1:
      raise ConfigError(f'config.{field}: parallel=1 needs a head trained with parallel blocks '
                        f'(head.parallel_depth > 0); {path} has none')
    if max(gammas, default=0) > depth:
      raise ConfigError(f'config.gammas: {max(gammas)} exceeds the {depth} drafts one pass of '
                        f'feature head {path} makes (parallel=1)')
    if trees:
      raise ConfigError(f'config.trees: feature head {path} with parallel=1 drafts chains only')


def check_weights(field: str, path: str):
  """A local checkpoint directory holds weights, and a model.safetensors has an intact header."""
  expanded = os.path.expanduser(path)
  if not os.path.isdir(expanded):
    return  # a hub id: checked on load
  weights = [w for w in WEIGHT_FILES if os.path.isfile(os.path.join(expanded, w))]
  if not weights:
    raise ConfigError(f'config.{field}: no weights ({" / ".join(WEIGHT_FILES)}) in {path}')
  if weights[0] == 'model.safetensors':
    _check_safetensors(field, os.path.join(path, weights[0]))


def _check_safetensors(field: str, path: str):
  """Reads only the header: 8-byte length, JSON table, every tensor's bytes inside the file."""
  expanded = os.path.expanduser(path)
  size = os.path.getsize(expanded)
  bad = f'config.{field}: {path} is not a readable safetensors file'
  try:
    with open(expanded, 'rb') as f:
      head = f.read(8)
      if len(head) < 8:
        raise ConfigError(f'{bad} ({size} bytes)')
      (n,) = struct.unpack('<Q', head)
      if n > size - 8:
        raise ConfigError(f'{bad} (header length {n} beyond the file)')
      header = json.loads(f.read(n))
  except (ValueError, UnicodeDecodeError):
    raise ConfigError(f'{bad} (corrupt header)') from None
  end = max((t['data_offsets'][1] for k, t in header.items() if k != '__metadata__'), default=0)
  if 8 + n + end > size:
    raise ConfigError(f'{bad} (truncated: {size} bytes, the header needs {8 + n + end})')


def _local_vocab(path: str):
  cfg = os.path.join(os.path.expanduser(path), 'config.json')
  if drafts_lib.is_head_dir(path):
    cfg = os.path.join(os.path.expanduser(drafts_lib.head_path(path)), 'head_config.json')
  if not os.path.isfile(cfg):
    return None
  try:
    with open(cfg, encoding='utf-8') as f:
      return int(json.load(f).get('vocab_size', 32128))
  except (OSError, ValueError, AttributeError) as e:
    raise ConfigError(f'{cfg}: unreadable config.json ({e})') from None


def _check_vocab(spec: RunSpec):
  """Target/draft vocabulary mismatch, from local config.json files (hub ids are checked on load)."""
  target_vocab = _local_vocab(spec.target)
  if target_vocab is None:
    return
  for i, draft in enumerate(spec.drafts):
    if drafts_lib.is_known(draft):
      continue
    vocab = _local_vocab(draft)
    if vocab is not None and vocab != target_vocab:
      raise ConfigError(f'config.drafts[{i}]: vocab_size {vocab} of {draft} differs from the '
                        f'target\'s {target_vocab}')
