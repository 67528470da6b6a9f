"""Shared helpers of the benchmark scripts (experiments/bench_*.py, experiments/gpu_step.py).

Not a benchmark itself. What lives here:

  * environment: offline Hugging Face, thread counts, machine description for the JSON/tables;
  * models: the shipped tiny EN->ES pair (specjax/assets/tiny_pair/{target,draft}) when it exists,
    else random stand-ins; random HF-format pairs written by transformers itself (`build_hf_pair`),
    whose draft is the target's own first layers (so acceptance is meaningful without training);
  * prompts: held-out test verses (specjax.data.load_pairs('test') when present, else the shipped
    test.jsonl.gz), tokenised like specjax.finetune does (no special tokens, then EOS), right-padded
    to one fixed source length so that every prompt reuses one compiled program;
  * options: the ones every script takes (`parse_bench_args`: --out, --smoke, the load gate's),
    and help-less ones declared by their defaults (`add_defaults`);
  * output: markdown tables and JSON; every JSON carries `host` (machine.host_record: hardware,
    measured memory bandwidth, versions, commit) and `command`;
  * records: `--record[=DIR]` also appends the run as one published record (a JSON line) to
    DIR/<script>/<host id>.jsonl (DIR: docs/results), the file scripts/render_docs.py renders the
    docs' tables from; a run on another host adds its own file (specjax/runner/results.py);
  * the load gate (specjax/runner/machine.py): every script records the load average and cores at
    its start and end, and other processes' CPU during the run, prints them beside each table,
    stores them in its JSON (`load`), and refuses (exit 3) to report figures from a loaded
    machine unless `--allow-loaded` is given (the figures are then marked LOADED).

Timing conventions used by every script: warm-up (compile) timed apart, `block_until_ready`, the
median of repeats, and competing variants interleaved A B A B in one process.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import platform
import random
import statistics
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

ASSETS = REPO / 'specjax' / 'assets'
TINY_PAIR = ASSETS / 'tiny_pair'
BIBLE = ASSETS / 'bible_en_es'

# Architectures of the random stand-ins (HF T5Config keyword arguments).
#  smoke:     seconds, for tests.
#  tiny:      the shapes of configs/finetune/bible_{target,draft}.py (used until the trained pair exists).
#  t5-small:  t5-small's shapes (d_model 512, 6 + 6 layers, 8 heads, d_ff 2048, ReLU, vocab 32128)
#             with an UNTIED head of the same size (same bytes and FLOPs per step): with random
#             weights a tied head makes greedy decoding repeat the input token forever (the token's
#             own embedding dominates the residual stream, so it wins the tied dot product).
ARCHS = {
    'smoke': dict(vocab_size=512, d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=1,
                  num_decoder_layers=2, feed_forward_proj='relu'),
    'tiny': dict(vocab_size=4000, d_model=256, d_kv=64, num_heads=4, d_ff=512, num_layers=2,
                 num_decoder_layers=4, feed_forward_proj='gated-gelu',
                 tie_word_embeddings=False),
    't5-small': dict(vocab_size=32128, d_model=512, d_kv=64, num_heads=8, d_ff=2048, num_layers=6,
                     num_decoder_layers=6, feed_forward_proj='relu', tie_word_embeddings=False),
}
# Draft = the target's embedding, relative-attention tables, first `draft_layers` encoder and
# decoder blocks, final norms and head. Blocks at and after `draft_layers` have the output
# projections of their residual branches (attention `o`, feed-forward `wo`) scaled by `damp`, so
# they perturb the residual stream a little: the draft is a real approximation of the target, not
# a copy, and `damp` sets the acceptance rate.
PAIR_DEFAULTS = {
    'smoke': dict(draft_layers=1, damp=0.15),
    'tiny': dict(draft_layers=1, damp=0.08),
    't5-small': dict(draft_layers=2, damp=0.05),
}


# ----------------------------------------------------------------------------- environment


def set_threads(n: int | None = None) -> int:
  """Torch intra-op threads = the cores XLA's CPU client uses (all visible cores)."""
  n = n or os.cpu_count() or 1
  try:
    import torch  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(n)
    torch.set_num_interop_threads(1)
  except (ImportError, RuntimeError):
    pass
  return n


