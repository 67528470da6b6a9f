"""specjax.data: the shipped EN->ES corpus and tokenizer, task loading and its offline errors."""

import gzip
import json
import re
import time

import pytest

from specjax import data


@pytest.fixture(scope='module')
def splits():
  return {s: data.load_pairs(s) for s in data.SPLITS}


@pytest.fixture(scope='module')
def tok():
  return data.bible_tokenizer()


@pytest.fixture
def offline(monkeypatch):
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')


# ----------------------------------------------------------------------------- shipped corpus

def test_splits_sizes_and_disjoint(splits):
  assert len(splits['train']) > 25_000
  for s in ('dev', 'test'):
    assert 300 <= len(splits[s]) <= 800, (s, len(splits[s]))
  refs = {s: [r['ref'] for r in rows] for s, rows in splits.items()}
  for s, r in refs.items():
    assert len(r) == len(set(r)), f'duplicate refs in {s}'
  assert not set(refs['train']) & set(refs['dev'])
  assert not set(refs['train']) & set(refs['test'])
  assert not set(refs['dev']) & set(refs['test'])
  assert data.load_pairs('validation') == splits['dev']


def test_rows_are_clean_text(splits):
  markup = re.compile(r'[<>\\¶]|\b[HG]\d{3,5}\b|strong:[HG]?\d|lemma=|&\w+;')
  for rows in splits.values():
    for r in rows:
      assert set(r) == {'ref', 'en', 'es'}
      assert re.fullmatch(r'[1-3]?[A-Z][A-Za-z]+ \d+:\d+', r['ref']), r['ref']
      for lang in ('en', 'es'):
        t = r[lang]
        assert t and t == t.strip() and '  ' not in t, (r['ref'], lang, t)
        assert not markup.search(t), (r['ref'], lang, t)


def test_known_verses_and_spanish_accents(splits):
  by_ref = {r['ref']: r for rows in splits.values() for r in rows}
  assert by_ref['Gen 1:1'] == {'ref': 'Gen 1:1',
                               'en': 'In the beginning God created the heaven and the earth.',
                               'es': 'En el principio crió Dios los cielos y la tierra.'}
  assert by_ref['John 3:16']['es'].startswith('Porque de tal manera amó Dios al mundo')
  # RV1909 numbers Num 13 one verse later than KJV; the aligner pairs by content.
  assert by_ref['Num 13:1']['es'].startswith('Y Jehová habló á Moisés')
  spanish = ''.join(r['es'] for r in splits['train'])
  for ch in 'áéíóúñ¿¡':
    assert spanish.count(ch) > 100, ch
  assert 'Ã' not in spanish  # no UTF-8 read as Latin-1


def test_assets_small():
  total = sum(p.stat().st_size for p in (data.ASSETS_DIR / 'bible_en_es').rglob('*') if p.is_file())
  assert total < 6_000_000, total


def test_unknown_split_and_source():
  with pytest.raises(ValueError, match="'nope'.*train, dev, test"):
    data.load_pairs('nope')
  with pytest.raises(ValueError, match="'wmt'"):
    data.load_pairs('test', source='wmt')


# ----------------------------------------------------------------------------- tokenizer

def test_tokenizer_special_ids_and_size(tok):
  assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
  assert (tok.pad_token, tok.eos_token, tok.unk_token) == ('<pad>', '</s>', '<unk>')
  assert 2000 <= len(tok) <= 4100
  assert (data.BIBLE_TOKENIZER_DIR / 'spiece.model').is_file()
  assert (data.BIBLE_TOKENIZER_DIR / 'tokenizer.json').is_file()
  # transformers 4 fails on transformers 5's list-valued `extra_special_tokens`; the build drops it.
  config = json.loads((data.BIBLE_TOKENIZER_DIR / 'tokenizer_config.json').read_text())
  assert not isinstance(config.get('extra_special_tokens', {}), list)


