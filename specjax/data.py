"""Evaluation/training data: the shipped offline EN->ES corpus and the paper's tasks.

`load_pairs(split)` reads the corpus committed under specjax/assets/bible_en_es (KJV English /
Reina-Valera 1909 Spanish verse pairs, public domain; built by scripts/build_bible_corpus.py), so a
fresh machine with no network can train and run the tiny T5 target/draft pair. `bible_tokenizer()`
is the SentencePiece tokenizer shipped next to it.

`load_task(task, split, num_examples, local_path)` returns (sources, references) for
  'ende'        WMT14 EnDe newstest2014 (HF `datasets` "wmt14"/"de-en"), prefix
                "translate English to German: " (T5's own prefix, so public T5 checkpoints work);
  'cnndm'       CNN/DailyMail 3.0.0 (HF "cnn_dailymail"/"3.0.0"), prefix "summarize: ";
  'bible_en_es' the shipped corpus, no prefix: the shipped models are trained from scratch on this
                one direction, so a prefix would only add ~6 tokens to every ~36-token source.
The first two need the optional `datasets` package and either network or the HF datasets cache;
offline and uncached they fail within seconds with `TaskUnavailableError` (one line, naming the
task and the `local_path` JSONL alternative) instead of letting `datasets` retry for minutes.
`load_jsonl` reads such local files (.jsonl or .jsonl.gz): one JSON object per line with
{"source", "reference"} (any task), or the task's own field names ("en"/"de", "article"/
"highlights", "en"/"es"). A malformed line is a `DataError` naming the file and line.

`TINY_PAIR_DIR` holds the shipped tiny target/draft pair (Hugging Face directories `target`, `draft`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from specjax.errors import ConfigError

ASSETS_DIR = Path(__file__).resolve().parent / 'assets'
SOURCES = ('bible_en_es',)
SPLITS = ('train', 'dev', 'test')
_SPLIT_ALIASES = {'validation': 'dev', 'valid': 'dev'}
BIBLE_TOKENIZER_DIR = ASSETS_DIR / 'bible_en_es' / 'tokenizer'
TINY_PAIR_DIR = ASSETS_DIR / 'tiny_pair'
LOCAL_FIELDS = ('source', 'reference')  # the schema of a local JSONL file for every task

_TRUE = {'1', 'ON', 'YES', 'TRUE'}
_PROBE_TIMEOUT_S = 3.0


class TaskUnavailableError(RuntimeError):
  """A task's data cannot be had here (no `datasets`, or offline and not cached)."""


class DataError(ConfigError):
  """A local data file is unusable; the message is one line naming the file (and line, field).
  A ConfigError, so the runner reports it as one line with exit code 2."""


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  prefix: str             # prepended to every source (not twice if already there)
  local_fields: tuple     # the task's own (source, reference) names, also read in a local JSONL
  hf_path: str | None = None
  hf_name: str | None = None
  hf_fields: tuple = ()   # (source, reference) dotted paths in a HF datasets row


TASKS = {
    'ende': Task('ende', 'translate English to German: ', ('en', 'de'), 'wmt14', 'de-en',
                 ('translation.en', 'translation.de')),
    'cnndm': Task('cnndm', 'summarize: ', ('article', 'highlights'), 'cnn_dailymail', '3.0.0',
                  ('article', 'highlights')),
    'bible_en_es': Task('bible_en_es', '', ('en', 'es')),
}


# ----------------------------------------------------------------------------- shipped corpus

def _split_name(split: str) -> str:
  split = _SPLIT_ALIASES.get(split, split)
  if split not in SPLITS:
    raise ValueError(f'unknown split {split!r}; known splits: {", ".join(SPLITS)}')
  return split


