"""The CTranslate2 peer of the benchmarks decodes the shipped target as specjax does.

experiments/bench_transformers.py compares tokens/s with CTranslate2 on "the same weights": this
checks that claim where it can fail — the checkpoint converted by CTranslate2's own converter,
decoded greedily in the benchmark's worker process, gives token for token what specjax's greedy
decoding gives on the same verses.
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

if importlib.util.find_spec('ctranslate2') is None:
  pytest.skip('ctranslate2 is not installed', allow_module_level=True)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'experiments'))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position


# CTranslate2's side runs in a child process: its native libraries stay out of the pytest
# worker, which goes on to compile and serialise XLA programs for other tests.
CT2_SIDE = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import bench_common as bc, ct2_peer
tdir, cache = sys.argv[2], sys.argv[3]
model_dir = ct2_peer.convert(tdir, cache)
assert (model_dir / 'model.bin').is_file()
tok = bc.load_tokenizer_for(tdir)
_, ids, _ = bc.load_prompts(4, 4000, tdir)
worker = ct2_peer.Worker(model_dir, 'float32', os.cpu_count() or 1, 24)
try:
  seconds, outs = worker.round([tok.convert_ids_to_tokens(x) for x in ids])
finally:
  worker.close()
assert seconds > 0 and len(outs) == 4
print(json.dumps([tok.convert_tokens_to_ids(o) for o in outs]))
"""


def test_ctranslate2_greedy_tokens_equal_specjax(tmp_path):
  import specjax  # pylint: disable=import-outside-toplevel
  dirs = bc.tiny_pair_dirs()
  assert dirs is not None, 'the shipped pair is part of the package'
  tdir = dirs[0]
  done = subprocess.run([sys.executable, '-c', CT2_SIDE, os.path.join(REPO, 'experiments'),
                         str(tdir), str(tmp_path)], capture_output=True, text=True, timeout=600,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  theirs = json.loads(done.stdout.strip().splitlines()[-1])
  padded, ids, _ = bc.load_prompts(4, 4000, tdir)
  target = specjax.load_t5(tdir)
  ours = []
  for i in range(len(ids)):
    o = specjax.autoregressive_decode(target, padded[i:i + 1], max_new_tokens=24)
    ours.append(np.asarray(o.tokens[0, :int(o.lengths[0])]).tolist())
  assert theirs == ours