def load_average() -> tuple[float, float, float]:
  try:
    return os.getloadavg()
  except OSError:
    return (float('nan'),) * 3


def machine_info() -> dict[str, Any]:
  """The short machine description printed beside the tables (the full one: `run_host()`)."""
  import jax  # pylint: disable=import-outside-toplevel
  info = {
      'cpu_count': os.cpu_count(),
      'cpu_model': _cpu_model(),
      'platform': platform.platform(),
      'python': platform.python_version(),
      'jax': jax.__version__,
      'jax_backend': jax.default_backend(),
      'device': jax.devices()[0].device_kind,
      'load_average_start': load_average(),
      'time': time.strftime('%Y-%m-%dT%H:%M:%S'),
  }
  for mod in ('jaxlib', 'flax', 'torch', 'transformers'):
    if mod in sys.modules:
      info[mod] = getattr(sys.modules[mod], '__version__', '?')
  try:
    import torch  # pylint: disable=import-outside-toplevel
    info['torch'] = torch.__version__
    info['torch_threads'] = torch.get_num_threads()
  except ImportError:
    pass
  return info


def _cpu_model() -> str:
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor()


def print_machine(log=print) -> dict[str, Any]:
  """machine_info(), printed as the 'machine: ...' line a single-pair script starts with."""
  info = machine_info()
  log(f'machine: {describe_machine(info)}')
  return info


def describe_machine(info: dict[str, Any]) -> str:
  la = info.get('load_average_start', ())
  parts = [f"{info.get('cpu_count')} CPU cores ({info.get('cpu_model', '?')})",
           f"JAX {info.get('jax')} on {info.get('jax_backend')}"]
  if 'torch' in info:
    parts.append(f"torch {info['torch']} ({info.get('torch_threads', '?')} threads)")
  if 'transformers' in info:
    parts.append(f"transformers {info['transformers']}")
  if la:
    parts.append('load average ' + ' '.join(f'{x:.2f}' for x in la))
  return '; '.join(parts)


# ----------------------------------------------------------------------------- machine load


def add_load_args(p) -> None:
  """The load gate's options, the same in every benchmark script."""
  p.add_argument('--allow-loaded', '--allow_loaded', dest='allow_loaded', action='store_true',
                 help='report figures measured on a loaded machine (they are marked LOADED in '
                      'the tables and the JSON); by default such a run is refused (exit 3)')
  p.add_argument('--wait_quiet', type=float, default=0.0,
                 help='seconds to wait at the start for the 1-min load average to fall under '
                      'the limit before refusing')


def add_defaults(p, **defaults) -> None:
  """`--NAME` for each keyword, typed by its default (str, int or float): the options whose name
  says enough, declared in one line instead of an add_argument each."""
  for name, default in defaults.items():
    assert isinstance(default, (str, int, float)) and not isinstance(default, bool), name
    p.add_argument(f'--{name}', type=type(default), default=default)


# This process's benchmark run: the script and its arguments (parse_bench_args), the host
# (load_gate measures it before any work). Nothing of it outlives the process.
_RUN: dict[str, Any] = {}


