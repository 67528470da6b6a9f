"""Measure every published figure on this host, publish the records, render the docs.

  python scripts/make_docs.py                        # every job this host can run (~1 h on 2 cores)
  python scripts/make_docs.py --only=run.tiny,pair_eval
  python scripts/make_docs.py --list                 # the jobs and their commands
  make docs                                          # the same as the first line

Each job runs its benchmark (or the default run) and appends its record to
docs/results/<benchmark>/<this host's id>.jsonl, so another host's records are never touched;
then `scripts/render_docs.py` rewrites the marked regions of README.md and docs/*.md from all the
records. Timings need a quiet machine: the benchmarks' load gate refuses a loaded one (exit 3;
`--wait_quiet` seconds are waited first), and this script stops at the first job that fails.
Install from the lock first (README, Quickstart 2) so the records carry the locked versions.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = 'results/make_docs'  # run outputs (gitignored); the records go to docs/results/

# name -> (commands, needs an accelerator). `{wait}` becomes --wait_quiet=SECONDS, `{wait_s}`
# SECONDS.
JOBS: dict[str, tuple[list[str], bool]] = {
    'pair_eval': ([f'python experiments/pair_eval.py --out={OUT}/pair_eval.json',
                   f'python scripts/record.py {OUT}/pair_eval.json'], False),
    'run.tiny': (['python scripts/make_docs.py --wait-quiet-only={wait_s}',
                  f'python -m specjax.run --config.output_dir={OUT}/tiny',
                  f'python scripts/record.py {OUT}/tiny'], False),
    'bench_block': (['python experiments/bench_block.py --record --plot=auto {wait}'], False),
    'bench_transformers': (['python experiments/bench_transformers.py --int8 --ct2=float32,int8 --record {wait}'],
                           False),
    'bench_batch.refill': (['python experiments/bench_batch.py --refill --record {wait}'], False),
    'bench_adaptive': (['python experiments/bench_adaptive.py --pairs=tiny --batches=1 --record '
                        f'--out={OUT}/adaptive_model.json {{wait}}',
                        'python experiments/bench_adaptive.py --draft=head --pairs=tiny --batches=1 '
                        f'--record --out={OUT}/adaptive_head.json {{wait}}'], False),
    'bench_tree': (['python experiments/bench_tree.py --record {wait}',
                    'python experiments/bench_tree.py --draft=head --pairs=tiny --record {wait}'],
                   False),
    'tree_step_cost': (['python experiments/tree_step_cost.py --record {wait}',
                        'python experiments/tree_step_cost.py --draft=head --record {wait}'],
                       False),
    'gpu_step': (['python experiments/gpu_step.py --shape=xxl --record {wait}'], True),
}


def accelerator() -> bool:
  """Whether JAX sees a GPU/TPU (asked in a subprocess: initialising a GPU backend here would
  take its memory from the benchmarks)."""
  done = subprocess.run([sys.executable, '-c', 'import jax; print(jax.default_backend())'],
                        capture_output=True, text=True, check=False)
  return done.stdout.strip() not in ('', 'cpu')


def wait_quiet(seconds: float) -> int:
  """The load gate's start check for the default run (which has no gate of its own)."""
  sys.path.insert(0, str(REPO))
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  gate = machine.Gate()
  gate.wait_quiet(seconds)
  try:
    print(machine.describe(gate.check_start()))
  except machine.LoadedMachine:
    return 3
  return 0


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--only', default='', help='comma-separated jobs (default: all this host can run)')
  p.add_argument('--list', action='store_true', help='print the jobs and their commands')
  p.add_argument('--wait_quiet', type=float, default=300.0,
                 help='seconds each job waits for a quiet machine before refusing')
  p.add_argument('--dry_run', action='store_true', help='print the commands only')
  p.add_argument('--wait-quiet-only', dest='wait_only', default=None, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.wait_only is not None:
    return wait_quiet(float(a.wait_only))
  names = [n.strip() for n in a.only.split(',') if n.strip()] or list(JOBS)
  unknown = sorted(set(names) - set(JOBS))
  if unknown:
    p.error(f'unknown job(s) {unknown}; jobs: {", ".join(JOBS)}')
  wait = f'--wait_quiet={a.wait_quiet:g}'
  if a.list:
    for name, (commands, acc) in JOBS.items():
      print(f"{name}{' (accelerator)' if acc else ''}:")
      for c in commands:
        print(f"  {c.format(wait=wait, wait_s=f'{a.wait_quiet:g}')}")
    return 0
  has_acc = None
  for name in names:
    commands, needs_acc = JOBS[name]
    if needs_acc:
      has_acc = accelerator() if has_acc is None else has_acc
      if not has_acc:
        print(f'== {name}: skipped (needs a GPU or TPU)')
        continue
    script = REPO / shlex.split(commands[0])[1] if commands[0].startswith('python ') else None
    if script is not None and script.suffix == '.py' and not script.is_file():
      print(f'== {name}: skipped ({script.relative_to(REPO)} does not exist yet)')
      continue
    if name == 'run.tiny':
      shutil.rmtree(REPO / OUT / 'tiny', ignore_errors=True)  # a fresh run, nothing resumed
    for command in commands:
      command = command.format(wait=wait, wait_s=f'{a.wait_quiet:g}')
      print(f'== {name}: {command}', flush=True)
      if a.dry_run:
        continue
      args = shlex.split(command)
      args[0] = sys.executable
      rc = subprocess.run(args, cwd=REPO, check=False).returncode
      if rc:
        print(f'make_docs: {name} failed (exit {rc}): {command}', file=sys.stderr)
        return rc
  if a.dry_run:
    return 0
  return subprocess.run([sys.executable, 'scripts/render_docs.py'], cwd=REPO,
                        check=False).returncode


if __name__ == '__main__':
  sys.exit(main())