@pytest.mark.parametrize('text', [
    'Y dijo Dios: Júntense las aguas; ¿quién es éste? El niño añadió: ¡Ay!',
    'Señor, ¿á quién iremos? Tú tienes palabras de vida eterna. Acción, corazón, pingüino.',
    'In the beginning God created the heaven and the earth.',
])
def test_tokenizer_round_trips(tok, text):
  ids = tok(text).input_ids
  assert ids[-1] == tok.eos_token_id and tok.unk_token_id not in ids
  assert tok.decode(ids, skip_special_tokens=True) == text


def test_tokenizer_sequences_short(tok, splits):
  rows = splits['dev']
  for lang in ('en', 'es'):
    lens = [len(x) for x in tok([r[lang] for r in rows]).input_ids]
    assert sum(lens) / len(lens) < 45, lang


# ----------------------------------------------------------------------------- tasks

def test_load_task_bible():
  sources, refs = data.load_task('bible_en_es', 'test', 7)
  rows = data.load_pairs('test')[:7]
  assert sources == [r['en'] for r in rows]  # no prefix for the shipped corpus
  assert refs == [r['es'] for r in rows]
  assert len(data.load_task('bible_en_es', 'dev')[0]) == len(data.load_pairs('dev'))


@pytest.mark.parametrize('task', ['ende', 'cnndm'])
def test_hf_task_offline_fails_fast(offline, tmp_path, monkeypatch, task):
  monkeypatch.setenv('HF_HOME', str(tmp_path / 'hf'))          # nothing cached
  monkeypatch.setenv('HF_DATASETS_CACHE', str(tmp_path / 'ds'))
  t0 = time.monotonic()
  with pytest.raises(data.TaskUnavailableError) as err:
    data.load_task(task, 'test', 4)
  assert time.monotonic() - t0 < 10
  msg = str(err.value)
  assert f"'{task}'" in msg and 'local_path' in msg and '\n' not in msg


def test_unknown_task():
  with pytest.raises(ValueError, match=r"unknown task 'wmt99'; known tasks: bible_en_es, cnndm, ende"):
    data.load_task('wmt99', 'test')


# ----------------------------------------------------------------------------- local JSONL

def _write(path, lines, gz=False):
  text = ''.join(line if isinstance(line, str) else json.dumps(line) + '\n' for line in lines)
  if gz:
    with gzip.open(path, 'wt', encoding='utf-8') as f:
      f.write(text)
  else:
    path.write_text(text, encoding='utf-8')
  return path


def test_load_jsonl_reads_plain_gz_and_dotted(tmp_path):
  p = _write(tmp_path / 'a.jsonl', [{'en': 'a', 'de': 'b'}, '\n', {'en': 'c', 'de': 'd'}])
  assert data.load_jsonl(p, 'en', 'de') == (['a', 'c'], ['b', 'd'])
  g = _write(tmp_path / 'a.jsonl.gz', [{'translation': {'en': 'x', 'de': 'ü'}}], gz=True)
  assert data.load_jsonl(g, 'translation.en', 'translation.de') == (['x'], ['ü'])


def test_load_task_local_path_adds_prefix_once(tmp_path):
  p = _write(tmp_path / 'wmt.jsonl', [{'en': 'Hello.', 'de': 'Hallo.'},
                                      {'en': 'translate English to German: Hi.', 'de': 'Hi.'}])
  sources, refs = data.load_task('ende', local_path=p)
  assert sources == ['translate English to German: Hello.', 'translate English to German: Hi.']
  assert refs == ['Hallo.', 'Hi.']
  assert data.load_task('ende', local_path=p, num_examples=1)[0] == sources[:1]


def test_load_jsonl_errors_name_file_and_field(tmp_path):
  missing = tmp_path / 'nope.jsonl'
  with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
    data.load_jsonl(missing, 'en', 'de')
  p = _write(tmp_path / 'b.jsonl', [{'en': 'a', 'de': 'b'}, {'en': 'c', 'fr': 'd'}])
  with pytest.raises(ValueError, match=re.escape(f"{p}:2: no field 'de' (has: en, fr)")):
    data.load_jsonl(p, 'en', 'de')
  with pytest.raises(ValueError, match=re.escape(f"{p}:1: no field 'source' or 'article'")):
    data.load_task('cnndm', local_path=p)
  bad = _write(tmp_path / 'c.jsonl', [{'en': 'a', 'de': 'b'}, '{oops\n'])
  with pytest.raises(ValueError, match=re.escape(f'{bad}:2: not valid JSON')):
    data.load_jsonl(bad, 'en', 'de')
  num = _write(tmp_path / 'd.jsonl', [{'en': 'a', 'de': 3}])
  with pytest.raises(ValueError, match=re.escape(f"{num}:1: non-string (int) field 'de'")):
    data.load_jsonl(num, 'en', 'de')
  empty = _write(tmp_path / 'e.jsonl', ['\n'])
  with pytest.raises(ValueError, match=re.escape(f'{empty}: no examples')):
    data.load_jsonl(empty, 'en', 'de')


