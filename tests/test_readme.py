"""The README is short, and every Python block of it runs as written (offline, on the shipped pair).

A block preceded by `<!-- readme-test: needs-hub -->` needs the network; offline with an empty
Hugging Face cache it must stop at once with a one-line error naming the model.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NEEDS_HUB = '<!-- readme-test: needs-hub -->'


def readme_blocks():
  """(needs_hub, code, first line number) of each ```python block of the README."""
  text = (ROOT / 'README.md').read_text(encoding='utf-8')
  blocks = []
  for found in re.finditer(r'(?P<mark><!-- readme-test: [\w-]+ -->\n)?```python\n(?P<code>.*?)```',
                           text, re.S):
    mark = (found.group('mark') or '').strip()
    assert mark in ('', NEEDS_HUB), f'unknown README test mark {mark!r}'
    blocks.append((bool(mark), found.group('code'), text[:found.start('code')].count('\n') + 1))
  return blocks


def _run(code, tmp_path, **env):
  full_env = {**os.environ, 'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1',
              'JAX_PLATFORMS': 'cpu',
              'PYTHONPATH': str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', ''), **env}
  return subprocess.run([sys.executable, '-c', code], cwd=tmp_path, env=full_env,
                        capture_output=True, text=True, timeout=600)


def test_readme_reads_in_five_minutes():
  lines = (ROOT / 'README.md').read_text(encoding='utf-8').splitlines()
  assert len(lines) <= 150, f'README.md has {len(lines)} lines (at most 150: move detail to docs/)'


def test_readme_has_python_blocks():
  blocks = readme_blocks()
  assert sum(not hub for hub, _, _ in blocks) >= 1 and any(hub for hub, _, _ in blocks), blocks


@pytest.mark.parametrize('index', range(len(readme_blocks())))
def test_readme_block_runs(index, tmp_path):
  needs_hub, code, line = readme_blocks()[index]
  if needs_hub:  # an empty cache: nothing the machine happens to have downloaded counts
    done = _run(code, tmp_path, HF_HOME=str(tmp_path / 'hf'))
    assert done.returncode != 0, f'README.md:{line}: a needs-hub block ran offline'
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith('FileNotFoundError:') and 'not available offline' in last, done.stderr
    first_model = re.search(r"load_\w+\('([^']+)'", code).group(1)
    assert f"'{first_model}'" in last, last
  else:
    done = _run(code, tmp_path)
    assert done.returncode == 0, f'README.md:{line}:\n{done.stderr[-3000:]}'
