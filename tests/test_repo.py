"""The README stays true: its test command is what CI runs, its model table is what the code computes."""

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


def test_readme_model_table_is_computed():
  import sys
  sys.path.insert(0, str(ROOT / 'scripts'))
  import model_table  # pylint: disable=import-outside-toplevel
  readme = (ROOT / 'README.md').read_text()
  found = re.search(r'<!-- model-table:start -->\n(.*?)\n<!-- model-table:end -->', readme, re.S)
  assert found, 'README lost its model table markers'
  assert found.group(1).strip() == model_table.table().strip(), (
      'README model table is stale: paste the output of python scripts/model_table.py')


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