def parse_bench_args(p, argv=None, *, out_default='', smoke_help=None):
  """Adds the options every benchmark script takes (--out, --smoke, --record, the load gate's)
  and parses argv: one spelling of them for all scripts."""
  from specjax.runner import results  # pylint: disable=import-outside-toplevel
  p.add_argument('--out', default=out_default)
  p.add_argument('--smoke', action='store_true', help=smoke_help)
  p.add_argument('--record', nargs='?', const=str(results.RECORDS_DIR), default='', metavar='DIR',
                 help='append this run as a published record (figures, command, commit, host, '
                      f'load) to DIR/<script>/<host id>.jsonl; DIR defaults to '
                      f'{results.RECORDS_DIR.relative_to(REPO)}')
  add_load_args(p)
  args = p.parse_args(argv)
  script = Path(sys._getframe(1).f_globals.get('__file__', p.prog))  # pylint: disable=protected-access
  argv = list(sys.argv[1:] if argv is None else argv)
  if args.smoke and args.record == str(results.RECORDS_DIR):
    p.error('a --smoke run publishes no figures: give --record=DIR another directory')
  _RUN.clear()
  _RUN.update(script=script.stem, command=_command(script, argv), record=args.record,
              smoke=bool(args.smoke), args=vars(args))
  return args


def _this_run(result) -> bool:
  """Whether `result` is this run's (its 'args' are the options parse_bench_args parsed): a
  script that parses its own options is not stamped with another script's command."""
  return (isinstance(result, dict) and _RUN.get('args') is not None
          and result.get('args') is _RUN['args'])


def _command(script: Path, argv: Sequence[str]) -> str:
  import shlex  # pylint: disable=import-outside-toplevel
  from specjax.runner import results  # pylint: disable=import-outside-toplevel
  try:
    shown = script.resolve().relative_to(REPO).as_posix()
  except ValueError:
    shown = script.name
  return shlex.join(['python', shown, *(results.scrub(a) for a in argv)])


def run_host() -> dict[str, Any]:
  """machine.host_record() of this run, measured once (at the load gate, before any work; a
  --smoke run skips the bandwidth probe)."""
  if 'host' not in _RUN:
    from specjax.runner import machine  # pylint: disable=import-outside-toplevel
    _RUN['host'] = machine.host_record(probe_bandwidth=not _RUN.get('smoke', False))
  return _RUN['host']


def load_gate(args, log=print):
  """Starts the run's load gate: refuses at once (LoadedMachine, exit 3) on a loaded machine.

  `--smoke` and `--dry_run` runs report no figure worth quoting: they record the load and never
  refuse.
  """
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  allow = bool(getattr(args, 'allow_loaded', False) or getattr(args, 'smoke', False)
               or getattr(args, 'dry_run', False))
  gate = machine.Gate(allow_loaded=allow)
  if getattr(args, 'wait_quiet', 0):
    gate.wait_quiet(args.wait_quiet, log=log)
  log(machine.describe(gate.check_start()))
  log(f'host: {machine.describe_host(run_host())}')
  return gate


def table_load(gate, since=None) -> tuple[dict, str]:
  """(record, line) of the loads from `since` (default the run's start) to now: the line is
  printed beside a table, the record stored with it in the JSON."""
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  rec = gate.record(since)
  return rec, machine.describe(rec)


def finish_load(gate, result: dict, out=None, log=print) -> dict:
  """Records the run's load in `result` (and its JSON), prints it; raises LoadedMachine (exit 3)
  when the figures were measured under load and --allow-loaded was not given."""
  from specjax.runner import machine  # pylint: disable=import-outside-toplevel
  rec = gate.record()
  result['load'] = rec
  write_json(out, result)
  if _RUN.get('record') and _this_run(result) and not rec['refused']:
    path = publish(result)
    log(f'record: appended to {path}')
  machine.finish(rec, log=log)
  return rec


def publish(result: dict, directory=None) -> Path:
  """Appends `result` (a script's JSON, host and load included) as one record to
  DIR/<script>/<host id>.jsonl (DIR: --record's, else docs/results)."""
  from specjax.runner import results  # pylint: disable=import-outside-toplevel
  record = results.make_record(_RUN.get('script', 'bench'), result,
                               command=_RUN.get('command', ''), smoke=_RUN.get('smoke', False))
  return results.append_record(record, directory or _RUN.get('record') or results.RECORDS_DIR)


# ----------------------------------------------------------------------------- timing


