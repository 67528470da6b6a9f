#!/usr/bin/env python
"""Builds specjax's shipped offline EN->ES corpus (KJV / Reina-Valera 1909) and its tokenizer.

Why: the experiments need a real translation task that trains and runs on a machine with no
network (no model or dataset hubs). Both Bibles are public domain, verse-aligned, and packaged in
Debian, so `apt-get download` (a package registry) is the only network access needed here; the
outputs are committed and specjax itself never downloads them.

Steps:
  1. `apt-get download sword-text-kjv sword-text-sparv` into a temp dir (`apt-get update` and retry
     if the first try fails), unpack with `dpkg-deb -x` (nothing is installed).
  2. Read both SWORD zText modules verse by verse with pysword (checks each module's .conf:
     ModDrv=zText, Versification=KJV, SourceType=OSIS, Encoding=UTF-8).
  3. Strip OSIS markup (Strong's <w lemma=...> wrappers, footnotes, milestones, USFM leftovers such
     as `\\nd`, pilcrows). Align: although both .conf files say Versification=KJV, the RV1909
     module keeps Spanish verse numbers in ~20 chapters (Num 13, Job 39-40, Jonah 2, ...), so each
     KJV verse is paired with the Spanish verse within +-8 keys sharing the most Strong's numbers
     (see `align`); ambiguous, dissimilar, merged/split and empty pairs are dropped.
  4. Split deterministically by a SHA-256 hash of the reference ("Gen 1:1"): buckets 0..15 of 1000
     -> dev, 16..31 -> test, rest -> train (~1.6% each, ~500 verses). Written as gzip JSONL
     ({"ref", "en", "es"}, canonical Bible order, gzip mtime 0), so reruns are byte-identical.
  5. Train a SentencePiece unigram tokenizer on train (en + es lines) with T5 ids
     (<pad>=0, </s>=1, <unk>=2, no bos, no extra_ids) and save it with transformers'
     T5Tokenizer.save_pretrained (spiece.model + tokenizer.json + configs).
  6. Write README.md (sources, versions, licences, counts, rebuild command).

Requirements (script only, not specjax runtime): Debian/Ubuntu apt with the Debian `main`
archive, dpkg-deb, and
    pip install pysword sentencepiece transformers tokenizers

Rebuild (from the repo root):
    python scripts/build_bible_corpus.py
    python scripts/build_bible_corpus.py --tokenizer-only   # retrain tokenizer from committed train split
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / 'specjax' / 'assets' / 'bible_en_es'
PACKAGES = {'en': ('sword-text-kjv', 'engKJV2006eb'), 'es': ('sword-text-sparv', 'spaRV1909eb')}
DEV_BUCKETS = range(0, 16)      # of 1000
TEST_BUCKETS = range(16, 32)
DEFAULT_VOCAB = 4000

# Names of the Hebrew letters heading each 8-verse stanza of Psalm 119. The KJV module has them as
# non-canonical <title>s (dropped below); RV1909 has them as plain text at the start of the verse,
# so they are removed there too to keep the pair parallel.
HEBREW_LETTERS = ('ALEPH BETH GIMEL DALETH HE VAU ZAIN CHETH TETH JOD CAPH LAMED MEM NUN SAMECH '
                  'AIN PE TZADDI COPH RESH SCHIN SIN SHIN TAU').split()


def log(*a):
  print(*a, flush=True)


# ----------------------------------------------------------------------------- download / unpack

def _run(cmd, cwd=None):
  return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True)


def fetch_debs(workdir: Path) -> dict[str, Path]:
  """apt-get download both packages into workdir (reusing .debs already there)."""
  names = [p for p, _ in PACKAGES.values()]
  have = {n: sorted(workdir.glob(f'{n}_*.deb')) for n in names}
  missing = [n for n in names if not have[n]]
  if missing:
    try:
      _run(['apt-get', 'download', *missing], cwd=workdir)
    except subprocess.CalledProcessError:
      log('apt-get download failed; running apt-get update and retrying')
      _run(['apt-get', 'update'])
      _run(['apt-get', 'download', *missing], cwd=workdir)
  debs = {}
  for n in names:
    found = sorted(workdir.glob(f'{n}_*.deb'))
    if len(found) != 1:
      sys.exit(f'expected exactly one {n}_*.deb in {workdir}, found {[f.name for f in found]}')
    debs[n] = found[0]
  return debs


def deb_field(deb: Path, field: str) -> str:
  return _run(['dpkg-deb', '-f', str(deb), field]).stdout.strip()


def unpack(debs: dict[str, Path], root: Path) -> Path:
  for deb in debs.values():
    _run(['dpkg-deb', '-x', str(deb), str(root)])
  return root


def read_confs(sword_root: Path) -> dict[str, dict[str, str]]:
  """module name -> its mods.d .conf entries (keys lower-cased by pysword)."""
  from pysword.modules import SwordModules
  return SwordModules(str(sword_root)).parse_modules()


# ----------------------------------------------------------------------------- reading / cleaning

def read_module(sword_root: Path, module: str, conf: dict[str, str]) -> dict[tuple, str]:
  """(osis_book, chapter, verse) -> raw OSIS text, for every verse of the KJV versification."""
  from pysword.modules import SwordModules
  for key, want in (('moddrv', 'zText'), ('versification', 'KJV'), ('sourcetype', 'OSIS'),
                    ('encoding', 'UTF-8')):
    if conf.get(key, '').lower() != want.lower():
      sys.exit(f'{module}: {key}={conf.get(key)!r}, this script expects {want}')
  modules = SwordModules(str(sword_root))
  modules.parse_modules()
  bible = modules.get_bible_from_module(module)   # reads DataPath, ModDrv, Encoding, ... from .conf
  out = {}
  for books in bible.get_structure().get_books().values():
    for book in books:
      for chapter, n_verses in enumerate(book.chapter_lengths, 1):
        for verse in range(1, n_verses + 1):
          # get() per verse (not per chapter) so an absent verse cannot shift the alignment.
          out[(book.osis_name, chapter, verse)] = bible.get(
              books=[book.osis_name], chapters=[chapter], verses=[verse], clean=False)
  return out


_NOTE = re.compile(r'<note\b[^>]*>.*?</note>', re.S)
_DROP_WITH_CONTENT = [
    _NOTE,                                                           # footnotes (with refs)
    re.compile(r'<title>\s*<foreign>.*?</title>', re.S),             # Ps 119 stanza letters
]
_TAG = re.compile(r'<[^>]*>')
_USFM = re.compile(r'\\\+?[a-z]+\d*\*?')          # leftover USFM markers, e.g. "\nd", "\+nd*"
_HEBREW = re.compile(r'[\u0590-\u05FF]+')
_SPACE_BEFORE_PUNCT = re.compile(r'\s+([,.;:!?)\]])')
_SPACE_AFTER_OPEN = re.compile(r'([(\[¿¡])\s+')


def clean(text: str) -> str:
  """Plain verse text from OSIS: keeps word content (Strong's/morph live in attributes only),
  keeps psalm titles and epistle subscriptions (RV1909 has both inside the verse text too),
  drops notes, Ps 119 stanza letters and all markup."""
  for rx in _DROP_WITH_CONTENT:
    text = rx.sub(' ', text)
  text = _TAG.sub(' ', text)
  text = html.unescape(text)
  text = _USFM.sub(' ', text)
  text = _HEBREW.sub(' ', text)
  text = text.replace('¶', ' ')
  text = ' '.join(text.split())
  text = _SPACE_BEFORE_PUNCT.sub(r'\1', text)
  text = _SPACE_AFTER_OPEN.sub(r'\1', text)
  return text.strip()


_CAPS_WORD = re.compile(r'\b[A-ZÁÉÍÓÚÑÜ]{2,}\b')


def fix_spanish(key: tuple, text: str) -> str:
  """RV1909 quirks: Ps 119 stanza letter names at verse start; the chapter's first word in
  capitals (a drop-cap convention: 'EN el principio' -> 'En el principio')."""
  book, chapter, verse = key
  if book == 'Ps' and chapter == 119:
    text = re.sub(r'^(%s)\.?\s+' % '|'.join(HEBREW_LETTERS), '', text)
  if verse == 1:
    text = _CAPS_WORD.sub(lambda m: m.group(0).capitalize(), text, count=1)
  return text


_STRONG = re.compile(r'strong:([HG]\d+)')
SHIFT_WINDOW = 8         # verses either side searched for a better Strong's match
SHIFT_MARGIN = 0.1       # Jaccard gain needed to move a pair off its own key
MIN_SIMILARITY = 0.2     # Jaccard below this: not a translation of each other (when both tagged)
LENGTH_RATIO = (0.45, 2.0)  # len(es) / len(en) in characters; outside -> split/merged verses


def strongs(raw: str) -> frozenset:
  return frozenset(_STRONG.findall(_NOTE.sub(' ', raw)))


def _jaccard(a: frozenset, b: frozenset) -> float:
  return len(a & b) / len(a | b) if a or b else 0.0


def align(keys: list, en_raw: dict, es_raw: dict, en: dict, es: dict):
  """[(en_key, es_key)] plus drop reasons.

  Both modules claim KJV versification, but the RV1909 module stores the Spanish verse numbering
  (Hebrew-style in places: Num 12:16 = 13:1, Job 38:39 = 39:1, Jonah 1:17 = 2:1, ...) under the
  KJV keys: some verses are empty, whole chapters are shifted by a verse or more, and verses that
  do not exist in KJV are appended to a chapter's last verse. Both modules tag words with Strong's
  numbers, so each English verse is paired with the Spanish verse within +-SHIFT_WINDOW keys whose
  Strong's set overlaps it most (its own key unless another is better by SHIFT_MARGIN); pairs whose
  best match is poor (< MIN_SIMILARITY) or ambiguous, whose Spanish verse is claimed twice, or whose character-length ratio
  says a verse was split or merged are dropped.
  """
  E = [strongs(en_raw[k]) for k in keys]
  P = [strongs(es_raw[k]) for k in keys]
  reasons = {'empty': [], 'dissimilar': [], 'ambiguous': [], 'claimed_twice': [], 'length_ratio': []}
  chosen = {}
  for i, key in enumerate(keys):
    if not en[key]:
      reasons['empty'].append(key)
      continue
    sims = {d: _jaccard(E[i], P[i + d]) for d in range(-SHIFT_WINDOW, SHIFT_WINDOW + 1)
            if 0 <= i + d < len(keys) and es[keys[i + d]]}
    if not sims:
      reasons['empty'].append(key)
      continue
    best = max(sims, key=lambda d: (sims[d], -abs(d)))
    if E[i] and P[i + best] and sims[best] < MIN_SIMILARITY:
      reasons['dissimilar'].append(key)
    elif best == 0 or sims[best] >= sims.get(0, 0.0) + SHIFT_MARGIN:
      chosen[i] = i + best
    else:
      reasons['ambiguous'].append(key)
  claims = {}
  for i, j in chosen.items():
    claims.setdefault(j, []).append(i)
  pairs = []
  for i, j in sorted(chosen.items()):
    if len(claims[j]) > 1:
      reasons['claimed_twice'].append(keys[i])
      continue
    ratio = len(es[keys[j]]) / len(en[keys[i]])
    if not LENGTH_RATIO[0] <= ratio <= LENGTH_RATIO[1]:
      reasons['length_ratio'].append(keys[i])
      continue
    pairs.append((keys[i], keys[j]))
  return pairs, reasons


def ref_str(key: tuple) -> str:
  return f'{key[0]} {key[1]}:{key[2]}'


def split_of(ref: str) -> str:
  bucket = int(hashlib.sha256(ref.encode('utf-8')).hexdigest()[:8], 16) % 1000
  return 'dev' if bucket in DEV_BUCKETS else 'test' if bucket in TEST_BUCKETS else 'train'


def check_clean(row: dict):
  for lang in ('en', 'es'):
    t = row[lang]
    if re.search(r'[<>\\]|\b[HG]\d{3,5}\b|strong:[HG]?\d|lemma=', t):
      sys.exit(f'markup left in {row["ref"]} [{lang}]: {t!r}')


# ----------------------------------------------------------------------------- writing

def write_jsonl_gz(path: Path, rows: list[dict]):
  """Deterministic gzip (mtime 0, no embedded file name) so reruns are byte-identical."""
  buf = io.BytesIO()
  with gzip.GzipFile(filename='', mode='wb', fileobj=buf, mtime=0, compresslevel=9) as gz:
    for row in rows:
      gz.write((json.dumps(row, ensure_ascii=False) + '\n').encode('utf-8'))
  path.write_bytes(buf.getvalue())


def read_jsonl_gz(path: Path) -> list[dict]:
  with gzip.open(path, 'rt', encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def build_corpus(out: Path, workdir: Path) -> dict:
  debs = fetch_debs(workdir)
  sword_root = unpack(debs, workdir / 'root') / 'usr' / 'share' / 'sword'
  meta = {'packages': {}, 'modules': {}}
  texts = {}
  confs = read_confs(sword_root)
  for lang, (pkg, module) in PACKAGES.items():
    conf = confs[module]
    meta['packages'][lang] = {
        'package': pkg, 'version': deb_field(debs[pkg], 'Version'), 'deb': debs[pkg].name,
        'sha256': hashlib.sha256(debs[pkg].read_bytes()).hexdigest(),
        'copyright': (workdir / 'root' / 'usr' / 'share' / 'doc' / pkg / 'copyright').read_text(),
    }
    meta['modules'][lang] = {k: conf.get(k.lower(), '') for k in (
        'Description', 'Version', 'SwordVersionDate', 'Encoding', 'SourceType', 'Versification',
        'DistributionLicense', 'CopyrightNotes')}
    meta['modules'][lang]['name'] = module
    log(f'reading {module} ({pkg} {meta["packages"][lang]["version"]}, '
        f'Encoding={conf.get("encoding")}, Versification={conf.get("versification")})')
    texts[lang] = read_module(sword_root, module, conf)

  keys = list(texts['en'])
  if keys != list(texts['es']):
    sys.exit('the two modules do not enumerate the same verse keys')
  en = {k: clean(texts['en'][k]) for k in keys}
  es = {k: fix_spanish(k, clean(texts['es'][k])) for k in keys}
  pairs, reasons = align(keys, texts['en'], texts['es'], en, es)
  rows = {'train': [], 'dev': [], 'test': []}
  shifted = []
  for en_key, es_key in pairs:
    ref = ref_str(en_key)
    row = {'ref': ref, 'en': en[en_key], 'es': es[es_key]}
    if es_key != en_key:
      shifted.append(f'{ref}={ref_str(es_key)}')
    check_clean(row)
    rows[split_of(ref)].append(row)
  out.mkdir(parents=True, exist_ok=True)
  for split, split_rows in rows.items():
    write_jsonl_gz(out / f'{split}.jsonl.gz', split_rows)
  meta['verses_total'] = len(keys)
  meta['dropped'] = {r: [ref_str(k) for k in ks] for r, ks in reasons.items()}
  meta['shifted'] = shifted
  meta['counts'] = {k: len(v) for k, v in rows.items()}
  log(f'verses in versification: {meta["verses_total"]}; paired with a shifted Spanish key: '
      f'{len(shifted)}; dropped: ' + ', '.join(f'{r}={len(v)}' for r, v in meta['dropped'].items()))
  log('pairs: ' + ', '.join(f'{k}={v}' for k, v in meta['counts'].items()))
  return meta


# ----------------------------------------------------------------------------- tokenizer

def train_tokenizer(out: Path, vocab_size: int) -> dict:
  """SentencePiece unigram on train (en + es), T5 special ids, saved via transformers."""
  import sentencepiece as spm
  from transformers import AutoTokenizer, T5Tokenizer

  train = read_jsonl_gz(out / 'train.jsonl.gz')
  tok_dir = out / 'tokenizer'
  with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    model = io.BytesIO()
    spm.set_random_generator_seed(0)
    # Sentences from an iterator and the model into memory: no temp paths end up in the model's
    # trainer_spec, so reruns give a byte-identical spiece.model.
    spm.SentencePieceTrainer.train(
        sentence_iterator=(r[lang] for r in train for lang in ('en', 'es')), model_writer=model,
        model_type='unigram', vocab_size=vocab_size, character_coverage=1.0,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece='<pad>', eos_piece='</s>',
        unk_piece='<unk>', num_threads=1, normalization_rule_name='nmt_nfkc',
        max_sentence_length=8192, minloglevel=2)
    (tmp / 'spiece.model').write_bytes(model.getvalue())
    if tok_dir.exists():
      shutil.rmtree(tok_dir)
    # from_pretrained on a directory holding spiece.model converts it (transformers 5's
    # T5Tokenizer(vocab_file=...) ignores a .model file and builds an empty vocab).
    tok = T5Tokenizer.from_pretrained(str(tmp), extra_ids=0)
    tok.save_pretrained(str(tok_dir))
    # transformers 5 writes only tokenizer.json + tokenizer_config.json; ship spiece.model too so
    # transformers 4's sentencepiece-backed T5Tokenizer (and plain sentencepiece) can load it.
    shutil.copy(tmp / 'spiece.model', tok_dir / 'spiece.model')
  # transformers 5 writes `extra_special_tokens: ["<pad>", "</s>"]` (a list; transformers 4 expects
  # a dict and fails with "'list' object has no attribute 'keys'") plus load-time bookkeeping
  # (is_local, local_files_only). pad/eos/unk are named explicitly, so drop those keys.
  config_path = tok_dir / 'tokenizer_config.json'
  config = json.loads(config_path.read_text(encoding='utf-8'))
  for key in ('extra_special_tokens', 'additional_special_tokens', 'is_local', 'local_files_only'):
    config.pop(key, None)
  config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + '\n', encoding='utf-8')
  tok = AutoTokenizer.from_pretrained(str(tok_dir))
  ids = {'pad': tok.pad_token_id, 'eos': tok.eos_token_id, 'unk': tok.unk_token_id}
  if ids != {'pad': 0, 'eos': 1, 'unk': 2}:
    raise SystemExit(f'unexpected special ids {ids}')
  sample = 'Y dijo Dios: Júntense las aguas; ¿quién es éste? El niño añadió: ¡Ay!'
  if tok.decode(tok(sample).input_ids, skip_special_tokens=True) != sample:
    raise SystemExit('tokenizer does not round-trip ' + repr(sample))
  sp = spm.SentencePieceProcessor(model_file=str(tok_dir / 'spiece.model'))
  probe = [r[lang] for r in train[:2000] for lang in ('en', 'es')]
  if [sp.encode(t) + [1] for t in probe] != tok(probe).input_ids:
    raise SystemExit('tokenizer.json and spiece.model disagree')
  stats = {'vocab_size': len(tok)}
  for lang in ('en', 'es'):
    lens = [len(x) for x in tok([r[lang] for r in train]).input_ids]   # includes </s>
    stats[f'mean_tokens_{lang}'] = sum(lens) / len(lens)
    stats[f'max_tokens_{lang}'] = max(lens)
    stats[f'p99_tokens_{lang}'] = sorted(lens)[int(0.99 * len(lens))]
  unk = sum(i == 2 for r in train for lang in ('en', 'es') for i in tok(r[lang]).input_ids)
  stats['unk_in_train'] = unk
  log('tokenizer: ' + ', '.join(f'{k}={v:.1f}' if isinstance(v, float) else f'{k}={v}'
                                for k, v in stats.items()))
  return stats


# ----------------------------------------------------------------------------- README

def write_readme(out: Path, meta: dict, tok: dict, vocab_size: int):
  sizes = {p.relative_to(out).as_posix(): p.stat().st_size
           for p in sorted(out.rglob('*')) if p.is_file() and p.name != 'README.md'}
  def lic(lang):
    text = meta['packages'][lang]['copyright']
    m = re.search(r'^Files: \*\n(.*?)(?=\n\n|\Z)', text, re.S | re.M)
    return '\n'.join('    ' + line for line in (m.group(0) if m else text).splitlines())
  p, mo, c = meta['packages'], meta['modules'], meta['counts']
  lines = [
      '# bible_en_es: English -> Spanish verse pairs (KJV / Reina-Valera 1909)',
      '',
      'A small, real, offline translation corpus shipped with specjax so a tiny T5 target/draft',
      'pair can be trained and `python -m specjax.run` can run with no network.',
      'Generated by `scripts/build_bible_corpus.py`; do not edit by hand.',
      '',
      '## Sources',
      '',
      f'- English: King James Version, SWORD module `{mo["en"]["name"]}` (module version '
      f'{mo["en"]["Version"]}, {mo["en"]["SwordVersionDate"]}), Debian package '
      f'`{p["en"]["package"]}` {p["en"]["version"]} (`{p["en"]["deb"]}`, sha256 '
      f'{p["en"]["sha256"]}).',
      f'- Spanish: Reina-Valera 1909, SWORD module `{mo["es"]["name"]}` (module version '
      f'{mo["es"]["Version"]}, {mo["es"]["SwordVersionDate"]}), Debian package '
      f'`{p["es"]["package"]}` {p["es"]["version"]} (`{p["es"]["deb"]}`, sha256 '
      f'{p["es"]["sha256"]}).',
      '- Both modules: zText, OSIS markup, Encoding=UTF-8, `Versification=KJV` in their .conf.',
      '',
      '## Alignment',
      '',
      'Both modules store text under the same 31,102 KJV verse keys, but the RV1909 module keeps',
      'Spanish (Hebrew-style) verse numbers in some chapters: e.g. KJV Num 12:16 is Spanish 13:1, so',
      'Spanish Num 13 is shifted by one verse and its extra last verse is appended to 13:33; likewise',
      'Job 38-40, 1 Sam 24, Num 30, 1 Chr 21, 2 Chr 33, 1 Kgs 22, Hos 12, Jonah 2, ... Both modules tag',
      'words with Strong\'s numbers, so each English verse is paired with the Spanish verse, within',
      '8 keys either side, whose Strong\'s set has the highest Jaccard overlap (its own key unless',
      'another is better by 0.1). `ref` is always the KJV reference of the English verse.',
      '',
      f'{len(meta["shifted"])} pairs use a Spanish verse stored under another key. Dropped:',
      *[f'- {r.replace("_", " ")}: {len(v)}' for r, v in meta['dropped'].items()],
      '',
      '(empty: no Spanish text near; dissimilar: best overlap < 0.2; ambiguous: a neighbour matches',
      'about as well as the own key; claimed twice: two English verses map to one Spanish verse,',
      'i.e. merged verses; length ratio: Spanish/English characters outside [0.45, 2.0], i.e. split',
      'verses). The lists and the shifted pairs are in `meta.json`.',
      '',
      '## Licence',
      '',
      'Both texts are in the public domain. The SWORD module .conf files say '
      f'`DistributionLicense={mo["en"]["DistributionLicense"]}` (KJV) and '
      f'`DistributionLicense={mo["es"]["DistributionLicense"]}` (RV1909), and:',
      f'"{mo["es"]["CopyrightNotes"]}"',
      '',
      f'Debian `{p["en"]["package"]}` copyright file (upstream text):',
      '',
      lic('en'),
      '',
      f'Debian `{p["es"]["package"]}` copyright file (upstream text):',
      '',
      lic('es'),
      '',
      '(The Debian packaging files themselves, not included here, are GPL-2+.)',
      '',
      '## Contents',
      '',
      '`{train,dev,test}.jsonl.gz`: one JSON object per line, `{"ref": "Gen 1:1", "en": ..., "es": ...}`,',
      'in canonical order. `ref` uses OSIS book abbreviations.',
      '',
      '| split | pairs |',
      '|---|---|',
      *[f'| {k} | {v} |' for k, v in c.items()],
      f'| total | {sum(c.values())} |',
      '',
      'Split: SHA-256 of `ref`, first 8 hex digits mod 1000: 0-15 -> dev, 16-31 -> test, rest -> train',
      '(random verses across all books, so dev/test match the train distribution; parallel passages',
      'such as Kings/Chronicles or the synoptic gospels mean some test verses have close train',
      'neighbours; fine for a decoding-speed benchmark, not for claims about translation quality).',
      '',
      'Cleaning: Strong\'s `<w lemma=...>` wrappers, footnotes (`<note>`), milestones, line/poetry',
      'markup, `<transChange>` tags (their added words are kept), leftover USFM markers (`\\nd`),',
      'pilcrows and Hebrew letters removed; psalm titles and the epistles\' closing subscriptions',
      'kept (RV1909 has both inside the verse text too); Psalm 119 stanza letters dropped from both',
      'sides; RV1909 chapter-initial capitalised word normalised (`EN el principio` -> `En el principio`). RV1909 keeps its 1909',
      'orthography (`á` as a preposition, `fué`, `Châm`).',
      '',
      '## Tokenizer',
      '',
      f'`tokenizer/`: SentencePiece unigram, vocab {tok["vocab_size"]} (requested {vocab_size}),',
      'trained on the train split (English and Spanish lines together), nmt_nfkc normalisation,',
      'character coverage 1.0, T5 conventions: `<pad>`=0, `</s>`=1, `<unk>`=2, no bos, no',
      'extra_ids. Saved by `transformers.T5Tokenizer.save_pretrained` (spiece.model and',
      'tokenizer.json), loads with `AutoTokenizer.from_pretrained(dir)` offline.',
      '',
      f'Tokens per verse on train, including `</s>`: English mean {tok["mean_tokens_en"]:.1f} '
      f'(p99 {tok["p99_tokens_en"]}, max {tok["max_tokens_en"]}), Spanish mean '
      f'{tok["mean_tokens_es"]:.1f} (p99 {tok["p99_tokens_es"]}, max {tok["max_tokens_es"]}).',
      '',
      '## Files',
      '',
      '| file | bytes |',
      '|---|---|',
      *[f'| {k} | {v} |' for k, v in sizes.items()],
      '',
      '## Rebuild',
      '',
      '```',
      'pip install pysword sentencepiece transformers tokenizers',
      'python scripts/build_bible_corpus.py            # apt-get download + parse + split + tokenizer',
      'python scripts/build_bible_corpus.py --tokenizer-only   # retrain tokenizer only',
      '```',
      '',
      'Needs apt with the Debian `main` archive (the packages are also in Ubuntu universe) and',
      'dpkg-deb; nothing is installed. Reruns with the same package versions are byte-identical.',
      '',
  ]
  (out / 'README.md').write_text('\n'.join(lines), encoding='utf-8')


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--out', type=Path, default=DEFAULT_OUT)
  ap.add_argument('--workdir', type=Path, default=None,
                  help='where .debs are downloaded/unpacked (default: a temp dir, removed after); '
                       'existing .debs there are reused')
  ap.add_argument('--vocab-size', type=int, default=DEFAULT_VOCAB)
  ap.add_argument('--tokenizer-only', action='store_true',
                  help='retrain the tokenizer from the existing train split; README is refreshed '
                       'from meta.json')
  args = ap.parse_args(argv)
  out = args.out
  meta_path = out / 'meta.json'
  if args.tokenizer_only:
    if not meta_path.exists():
      sys.exit(f'{meta_path} missing: run without --tokenizer-only first')
    meta = json.loads(meta_path.read_text(encoding='utf-8'))
  else:
    if args.workdir is None:
      with tempfile.TemporaryDirectory() as tmp:
        meta = build_corpus(out, Path(tmp))
    else:
      args.workdir.mkdir(parents=True, exist_ok=True)
      meta = build_corpus(out, args.workdir)
    meta_path.write_text(json.dumps(meta, indent=1, ensure_ascii=False) + '\n', encoding='utf-8')
  tok = train_tokenizer(out, args.vocab_size)
  write_readme(out, meta, tok, args.vocab_size)
  total = sum(p.stat().st_size for p in out.rglob('*') if p.is_file())
  log(f'wrote {out} ({total / 1e6:.2f} MB)')


if __name__ == '__main__':
  main()
