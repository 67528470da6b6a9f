"""The README stays true: its test command is what CI runs (from the lock), its model table is what
the code computes, and no page quotes a figure from another time."""

import importlib
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _quickstart_commands():
  readme = (ROOT / 'README.md').read_text()
  block = readme.split('## Quickstart', 1)[1].split('```bash', 1)[1].split('```', 1)[0]
  return [line.strip() for line in block.splitlines()
          if line.strip() and not line.strip().startswith('#')]


def test_ci_runs_the_readme_test_command():
  commands = _quickstart_commands()
  assert len(commands) == 2, commands
  ci = (ROOT / '.ci' / 'run').read_text().splitlines()
  assert commands[1] in [line.strip() for line in ci], (
      f'.ci/run must run the README test command verbatim: {commands[1]!r}')


def test_ci_installs_from_the_lock():
  commands = _quickstart_commands()
  assert 'pip install -r requirements/lock.txt' in commands[1]
  lock = (ROOT / 'requirements' / 'lock.txt').read_text()
  pins = re.findall(r'^([A-Za-z0-9_.-]+)==(\S+)', lock, re.M)
  names = {n.lower() for n, _ in pins}
  assert {'jax', 'jaxlib', 'flax', 'numpy', 'transformers', 'pytest'} <= names, names
  assert 'torch' not in names  # installed first and apart (requirements/overrides.txt)
  hashed = re.findall(r'^[A-Za-z0-9_.-]+==\S+ \\\n\s+--hash=sha256:', lock, re.M)
  assert len(hashed) == len(pins), 'every pin carries its hashes'


def test_model_table_is_computed():
  sys.path.insert(0, str(ROOT / 'scripts'))
  import model_table  # pylint: disable=import-outside-toplevel
  page = (ROOT / 'docs' / 'models.md').read_text()
  found = re.search(r'<!-- fig:model-table -->\n(.*?)\n<!-- /fig:model-table -->', page, re.S)
  assert found, 'docs/models.md lost its model table region'
  assert found.group(1).strip() == model_table.table().strip(), (
      'docs/models.md model table is stale: run python scripts/render_docs.py')


def test_no_figure_is_quoted_from_another_time():
  # Figures are rendered from records (scripts/render_docs.py); history stays in git.
  stale = re.compile(r'measured (before|earlier)|(an|the) earlier (run|host|session|measurement)|'
                     r'(with|on) the previous (pair|target|draft|host)|published before|'
                     r'\bwithdrawn\b', re.I)
  for path in [ROOT / 'README.md', *(ROOT / 'docs').glob('*.md')]:
    for number, line in enumerate(path.read_text().splitlines(), 1):
      assert not stale.search(line), f'{path.relative_to(ROOT)}:{number}: {line.strip()}'


def test_presets_match_public_parameter_counts():
  from specjax.models import presets
  from specjax.models.t5 import param_count
  # Published sizes (T5 paper / model cards), in millions, within 2%.
  published = {'t5-small': 60.5, 't5-base': 222.9, 't5-large': 737.7, 't5-3b': 2851.6,
               't5-11b': 11307.3, 'google/t5-v1_1-small': 76.96, 'google/t5-v1_1-xxl': 11135.3}
  for name, millions in published.items():
    got = param_count(presets.preset(name)) / 1e6
    assert abs(got - millions) / millions < 0.02, (name, got, millions)


def test_documented_config_arguments_parse():
  # Every `--config=configs/X.py:ARG` written in a config docstring, the README or docs/ must be
  # an argument that file's get_config accepts (a bare size like ':xxl' once was not).
  files = [*(ROOT / 'configs').rglob('*.py'), ROOT / 'README.md', *(ROOT / 'docs').glob('*.md')]
  seen = set()
  for path in files:
    seen.update(re.findall(r'--config=(configs/[\w/]+)\.py:([\w=,]+)', path.read_text()))
  assert len(seen) >= 10, seen
  sys.path.insert(0, str(ROOT))
  for module, arg in sorted(seen):
    config = importlib.import_module(module.replace('/', '.')).get_config(arg)
    assert config.name, (module, arg)


def _anchor(heading: str) -> str:
  """GitHub's anchor of a Markdown heading."""
  text = re.sub(r'[^\w\- ]', '', heading.strip().lower())
  return text.replace(' ', '-')


def test_links_between_pages_resolve():
  pages = [ROOT / 'README.md', *(ROOT / 'docs').glob('*.md')]
  for page in pages:
    text = page.read_text()
    for target in re.findall(r'\]\(([^)\s]+)\)', text):
      if re.match(r'\w+://', target):
        continue
      path, _, anchor = target.partition('#')
      dest = (page.parent / path).resolve() if path else page
      assert dest.exists(), f'{page.relative_to(ROOT)}: broken link {target}'
      if anchor and dest.suffix == '.md':
        headings = re.findall(r'^#+ (.+)$', dest.read_text(), re.M)
        assert anchor in {_anchor(h) for h in headings}, (
            f'{page.relative_to(ROOT)}: no heading #{anchor} in {dest.relative_to(ROOT)}')


def test_performance_page_stays_curated():
  # Current results only, rendered from docs/results/ (history stays in git).
  lines = (ROOT / 'docs' / 'performance.md').read_text().splitlines()
  assert len(lines) <= 300, f'docs/performance.md has {len(lines)} lines (at most 300)'
