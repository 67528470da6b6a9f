"""Bad input to `python -m specjax.run`: a one-line error naming the field, before loading anything."""

import os
import subprocess
import sys

import pytest

from specjax.runner import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configs import tiny  # pylint: disable=wrong-import-position


@pytest.mark.parametrize('field,value,needle', [
    ('gammas', (0,), 'config.gammas'),
    ('temperatures', (-0.5,), 'config.temperatures'),
    ('top_p', 0.0, 'config.top_p'),
    ('top_p', 1.5, 'config.top_p'),
    ('top_k', -1, 'config.top_k'),
    ('max_new_tokens', 0, 'config.max_new_tokens'),
    ('num_examples', -3, 'config.num_examples'),
    ('batch_size', 0, 'config.batch_size'),
    ('tasks', ('xsum',), 'config.tasks'),
    ('dtype', 'float16', 'config.dtype'),
    ('matmul_precision', 'fp64', 'config.matmul_precision'),
    ('mesh_shape', (2, 0), 'config.mesh_shape'),
    ('local_data', '/nonexistent/file.jsonl', 'config.local_data'),
])
def test_bad_values_name_the_field(field, value, needle):
  c = tiny.get_config()
  c[field] = value
  with pytest.raises(config_lib.ConfigError, match=needle.replace('.', r'\.')) as e:
    config_lib.run_spec(c)
  assert '\n' not in str(e.value)


def test_matmul_precision_is_applied_by_setup_jax():
  import jax  # pylint: disable=import-outside-toplevel
  from specjax.runner import setup  # pylint: disable=import-outside-toplevel
  c = tiny.get_config()
  c.matmul_precision, c.compilation_cache = 'highest', ''
  before = jax.config.jax_default_matmul_precision
  try:
    setup.setup_jax(config_lib.run_spec(c))
    assert jax.config.jax_default_matmul_precision == 'highest'
  finally:
    jax.config.update('jax_default_matmul_precision', before)


def test_missing_checkpoint_and_unknown_key(tmp_path):
  c = tiny.get_config()
  c.target = str(tmp_path / 'no_such_model')
  with pytest.raises(config_lib.ConfigError, match='config.target: checkpoint directory not found'):
    config_lib.run_spec(c)
  d = dict(tiny.get_config().to_dict(), gama=3)
  with pytest.raises(config_lib.ConfigError, match='config.gama: unknown config key'):
    config_lib.run_spec(d)


def test_vocab_mismatch_is_caught_from_config_json(tmp_path):
  for name, vocab in (('t', 100), ('d', 64)):
    (tmp_path / name).mkdir()
    (tmp_path / name / 'config.json').write_text(f'{{"vocab_size": {vocab}}}')
  c = tiny.get_config()
  c.target, c.drafts = str(tmp_path / 't'), (str(tmp_path / 'd'),)
  with pytest.raises(config_lib.ConfigError, match=r'config.drafts\[0\]: vocab_size 64'):
    config_lib.run_spec(c)


def test_hub_ids_pass_validation_without_network():
  c = tiny.get_config()
  c.target, c.drafts = 't5-11b', ('t5-small', 'google/t5-v1_1-small', 'unigram')
  spec = config_lib.run_spec(c)
  assert spec.draft_label('google/t5-v1_1-small') == 't5-v1_1-small'


def test_cli_exits_nonzero_with_one_line_and_no_results(tmp_path):
  out_dir = tmp_path / 'out'
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  proc = subprocess.run(
      [sys.executable, '-m', 'specjax.run', '--config=configs/tiny.py', '--config.gammas=0',
       f'--config.output_dir={out_dir}'], cwd=ROOT, env=env, capture_output=True, text=True,
      timeout=120)
  assert proc.returncode != 0
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert lines[-1].startswith('specjax.run: config.gammas'), proc.stderr
  assert not out_dir.exists()
  # Unknown override keys are refused by ml_collections before our code runs.
  proc = subprocess.run(
      [sys.executable, '-m', 'specjax.run', '--config=configs/tiny.py', '--config.gama=3'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0 and 'gama' in proc.stderr


@pytest.mark.parametrize('name', ['t5xxl_small', 't5xxl_base', 't5xxl_large', 't5xxl_unigram',
                                  't5xxl_bigram'])
@pytest.mark.parametrize('arg', [None, 'v11', 'smoke'])
def test_paper_configs_validate_offline(name, arg):
  import importlib  # pylint: disable=import-outside-toplevel
  spec = config_lib.run_spec(importlib.import_module(f'configs.{name}').get_config(arg))
  assert spec.tasks == ('ende', 'cnndm')
  assert spec.target == ('google/t5-v1_1-xxl' if arg == 'v11' else 't5-11b')