def load_pairs(split: str, source: str = 'bible_en_es') -> list[dict]:
  """Rows {"ref", "en", "es"} of a shipped corpus split ('train', 'dev'/'validation', 'test')."""
  if source not in SOURCES:
    raise ValueError(f'unknown source {source!r}; known sources: {", ".join(SOURCES)}')
  path = ASSETS_DIR / source / f'{_split_name(split)}.jsonl.gz'
  if not path.is_file():
    raise FileNotFoundError(f'{path}: shipped corpus file missing (reinstall specjax, or rebuild '
                            f'with scripts/build_bible_corpus.py)')
  with gzip.open(path, 'rt', encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def bible_tokenizer():
  """The SentencePiece tokenizer shipped with the bible_en_es corpus (pad 0, eos 1, unk 2)."""
  from transformers import AutoTokenizer
  return AutoTokenizer.from_pretrained(str(BIBLE_TOKENIZER_DIR))


# ----------------------------------------------------------------------------- local files

def _get_field(row, field: str):
  value = row
  for part in field.split('.'):
    if not isinstance(value, dict) or part not in value:
      return None
    value = value[part]
  return value


def _fields_of(row, schemas):
  """The first (source, reference) schema whose source field the row has (else the first)."""
  for schema in schemas:
    if _get_field(row, schema[0]) is not None:
      return schema
  return schemas[0]


def _lines(path: Path):
  """(line number, text) of a .jsonl / .jsonl.gz, decoded line by line so that a line that is
  not UTF-8 (or a broken gzip stream) is a DataError naming it."""
  opener = gzip.open if path.suffix == '.gz' else open
  lineno = 0
  try:
    with opener(path, 'rb') as f:
      for lineno, raw in enumerate(f, 1):
        try:
          yield lineno, raw.decode('utf-8')
        except UnicodeDecodeError as e:
          raise DataError(f'{path}:{lineno}: not UTF-8 text (byte {e.start + 1})') from None
  except (OSError, EOFError) as e:
    raise DataError(f'{path}:{lineno + 1}: unreadable ({" ".join(str(e).split())})') from None


def load_jsonl(path, src_field: str | None = None,
               tgt_field: str | None = None, *,
               schemas=(LOCAL_FIELDS,)) -> tuple[list[str], list[str]]:
  """(sources, targets) from a user's .jsonl / .jsonl.gz; fields may be dotted ('translation.en').

  With `src_field`/`tgt_field` those names are read; otherwise each line may use any of
  `schemas` ((source, reference) name pairs, default {"source", "reference"}). Errors are one
  line naming the file (and line and field): FileNotFoundError for a missing file, DataError for
  bad JSON, a missing or non-string field, or no rows.
  """
  path = Path(path).expanduser()
  if not path.is_file():
    raise FileNotFoundError(f'{path}: no such file')
  if src_field or tgt_field:
    schemas = ((src_field or schemas[0][0], tgt_field or schemas[0][1]),)
  sources, targets = [], []
  for lineno, line in _lines(path):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise DataError(f'{path}:{lineno}: not valid JSON ({e.msg}, column {e.colno})') from None
    fields = _fields_of(row, schemas)
    for i, (field, out) in enumerate(zip(fields, (sources, targets))):
      value = _get_field(row, field)
      if not isinstance(value, str):
        have = ', '.join(row) if isinstance(row, dict) else f'a JSON {type(row).__name__}'
        what = 'no field' if value is None else f'non-string ({type(value).__name__}) field'
        names = dict.fromkeys(s[0] for s in schemas) if i == 0 and value is None else [field]
        raise DataError(f'{path}:{lineno}: {what} {" or ".join(map(repr, names))} (has: {have})')
      out.append(value)
  if not sources:
    raise DataError(f'{path}: no examples')
  return sources, targets


# ----------------------------------------------------------------------------- tasks

def _env_offline() -> bool:
  return any(os.environ.get(v, '').upper() in _TRUE
             for v in ('HF_HUB_OFFLINE', 'HF_DATASETS_OFFLINE', 'TRANSFORMERS_OFFLINE'))


def _hub_reachable(timeout: float = _PROBE_TIMEOUT_S) -> bool:
  """One TCP connect to the hub endpoint: `datasets` itself retries a dead network for ~25 s+."""
  url = urlparse(os.environ.get('HF_ENDPOINT', 'https://huggingface.co'))
  port = url.port or (443 if url.scheme == 'https' else 80)
  try:
    with socket.create_connection((url.hostname, port), timeout=timeout):
      return True
  except OSError:
    return False


@contextlib.contextmanager
def _forced_offline(datasets_module):
  """Cache-only mode for `datasets` and huggingface_hub, even when imported before us."""
  import huggingface_hub.constants as hub_constants
  targets = [(hub_constants, 'HF_HUB_OFFLINE')]
  targets += [(datasets_module.config, n) for n in ('HF_HUB_OFFLINE', 'HF_DATASETS_OFFLINE')
              if hasattr(datasets_module.config, n)]
  saved = [(obj, name, getattr(obj, name)) for obj, name in targets]
  try:
    for obj, name in targets:
      setattr(obj, name, True)
    yield
  finally:
    for obj, name, value in saved:
      setattr(obj, name, value)


def _with_prefix(prefix: str, sources: list[str]) -> list[str]:
  return [s if s.startswith(prefix) else prefix + s for s in sources]


def _load_hf(task: Task, split: str, num_examples: int | None) -> tuple[list[str], list[str]]:
  hf_split = {'dev': 'validation'}.get(split, split)
  where = f'{task.hf_path}/{task.hf_name} split {hf_split!r}'
  hint = ('use a local JSONL file with {"source", "reference"} per line: '
          '--config.local_data=FILE on the command line, local_path=FILE in Python')
  try:
    import datasets
  except ImportError:
    raise TaskUnavailableError(f'task {task.name!r} ({where}) needs the optional `datasets` '
                               f'package: pip install datasets; or {hint}') from None
  offline = _env_offline() or not _hub_reachable()
  context = _forced_offline(datasets) if offline else contextlib.nullcontext()
  try:
    with context:
      ds = datasets.load_dataset(task.hf_path, task.hf_name, split=hf_split)
  except Exception as e:  # datasets raises ConnectionError, FileNotFoundError, DatasetNotFoundError...
    why = ('offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE set, or the hub is unreachable) and not in '
           'the local datasets cache' if offline else 'could not be loaded')
    detail = ' '.join(str(e).split()) or type(e).__name__
    raise TaskUnavailableError(f'task {task.name!r} ({where}) {why}: {detail}; download it on a '
                               f'networked machine first, or {hint}') from None
  if num_examples is not None:
    ds = ds.select(range(min(num_examples, len(ds))))
  src, tgt = task.hf_fields
  return [_get_field(r, src) for r in ds], [_get_field(r, tgt) for r in ds]


def load_task(task: str, split: str = 'test', num_examples: int | None = None,
              local_path=None, src_field: str | None = None,
              tgt_field: str | None = None) -> tuple[list[str], list[str]]:
  """(sources with the task prefix, references); the first `num_examples` (None: all).

  `local_path` (.jsonl/.jsonl.gz) replaces the download or shipped split (`split` is then
  ignored); each line holds {"source", "reference"} or the task's own names ('en'/'de',
  'article'/'highlights', 'en'/'es'), unless `src_field`/`tgt_field` name others. Raises ValueError
  for an unknown task or split, DataError for a bad local file, TaskUnavailableError when a HF task
  cannot be loaded here.
  """
  if task not in TASKS:
    raise ValueError(f'unknown task {task!r}; known tasks: {", ".join(sorted(TASKS))}')
  spec = TASKS[task]
  if num_examples is not None and num_examples < 0:
    raise ValueError(f'num_examples must be >= 0 or None, got {num_examples}')
  if local_path is not None:
    sources, refs = load_jsonl(local_path, src_field, tgt_field,
                               schemas=(LOCAL_FIELDS, spec.local_fields))
  elif spec.hf_path is None:
    rows = load_pairs(split, source=task)
    sources = [r[spec.local_fields[0]] for r in rows]
    refs = [r[spec.local_fields[1]] for r in rows]
  else:
    sources, refs = _load_hf(spec, _split_name(split), num_examples)
  if num_examples is not None:
    sources, refs = sources[:num_examples], refs[:num_examples]
  return _with_prefix(spec.prefix, sources), refs