def run_pairs(args, run_pair) -> tuple[dict, Any]:
  """The pair sweep shared by the benchmarks: threads, load gate, machine line, one record per
  `--pairs` entry (the JSON rewritten after each, so a killed run keeps what it measured)."""
  set_threads()
  gate = load_gate(args)
  info = machine_info()
  print(describe_machine(info))
  result = {'machine': info, 'args': vars(args), 'pairs': []}
  for name in args.pairs.split(','):
    result['pairs'].append(run_pair(name.strip(), args, gate=gate))
    write_json(args.out, result)
  return result, gate


def bootstrap_ratio_se(a_num, a_den, b_num, b_den, draws: int = 2000, seed: int = 0) -> float:
  """Standard error of (sum a_num / sum a_den) / (sum b_num / sum b_den), rows resampled: the
  spread of a ratio of pooled per-row counts (tokens / target calls) of two variants."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  ia = rng.integers(0, len(a_num), (draws, len(a_num)))
  ib = rng.integers(0, len(b_num), (draws, len(b_num)))
  ra = a_num[ia].sum(1) / np.maximum(a_den[ia].sum(1), 1)
  rb = b_num[ib].sum(1) / np.maximum(b_den[ib].sum(1), 1)
  return float(np.std(ra / rb))


def keep_chunks(last: dict, name: str, chunks: Sequence,
                decode: Callable[[Any, int], Any]) -> Callable[[], list]:
  """fn() for the timer: decode(x, i) of every prompt chunk x (i: its index, the rng seed), the
  outputs kept in last[name] (statistics are read from the timed runs) and returned (blocked on)."""
  def run():
    last[name] = [decode(x, i) for i, x in enumerate(chunks)]
    return last[name]
  return run


def block(x):
  import jax  # pylint: disable=import-outside-toplevel
  return jax.block_until_ready(x)


def interleave(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1,
               shuffle: bool = False) -> dict[str, dict[str, Any]]:
  """Warm-up each fn (first call timed apart as `first_s`), then A B A B ... `repeats` rounds.

  `shuffle`: rounds after the first run in a seeded random order: on a shared 2-core machine the
  call right after a long run of other calls was measured 20-30% slower than the same program
  later in the round, so a fixed order biases whichever variant follows the slowest one.

  Returns per name: first_s, median_s, min_s, times_s. Each call's result is block_until_ready'd
  (a no-op for non-JAX results).
  """
  out = {name: {'first_s': None, 'times_s': []} for name in fns}
  for name, fn in fns.items():
    for i in range(warmup):
      t0 = time.perf_counter()
      block(fn())
      if i == 0:
        out[name]['first_s'] = time.perf_counter() - t0
  names = list(fns)
  for r in range(repeats):
    order = random.Random(r).sample(names, len(names)) if shuffle and r else names
    for name in order:
      fn = fns[name]
      t0 = time.perf_counter()
      block(fn())
      out[name]['times_s'].append(time.perf_counter() - t0)
  for rec in out.values():
    rec['median_s'] = statistics.median(rec['times_s'])
    rec['min_s'] = min(rec['times_s'])
  return out


# ----------------------------------------------------------------------------- models


def tiny_pair_dirs() -> tuple[Path, Path] | None:
  """(target, draft) of the shipped tiny pair, or None while it is not there (yet)."""
  target, draft = TINY_PAIR / 'target', TINY_PAIR / 'draft'
  for d in (target, draft):
    if not (d / 'config.json').is_file():
      return None
    if not any((d / w).is_file() for w in ('model.safetensors', 'model.safetensors.index.json',
                                          'pytorch_model.bin')):
      return None
  return target, draft


def build_hf_pair(directory, arch: str = 'tiny', *, seed: int = 0, draft_layers: int | None = None,
                  damp: float | None = None, force: bool = False) -> tuple[Path, Path]:
  """Writes a random target and its truncated draft as HF checkpoints (transformers' own format).

  Returns (target_dir, draft_dir). Reuses existing directories with the same recipe unless force.
  """
  kw = dict(ARCHS[arch])
  draft_layers = PAIR_DEFAULTS[arch]['draft_layers'] if draft_layers is None else draft_layers
  damp = PAIR_DEFAULTS[arch]['damp'] if damp is None else damp
  recipe = {'arch': arch, 'kw': kw, 'seed': seed, 'draft_layers': draft_layers, 'damp': damp,
            'version': 2}
  directory = Path(directory)
  tdir, ddir = directory / 'target', directory / 'draft'
  stamp = directory / 'recipe.json'
  if not force and stamp.is_file() and json.loads(stamp.read_text()) == recipe:
    return tdir, ddir
  import torch  # pylint: disable=import-outside-toplevel
  from transformers import T5Config, T5ForConditionalGeneration  # pylint: disable=import-outside-toplevel
  from specjax import testing  # pylint: disable=import-outside-toplevel  (imports jax: not at the top)
  testing.quiet_transformers()
  directory.mkdir(parents=True, exist_ok=True)
  torch.manual_seed(seed)
  config = T5Config(dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                    **kw)
  target = T5ForConditionalGeneration(config).eval()
  testing.spread_out_torch_(target, seed)
  untie = kw.get('tie_word_embeddings', True) is False
  if untie:
    testing.untie_head_(target, seed + 1)
  with torch.no_grad():
    for stack in (target.encoder, target.decoder):
      for i, blk in enumerate(stack.block):
        if i < draft_layers:
          continue
        for name, p in blk.named_parameters():
          if name.endswith(('.o.weight', '.wo.weight')):
            p.mul_(damp)
  target.save_pretrained(tdir)

  dkw = dict(kw, num_layers=draft_layers, num_decoder_layers=draft_layers)
  draft = T5ForConditionalGeneration(T5Config(dropout_rate=0.0, decoder_start_token_id=0,
                                              pad_token_id=0, eos_token_id=1, **dkw)).eval()
  if untie:  # a distinct head Parameter unties it (transformers 5 ties on construction)
    draft.lm_head.weight = torch.nn.Parameter(torch.empty_like(target.lm_head.weight))
  tsd = target.state_dict()
  with torch.no_grad():
    for name, p in draft.named_parameters():  # tied parameters are listed once
      p.copy_(tsd[name])
    for name, p in draft.named_parameters():
      assert torch.equal(p, tsd[name]), name
  draft.save_pretrained(ddir)
  stamp.write_text(json.dumps(recipe))
  return tdir, ddir


def cache_dir() -> Path:
  d = Path(os.environ.get('SPECJAX_BENCH_CACHE', REPO / 'results' / 'bench_models'))
  d.mkdir(parents=True, exist_ok=True)
  return d


def resolve_pair(which: str, smoke: bool = False) -> tuple[Path, Path, str]:
  """(target_dir, draft_dir, description) for 'tiny' | 't5-small' | 'smoke'."""
  if smoke:
    t, d = build_hf_pair(cache_dir() / 'smoke', 'smoke')
    return t, d, 'random smoke pair (d_model 32), draft = target truncated to 1 layer'
  if which == 'tiny':
    dirs = tiny_pair_dirs()
    if dirs is not None:
      return dirs[0], dirs[1], 'shipped tiny EN->ES pair (specjax/assets/tiny_pair)'
    t, d = build_hf_pair(cache_dir() / 'tiny_random', 'tiny')
    return t, d, ('RANDOM stand-in with the tiny pair\'s target shapes (shipped pair not found), '
                  'draft = target truncated to 1 layer')
  if which == 't5-small':
    t, d = build_hf_pair(cache_dir() / 't5_small_random', 't5-small')
    p = PAIR_DEFAULTS['t5-small']
    return t, d, (f"random t5-small-shaped target (spread-out init), draft = its embedding/head + "
                  f"first {p['draft_layers']} encoder and decoder blocks; target blocks "
                  f">= {p['draft_layers']} have residual outputs scaled by {p['damp']}")
  raise ValueError(f'unknown pair {which!r}')


class BenchPair(NamedTuple):
  """What a benchmark decodes: the pair (float32), its description, and the prompts."""
  target: Any
  draft: Any
  description: str
  padded_NxS: Any  # int32 [n, S], right-padded to one source length
  ids: list  # the n unpadded id lists


def load_bench_pair(which: str, n: int, *, smoke: bool = False) -> BenchPair:
  """resolve_pair + load_pair_jax (float32) + n test verses tokenised for the target: the start
  of every script that decodes the tiny / t5-small / smoke pair."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  tdir, ddir, desc = resolve_pair(which, smoke=smoke)
  target, draft = load_pair_jax(tdir, ddir, jnp.float32)
  padded, ids, _ = load_prompts(n, target.config.vocab_size, tdir,
                                eos_id=target.config.eos_token_id)
  return BenchPair(target, draft, desc, padded, ids)


def dev_prompts(which: str, n: int, target, *, smoke: bool = False):
  """n dev verses as padded int32 [n, S] for `which` pair's target: verses apart from the test
  verses the benchmarks time, for what a benchmark fits (bench_adaptive's learned stop rule)."""
  tdir, _, _ = resolve_pair(which, smoke=smoke)
  padded, _, _ = load_prompts(n, target.config.vocab_size, tdir, eos_id=target.config.eos_token_id,
                              split='dev')
  return padded


def head_draft(pair: str, target):
  """(the feature head draft for `pair`'s target, its description): the shipped tiny pair's head
  with its 2582-id draft vocabulary, stored in int8 (configs/tiny.py), or a random head for the
  smoke pair."""
  import jax  # pylint: disable=import-outside-toplevel
  from specjax import data  # pylint: disable=import-outside-toplevel
  from specjax.decoding.feature_head import FeatureHeadDraft  # pylint: disable=import-outside-toplevel
  from specjax.models import head as head_lib  # pylint: disable=import-outside-toplevel
  if pair == 'smoke':
    hc = head_lib.HeadConfig.for_target(target.config, d_model=16, num_heads=2, d_kv=8, d_ff=32)
    params = head_lib.init_head_params(hc, jax.random.PRNGKey(0))
    return FeatureHeadDraft.for_target(target, (params, hc)), 'random feature head (d_model 16)'
  head_dir = os.path.join(str(data.TINY_PAIR_DIR), 'head')
  if pair != 'tiny' or tiny_pair_dirs() is None or not os.path.isdir(head_dir):
    raise SystemExit(f'--draft=head: no feature head for the {pair} pair (the shipped tiny pair '
                     'has one)')
  return (FeatureHeadDraft.for_target(target, head_dir, vocab=2582, weights='int8'),
          'the shipped feature head (2582 of 4000 ids, int8)')


def load_pair_jax(target_dir, draft_dir, dtype=None):
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.models.checkpoints import load_t5  # pylint: disable=import-outside-toplevel
  dtype = dtype or jnp.float32
  # The draft as the runner loads it (quantize='lossless': a bf16-saved draft streams bf16).
  return (load_t5(str(target_dir), dtype=dtype),
          load_t5(str(draft_dir), dtype=dtype, quantize='lossless'))


# ----------------------------------------------------------------------------- prompts


def _test_records(n: int, split: str = 'test') -> list[dict]:
  try:
    from specjax import data  # pylint: disable=import-outside-toplevel
    pairs = data.load_pairs(split)
    recs = [dict(p) if isinstance(p, dict) else {'en': p[0], 'es': p[1]} for p in pairs]
    if recs:
      return recs[:n]
  except Exception:  # pylint: disable=broad-except  # module absent or still being written
    pass
  recs = []
  with gzip.open(BIBLE / f'{split}.jsonl.gz', 'rt', encoding='utf-8') as f:
    for line in f:
      if line.strip():
        recs.append(json.loads(line))
      if len(recs) >= n:
        break
  return recs


def load_tokenizer_for(target_dir):
  """The checkpoint's tokenizer, else the shipped Bible tokenizer; None if neither is usable."""
  from specjax.models.checkpoints import load_tokenizer  # pylint: disable=import-outside-toplevel
  from specjax.testing import quiet_transformers  # pylint: disable=import-outside-toplevel
  quiet_transformers()
  for getter in (lambda: load_tokenizer(str(target_dir)), _bible_tokenizer):
    try:
      tok = getter()
    except Exception:  # pylint: disable=broad-except
      tok = None
    if tok is not None and len(tok) >= 100:
      return tok
  return None


def _bible_tokenizer():
  try:
    from specjax import data  # pylint: disable=import-outside-toplevel
    return data.bible_tokenizer()
  except Exception:  # pylint: disable=broad-except
    from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel
    return AutoTokenizer.from_pretrained(str(BIBLE / 'tokenizer'))


def load_prompts(n: int, vocab_size: int, target_dir=None, max_len: int = 64, eos_id: int = 1,
                 pad_to: int | None = None, split: str = 'test'):
  """n verses of `split` (default the test verses) as token ids: (padded int32 [n, S], list of unpadded id lists, English texts).

  Ids come from the target's tokenizer (or the shipped Bible tokenizer) with EOS appended, truncated
  to max_len. If no usable tokenizer exists, or a token id falls outside the model's vocabulary,
  each word is hashed to an id in [2, vocab) instead (random models do not care about meaning).
  """
  import numpy as np  # pylint: disable=import-outside-toplevel
  recs = _test_records(n, split)
  texts = [r['en'] for r in recs]
  ids = None
  # Tiny random smoke models (vocab < 1000) skip the tokenizer (and the transformers import).
  tok = None
  if vocab_size >= 1000:
    tok = load_tokenizer_for(target_dir) if target_dir is not None else _bible_tokenizer()
  if tok is not None:
    ids = [list(x) for x in tok(texts, add_special_tokens=False).input_ids]
    if any(max(x, default=0) >= vocab_size for x in ids):
      ids = None
  if ids is None:
    ids = [[2 + zlib.crc32(w.encode()) % (vocab_size - 2) for w in t.split()] for t in texts]
  ids = [x[:max_len - 1] + [eos_id] for x in ids]
  s = pad_to or int(math.ceil(max(len(x) for x in ids) / 8) * 8)
  arr = np.zeros((len(ids), s), np.int32)
  for i, x in enumerate(ids):
    arr[i, :len(x)] = x[:s]
  return arr, ids, texts


# ----------------------------------------------------------------------------- output


def fmt(x, spec: str = '.3g') -> str:
  if x is None:
    return '-'
  if isinstance(x, bool):
    return 'yes' if x else 'NO'
  if isinstance(x, float):
    if math.isnan(x):
      return 'nan'
    return format(x, spec)
  return str(x)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
  """columns: (key, header, format spec)."""
  lines = ['| ' + ' | '.join(h for _, h, _ in columns) + ' |',
           '|' + '---|' * len(columns)]
  for r in rows:
    lines.append('| ' + ' | '.join(fmt(r.get(k), f) for k, _, f in columns) + ' |')
  return '\n'.join(lines)


def write_json(path, obj) -> None:
  """Writes obj (atomically) to path; a result dict gets this run's `host` and `command`."""
  if _this_run(obj):
    obj.setdefault('host', run_host())
    obj.setdefault('command', _RUN.get('command', ''))
  if not path:
    return
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(path.suffix + '.tmp')
  tmp.write_text(json.dumps(obj, indent=1, sort_keys=True, default=_jsonable))
  os.replace(tmp, path)


def _jsonable(x):
  import numpy as np  # pylint: disable=import-outside-toplevel
  if isinstance(x, (np.integer,)):
    return int(x)
  if isinstance(x, (np.floating,)):
    return float(x)
  if isinstance(x, np.ndarray):
    return x.tolist()
  if isinstance(x, Path):
    return str(x)
  return repr(x)
