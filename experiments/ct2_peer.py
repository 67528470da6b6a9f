"""CTranslate2 as a CPU peer for the benchmarks: the same Hugging Face weights, converted with its
own converter, decoded greedily one sequence at a time in a worker process.

  python experiments/ct2_peer.py --check          # converts the shipped target, decodes 2 verses

Why a worker process: a CTranslate2 translator keeps its own thread pool, whose threads would
compete with XLA's inside one process (two translators in one process measured 2-4x apart);
the benchmark talks to one worker per compute type and thread count over a pipe and times each round there.

Fair to the peer: timed at `intra_threads` = the cores XLA uses and at 1 (on a 2-core Intel
Xeon VM its 1-thread setting measured 2.2x faster in float32 and 3.9x in int8; the benchmark
compares with the faster), one sequence per call (batch 1, as specjax's rows), and the best ISA
the CPU has (CTranslate2 picks AVX2 on AMD CPUs unless
CT2_FORCE_CPU_ISA says otherwise: AVX512 measured 1.1x faster on a 2-core AMD EPYC). Greedy is
`beam_size=1`; CTranslate2's int8 compute types quantize weights AND activations (its own
scheme), so int8 tokens are not expected to equal specjax's int8 ones.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def available() -> bool:
  try:
    import ctranslate2  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    return False
  return True


def version() -> str | None:
  try:
    import ctranslate2  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  return ctranslate2.__version__


def convert(hf_dir, cache_root) -> Path:
  """The HF checkpoint converted by CTranslate2's TransformersConverter (cached by content)."""
  import ctranslate2  # pylint: disable=import-outside-toplevel
  hf_dir = Path(hf_dir)
  h = hashlib.sha256()
  for name in sorted(os.listdir(hf_dir)):
    if name.endswith(('.json', '.safetensors', '.bin', '.model')):
      h.update(name.encode())
      h.update((hf_dir / name).read_bytes())
  out = Path(cache_root) / 'ct2' / f'{hf_dir.name}-{h.hexdigest()[:12]}'
  if not (out / 'model.bin').is_file():
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f'.tmp{os.getpid()}')
    ctranslate2.converters.TransformersConverter(str(hf_dir)).convert(str(tmp), force=True)
    os.replace(tmp, out)
  return out


def best_isa() -> str | None:
  """AVX512 where the CPU has it (CTranslate2 defaults to AVX2 on non-Intel CPUs)."""
  try:
    flags = next(line for line in open('/proc/cpuinfo', encoding='utf-8')
                 if line.startswith('flags')).split()
  except (OSError, StopIteration):
    return None
  return 'AVX512' if 'avx512f' in flags and 'avx512bw' in flags else None


class Worker:
  """A CTranslate2 translator in its own process: `round(sources)` decodes every source (token
  strings) one at a time and returns (seconds measured in the worker, output token strings)."""

  def __init__(self, model_dir, compute_type: str, threads: int, max_new_tokens: int):
    env = dict(os.environ)
    isa = best_isa()
    if isa and 'CT2_FORCE_CPU_ISA' not in env:
      env['CT2_FORCE_CPU_ISA'] = isa
    self.isa = env.get('CT2_FORCE_CPU_ISA', 'default')
    self.compute_type = compute_type
    self.proc = subprocess.Popen(
        [sys.executable, str(HERE / 'ct2_peer.py'), '--serve', str(model_dir), compute_type,
         str(threads), str(max_new_tokens)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    ready = json.loads(self.proc.stdout.readline())
    if 'error' in ready:
      raise RuntimeError(f"ctranslate2 worker: {ready['error']}")

  def round(self, sources):
    self.proc.stdin.write(json.dumps(sources) + '\n')
    self.proc.stdin.flush()
    reply = json.loads(self.proc.stdout.readline())
    return reply['seconds'], reply['outputs']

  def close(self):
    if self.proc.poll() is None:
      self.proc.stdin.close()
      self.proc.wait(timeout=30)


def _serve(model_dir, compute_type, threads, max_new_tokens):
  try:
    import ctranslate2  # pylint: disable=import-outside-toplevel
    translator = ctranslate2.Translator(model_dir, device='cpu', compute_type=compute_type,
                                        intra_threads=int(threads), inter_threads=1)
  except Exception as e:  # pylint: disable=broad-except  # reported to the parent, one line
    print(json.dumps({'error': str(e).splitlines()[0]}), flush=True)
    return
  print(json.dumps({'ready': True}), flush=True)
  for line in sys.stdin:
    sources = json.loads(line)
    t0 = time.perf_counter()
    outputs = [translator.translate_batch([s], beam_size=1, max_decoding_length=int(max_new_tokens),
                                          return_scores=False, return_end_token=True
                                          )[0].hypotheses[0] for s in sources]
    print(json.dumps({'seconds': time.perf_counter() - t0, 'outputs': outputs}), flush=True)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--serve', nargs=4, metavar=('DIR', 'COMPUTE_TYPE', 'THREADS', 'MAX_NEW'))
  p.add_argument('--check', action='store_true')
  a = p.parse_args(argv)
  if a.serve:
    _serve(*a.serve)
    return
  sys.path.insert(0, str(HERE))
  import bench_common as bc  # pylint: disable=import-outside-toplevel
  tdir = bc.tiny_pair_dirs()[0]
  model = convert(tdir, bc.cache_dir())
  tok = bc.load_tokenizer_for(tdir)
  _, ids, _ = bc.load_prompts(2, 4000, tdir)
  w = Worker(model, 'float32', os.cpu_count() or 1, 24)
  try:
    secs, outs = w.round([tok.convert_ids_to_tokens(x) for x in ids])
  finally:
    w.close()
  print(f'{model}: {len(outs)} outputs in {secs:.3f} s (ISA {w.isa})')


if __name__ == '__main__':
  main()