@pytest.mark.parametrize('task', sorted(data.TASKS))
def test_documented_local_schema_for_every_task(tmp_path, task):
  # README / configs/common.py: `local_data` is a JSONL file with {"source", "reference"} per line.
  p = _write(tmp_path / 'mine.jsonl', [{'source': 'One.', 'reference': 'Uno.'},
                                       {'source': 'Two.', 'reference': 'Dos.', 'id': 7}])
  sources, refs = data.load_task(task, local_path=p)
  prefix = data.TASKS[task].prefix
  assert sources == [prefix + 'One.', prefix + 'Two.'] and refs == ['Uno.', 'Dos.']
  # The task's own field names are read too, even mixed line by line with the documented ones.
  src, ref = data.TASKS[task].local_fields
  q = _write(tmp_path / 'own.jsonl', [{src: 'One.', ref: 'Uno.'},
                                      {'source': 'Two.', 'reference': 'Dos.'}])
  assert data.load_task(task, local_path=q) == (sources, refs)


def test_bad_lines_are_one_line_data_errors(tmp_path):
  cases = {
      'json': ([{'source': 'a', 'reference': 'b'}, '{"source": "a",\n'], ':2: not valid JSON'),
      'list': (['["a", "b"]\n'], ":1: no field 'source' or 'en' (has: a JSON list)"),
      'ref': ([{'source': 'a', 'ref': 'b'}], ":1: no field 'reference' (has: source, ref)"),
      'int': ([{'source': 'a', 'reference': 3}], ":1: non-string (int) field 'reference'"),
  }
  for name, (lines, want) in cases.items():
    p = _write(tmp_path / f'{name}.jsonl', lines)
    with pytest.raises(data.DataError) as err:
      data.load_task('bible_en_es', local_path=p)
    assert str(err.value).startswith(f'{p}{want}'), (name, str(err.value))
    assert '\n' not in str(err.value)
  latin1 = tmp_path / 'latin1.jsonl'
  latin1.write_bytes('{"source": "a", "reference": "b"}\n{"source": "ni\u00f1o"}\n'.encode('latin-1'))
  with pytest.raises(data.DataError, match=re.escape(f'{latin1}:2: not UTF-8')):
    data.load_task('bible_en_es', local_path=latin1)
  broken = tmp_path / 'broken.jsonl.gz'
  broken.write_bytes(gzip.compress(b'{"source": "a", "reference": "b"}\n' * 50)[:40])
  with pytest.raises(data.DataError, match=re.escape(f'{broken}:') + r'\d+: unreadable'):
    data.load_task('bible_en_es', local_path=broken)
  assert issubclass(data.DataError, ValueError)


def test_data_error_is_a_config_error():
  # The runner turns a ConfigError into one line on stderr and exit code 2.
  errors = pytest.importorskip('specjax.errors')
  assert issubclass(data.DataError, errors.ConfigError)


def test_tiny_pair_dir_holds_the_pair_and_the_head_within_60_mb():
  for name in ('target', 'draft'):
    assert (data.TINY_PAIR_DIR / name / 'config.json').is_file(), name
  assert (data.TINY_PAIR_DIR / 'head' / 'head_config.json').is_file()
  assert (data.TINY_PAIR_DIR / 'head' / 'head.safetensors').stat().st_size <= 5e6
  shipped = sum(f.stat().st_size for f in data.ASSETS_DIR.rglob('*') if f.is_file())
  assert shipped <= 60e6, shipped  # corpus, tokenizer, target, draft and head together
