"""Bad input to `python -m specjax.run`: a one-line error naming the field, before loading anything."""

import dataclasses
import os
import shutil
import subprocess
import sys
import time

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
    ('drafts', ('runs/a/export', 'runs/b/export/'), "config.drafts: 'runs/a/export' and"),
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


# ----------------------------------------------------------------------------- the command line

TINY_TARGET = os.path.join(ROOT, 'specjax', 'assets', 'tiny_pair', 'target')
NO_DATASETS = 'import sys, runpy; sys.modules["datasets"] = None; runpy.run_module("specjax.run", run_name="__main__")'


def _broken_checkpoint(tmp, name, weights: bytes):
  """The tiny target's config and tokenizer with `weights` as model.safetensors."""
  d = tmp / name
  d.mkdir()
  for f in os.listdir(TINY_TARGET):
    if f != 'model.safetensors':
      shutil.copy(os.path.join(TINY_TARGET, f), d / f)
  (d / 'model.safetensors').write_bytes(weights)
  return str(d)


def _bad_jsonl(tmp):
  path = tmp / 'bad.jsonl'
  path.write_text('{"source": "a", "reference": "b"}\n{"source": "c", "reference": \n')
  return str(path)


# (name, extra arguments (callables get the shared tmp dir), the stderr line must contain this)
BAD_INPUTS = [
    ('missing config file', ['--config=configs/nope.py'], '--config: config file not found'),
    ('bad config argument', ['--config=configs/tiny.py:bogus'], "argument 'bogus' unknown"),
    ('unknown key', ['--config.nope=1'], 'config.nope: unknown config key'),
    ('near-miss key', ['--config.temperature=-1'],
     'config.temperature: unknown config key; did you mean "temperatures"?'),
    ('override without value', ['--config.gammas'], 'config.gammas: no value'),
    ('unparsable value', ['--config.top_k=abc'], 'config.top_k'),
    ('stray argument', ['extra'], 'unexpected arguments: extra'),
    ('gamma 0', ['--config.gammas=0'], 'config.gammas'),
    ('negative temperature', ['--config.temperatures=-1'], 'config.temperatures: must be >= 0'),
    ('top_p out of range', ['--config.top_p=1.5'], 'config.top_p'),
    ('unknown task', ['--config.tasks=xsum'], 'config.tasks'),
    ('unknown dtype', ['--config.dtype=float16'], 'config.dtype'),
    ('batch size 0', ['--config.batch_size=0'], 'config.batch_size'),
    ('unknown draft', ['--config.drafts=unigrm'], 'config.drafts[0]: unknown draft'),
    ('missing checkpoint', ['--config.target=/nonexistent/model'], 'config.target'),
    ('empty safetensors', [lambda t: '--config.target=' + _broken_checkpoint(t, 'empty', b'')],
     'model.safetensors is not a readable safetensors file'),
    ('corrupt safetensors',
     [lambda t: '--config.target=' + _broken_checkpoint(t, 'corrupt', b'\x10\x00' * 40)],
     'model.safetensors is not a readable safetensors file'),
    ('missing local data', ['--config.local_data=/nonexistent/data.jsonl'], 'config.local_data'),
    ('malformed JSONL line', [lambda t: '--config.local_data=' + _bad_jsonl(t)],
     'bad.jsonl line 2: not JSON'),
    ('mesh not matching the devices', ['--config.mesh_shape=2,4'], 'config.mesh_shape'),
    ('datasets package missing', ['--config.tasks=ende', NO_DATASETS],
     '--config.local_data=FILE.jsonl'),
]


