"""Two processes joined by jax.distributed (CPU collectives over gloo), 4 CPU devices each, one
(2, 4) mesh over both: decoding gives the tokens of one process.

This file doubles as the worker script: `python tests/test_multiprocess.py WORKER_ID PORT DIR`
(launched twice by `test_two_processes_match_one_process`, on localhost) initialises the
distributed runtime, shards pair A of tests/test_sharding.py over the global mesh, decodes
(speculative and autoregressive, greedy and sampled, slot refill, a target loaded with
`load_t5(mesh=...)` from a checkpoint the test saved), gathers the tokens with
`multihost_utils.process_allgather` and writes them as JSON to DIR/worker{ID}.json. The test
decodes the same inputs in its own process on one device and compares.
"""

import os
import sys
from pathlib import Path

_WORKER = __name__ == '__main__'
if _WORKER:  # before jax is imported
  os.environ['XLA_FLAGS'] = ('--xla_force_host_platform_device_count=4 '
                             '--xla_backend_optimization_level=0 '
                             '--xla_llvm_disable_expensive_passes=true '
                             '--xla_cpu_use_fusion_emitters=false')
  os.environ['JAX_PLATFORMS'] = 'cpu'
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import json  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from specjax.decoding.loop import autoregressive_decode, speculative_decode  # noqa: E402
from specjax.models.t5 import T5Config  # noqa: E402
from specjax.testing import tiny_t5  # noqa: E402

GAMMA, MAX_NEW, SLOTS = 3, 10, 3
TARGET = T5Config(vocab_size=128, d_model=32, d_kv=4, d_ff=64, num_layers=1,
                  num_decoder_layers=2, num_heads=8, gated=True, tie_word_embeddings=False,
                  scale_logits=False)
DRAFT = T5Config(vocab_size=128, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                 num_decoder_layers=1, num_heads=8)
TIMEOUT_S = 240


def pair():
  return tiny_t5(TARGET, 1, scale=2.0), tiny_t5(DRAFT, 2, scale=2.0)


def inputs():
  ids = np.array(jax.random.randint(jax.random.PRNGKey(3), (8, 7), 2, 128), np.int32)
  ids[1, 4:] = 0
  ids[5, 2:] = 0
  return ids


def decode_all(target, draft, ids, gather):
  """Every decoding mode -> {name: tokens as nested lists} (`gather` brings a global array home)."""
  runs = {
      'spec_greedy': lambda: speculative_decode(target, draft, ids, gamma=GAMMA,
                                                max_new_tokens=MAX_NEW),
      'spec_sample': lambda: speculative_decode(target, draft, ids, gamma=GAMMA,
                                                max_new_tokens=MAX_NEW, temperature=1.0, rng=7),
      'ar_greedy': lambda: autoregressive_decode(target, ids, max_new_tokens=MAX_NEW),
      'ar_sample': lambda: autoregressive_decode(target, ids, max_new_tokens=MAX_NEW,
                                                 temperature=1.0, rng=7),
      'spec_refill': lambda: speculative_decode(target, draft, ids, gamma=GAMMA,
                                                max_new_tokens=MAX_NEW, slots=SLOTS),
  }
  return {name: gather(fn().tokens).tolist() for name, fn in runs.items()}


def worker(worker_id: int, port: int, directory: str) -> None:
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  from specjax.models import sharding as sh  # pylint: disable=import-outside-toplevel
  from specjax.models.checkpoints import load_t5  # pylint: disable=import-outside-toplevel
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  sh.initialize_distributed(coordinator_address=f'localhost:{port}', num_processes=2,
                            process_id=worker_id)
  res = {'process_count': jax.process_count(), 'devices': len(jax.devices()),
         'local_devices': len(jax.local_devices())}
  t0 = time.time()
  mesh = sh.make_mesh((2, 4))
  target, draft = pair()
  ts, ds = sh.shard_model(target, mesh), sh.shard_model(draft, mesh)
  x = sh.shard_batch(inputs(), mesh)
  res['input_addressable'] = bool(x.is_fully_addressable)

  def gather(a):
    return np.asarray(multihost_utils.process_allgather(a, tiled=True))

  res['runs'] = decode_all(ts, ds, x, gather)
  loaded = load_t5(os.path.join(directory, 'target'), mesh=mesh)
  res['runs']['load_t5_spec_greedy'] = gather(speculative_decode(
      loaded, ds, x, gamma=GAMMA, max_new_tokens=MAX_NEW).tokens).tolist()
  res['seconds'] = round(time.time() - t0, 1)
  with open(os.path.join(directory, f'worker{worker_id}.json'), 'w') as f:
    json.dump(res, f)
  jax.distributed.shutdown()


# ============================================================================= the test


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def _gloo_available() -> str | None:
  """None if this JAX can run CPU collectives over gloo, else why not."""
  if 'jax_cpu_collectives_implementation' not in jax.config.values:
    return f'jax {jax.__version__} has no jax_cpu_collectives_implementation option'
  try:
    from jax._src.lib import _jax  # pylint: disable=import-outside-toplevel,protected-access
    if not hasattr(_jax, 'make_gloo_tcp_collectives'):
      return f'jaxlib {jax.__version__} was built without gloo CPU collectives'
  except ImportError:
    pass
  return None


def test_two_processes_match_one_process(tmp_path):
  import pytest  # pylint: disable=import-outside-toplevel
  why = _gloo_available()
  if why:
    pytest.skip(why)
  from specjax.models.checkpoints import save_t5  # pylint: disable=import-outside-toplevel
  target, draft = pair()
  save_t5(target, str(tmp_path / 'target'))
  port = _free_port()
  # No persistent compilation cache on either side of this test: a pytest worker process
  # crashed (SIGSEGV) inside jax's cache write for the reference decode below while the two
  # distributed workers were writing to the same shared cache directory.
  env = {k: v for k, v in os.environ.items()
         if k not in ('XLA_FLAGS', 'JAX_COORDINATOR_ADDRESS', 'JAX_COMPILATION_CACHE_DIR')}
  procs = [subprocess.Popen([sys.executable, __file__, str(i), str(port), str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  try:
    # Meanwhile, the reference in this process (one device).
    from jax._src import config as jax_config  # pylint: disable=import-outside-toplevel
    with jax_config.enable_compilation_cache(False):
      want = decode_all(target, draft, inputs(), np.asarray)
    logs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
  finally:
    for p in procs:  # bounded in time: never leave a worker behind
      if p.poll() is None:
        p.kill()
        p.wait()
  for i, (p, log) in enumerate(zip(procs, logs)):
    assert p.returncode == 0, f'worker {i} exited {p.returncode}:\n{log[-3000:]}'
  for i in range(2):
    res = json.loads((tmp_path / f'worker{i}.json').read_text())
    assert (res['process_count'], res['devices'], res['local_devices']) == (2, 8, 4), res
    assert not res['input_addressable']  # the batch really is spread over both processes
    for name, tokens in want.items():
      assert res['runs'][name] == tokens, (i, name)
    assert res['runs']['load_t5_spec_greedy'] == want['spec_greedy'], i
    print(f'worker {i}: {res["seconds"]} s')


if _WORKER:
  worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
