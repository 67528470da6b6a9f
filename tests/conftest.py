"""Shared pytest fixtures.

Environment first (before jax/transformers are imported anywhere): CPU JAX, no hub network.
Heavy imports (torch, transformers) happen inside the fixtures, so tests that do not use them
do not pay for them.
"""

import os

os.environ['HF_HUB_OFFLINE'] = '1'
os.environ['TRANSFORMERS_OFFLINE'] = '1'
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# The suite is compile-bound (tiny models; a speculative program took ~8 s of XLA:CPU compilation
# with the default flags and ~0.2 s to run), so XLA's backend optimisations (LLVM -O2 and its
# expensive passes) cost more than they save here; even the 100,000-row stop-rule law tests, whose
# time is mostly running, take as long at -O0 with the emitters below (measured: their module
# 2:54 against 2:59 optimised). They change no semantics; every exactness check is unaffected
# (greedy identity and parity run with the same flags on both sides). The benchmarks, the runner
# and users keep the default. Set in the environment so the CLI/notebook/benchmark subprocesses
# get it too.
os.environ.setdefault('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')
# XLA:CPU's MLIR fusion emitters compile a test program ~2.5x slower than the legacy elemental
# emitters at -O0 (measured: the tiny pair's speculative program 5.0 s -> 1.9 s of XLA compilation;
# optimised, 9.7 s -> 8.9 s). Same HLO, same semantics; only the code generator differs.
TEST_XLA_FLAGS = '--xla_cpu_use_fusion_emitters=false'
if TEST_XLA_FLAGS not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' + TEST_XLA_FLAGS).strip()
# One persistent compilation cache for this pytest run, shared by the xdist workers and every
# subprocess they start (runner CLI, notebook, README blocks, benchmark smokes compile the same
# programs of the shipped pair); removed when the run ends. Keys include the program, shapes,
# flags and backend, so a hit is the same executable.
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  import tempfile  # pylint: disable=wrong-import-position
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(prefix='specjax_test_xla_')
  os.environ['SPECJAX_TEST_OWNS_CACHE'] = os.environ['JAX_COMPILATION_CACHE_DIR']
# With the legacy emitters most test programs compile in 0.5-2 s; cache those too (the CLI,
# notebook and README subprocesses compile the shipped pair's programs again otherwise).
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.5')

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


# ------------------------------------------------------------------------ tiny HF T5 checkpoints

from specjax.testing import HF_ORIGINAL_KW as T5_ORIGINAL_KW  # pylint: disable=wrong-import-position
from specjax.testing import HF_V11_KW as T5_V11_KW  # pylint: disable=wrong-import-position


def _build_and_save(directory, kw, seed, untie):
  from safetensors import safe_open
  from specjax.testing import save_hf_t5
  model = save_hf_t5(directory, kw, seed, untie)
  with safe_open(os.path.join(directory, 'model.safetensors'), 'pt') as f:
    keys = set(f.keys())
  assert ('lm_head.weight' in keys) == untie, sorted(keys)
  return model


@pytest.fixture(scope='session')
def hf_t5_original(tmp_path_factory):
  """Path of a tiny original-T5 checkpoint (ReLU, tied head, logits scaled by d_model**-0.5).

  transformers 5 saves only `shared.weight` (no lm_head.weight, no embed_tokens aliases) and
  writes config.json with tie_word_embeddings=true, scale_decoder_outputs=true.
  """
  directory = tmp_path_factory.mktemp('hf_t5_original')
  _build_and_save(directory, T5_ORIGINAL_KW, seed=1, untie=False)
  return directory


@pytest.fixture(scope='session')
def hf_t5_v11(tmp_path_factory):
  """Path of a tiny T5 v1.1 checkpoint (gated-GELU, untied lm_head, unscaled logits).

  What transformers 5.x does (checked here on every run): T5Config turns tie_word_embeddings=False
  into scale_decoder_outputs=False and then forces tie_word_embeddings=True, so the freshly built
  model has lm_head.weight *is* shared.weight. Assigning a new nn.Parameter to lm_head unties it;
  save_pretrained then writes a distinct `lm_head.weight` (it only dedups shared storage) while
  config.json still says tie_word_embeddings=true (with scale_decoder_outputs=false).
  from_pretrained sees both tensors differ, warns and does NOT tie them — asserted below, so the
  reloaded model really uses the new head. Loaders must therefore decide tying from the tensors.
  """
  import json

  import torch
  from transformers import T5ForConditionalGeneration
  directory = tmp_path_factory.mktemp('hf_t5_v11')
  model = _build_and_save(directory, T5_V11_KW, seed=2, untie=True)
  hf = json.loads((directory / 'config.json').read_text())
  assert hf['scale_decoder_outputs'] is False, hf
  reloaded = T5ForConditionalGeneration.from_pretrained(directory).eval()
  assert reloaded.lm_head.weight.data_ptr() != reloaded.shared.weight.data_ptr()
  assert torch.equal(reloaded.lm_head.weight, model.lm_head.weight)
  assert not torch.equal(reloaded.lm_head.weight, reloaded.shared.weight)
  assert reloaded.config.scale_decoder_outputs is False
  return directory


def pytest_unconfigure(config):
  """The run's compilation cache goes with it (only by the process that made it: the xdist
  controller, or a plain pytest run)."""
  import shutil  # pylint: disable=import-outside-toplevel
  owned = os.environ.get('SPECJAX_TEST_OWNS_CACHE')
  if owned and not hasattr(config, 'workerinput'):
    shutil.rmtree(owned, ignore_errors=True)