@pytest.fixture(scope='module')
def bad_runs(tmp_path_factory):
  """Every BAD_INPUTS command, run as a real `python -m specjax.run` (four at a time)."""
  tmp = tmp_path_factory.mktemp('bad_inputs')
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  procs = {}
  for name, args, _ in BAD_INPUTS:
    args = [a(tmp) if callable(a) else a for a in args]
    out_dir = tmp / name.replace(' ', '_')
    head = [sys.executable, '-m', 'specjax.run']
    if NO_DATASETS in args:
      args.remove(NO_DATASETS)
      head = [sys.executable, '-c', NO_DATASETS]
    cmd = head + args + [f'--config.output_dir={out_dir}', '--config.compilation_cache=']
    while sum(p.poll() is None for p, _ in procs.values()) >= 4:  # at most four at a time
      time.sleep(0.05)
    procs[name] = (subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True), out_dir)
  out = {}
  for name, (p, out_dir) in procs.items():
    stdout, stderr = p.communicate(timeout=300)
    out[name] = (p.returncode, stdout, stderr, out_dir)
  return out


@pytest.mark.parametrize('name,args,needle', BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_no_results(bad_runs, name, args, needle):
  del args
  rc, stdout, stderr, out_dir = bad_runs[name]
  lines = [l for l in stderr.splitlines() if l.strip()]
  assert rc == 2, stderr
  assert len(lines) == 1 and lines[0].startswith('specjax.run: '), stderr
  assert needle in lines[0], lines[0]
  assert not stdout.strip(), stdout  # nothing ran: no table, no progress
  assert not out_dir.exists()


def test_help_lists_every_config_field_with_its_doc():
  proc = subprocess.run([sys.executable, '-m', 'specjax.run', '--help'], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  for field in dataclasses.fields(config_lib.RunSpec):
    doc = field.metadata['doc']
    assert doc, field.name
    assert any(l.split()[:1] == [f'--config.{field.name}'] and doc in l for l in lines), field.name


def test_config_fields_are_listed_once():
  # configs/common.py builds the default ConfigDict from RunSpec: same keys, same defaults.
  from configs import common  # pylint: disable=import-outside-toplevel
  base = common.base_config()
  fields = dataclasses.fields(config_lib.RunSpec)
  assert list(base.keys()) == sorted(f.name for f in fields) or set(base.keys()) == {
      f.name for f in fields}
  for f in fields:
    assert base[f.name] == f.default, f.name
  assert config_lib.run_spec(base.to_dict() | {'target': TINY_TARGET, 'drafts': ('bigram',),
                                               'tasks': ('bible_en_es',)}).top_p == 1.0


def test_missing_key_named_and_suggestions():
  d = tiny.get_config().to_dict()
  d['gama'] = 3
  with pytest.raises(config_lib.ConfigError, match='config.gama: unknown config key; did you mean '
                                                   '"gammas"'):
    config_lib.run_spec(d)


@pytest.mark.parametrize('name', ['t5xxl_small', 't5xxl_base', 't5xxl_large', 't5xxl_unigram',
                                  't5xxl_bigram'])
@pytest.mark.parametrize('arg', [None, 'v11', 'smoke'])
def test_paper_configs_validate_offline(name, arg):
  import importlib  # pylint: disable=import-outside-toplevel
  spec = config_lib.run_spec(importlib.import_module(f'configs.{name}').get_config(arg))
  assert spec.tasks == ('ende', 'cnndm')
  assert spec.target == ('google/t5-v1_1-xxl' if arg == 'v11' else 't5-11b')


def test_import_and_flag_errors_do_not_import_jax():
  """`import specjax` is lazy and the command line validates flags before importing JAX, so a
  typo fails in a fraction of a second (JAX's import alone takes ~3 s)."""
  code = ('import sys, specjax\n'
          "assert 'jax' not in sys.modules\n"
          "sys.argv = ['specjax.run', '--config.gammas=0']\n"
          'import specjax.run\n'
          'try:\n'
          '  specjax.run.cli()\n'
          'except SystemExit as e:\n'
          "  assert e.code == 2 and 'jax' not in sys.modules, e.code\n"
          'else:\n'
          "  raise AssertionError('no exit')\n"
          'print(specjax.speculative_decode.__name__, specjax.stopping.Confidence.__name__)\n')
  proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'), timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.split() == ['speculative_decode', 'Confidence']
  assert 'config.gammas' in proc.stderr
