"""specjax vs transformers (PyTorch, CPU): the same HF checkpoints, prompts, greedy, batch 1.

  python experiments/bench_transformers.py [--pairs=tiny,t5-small] [--gamma=5] [--out=FILE.json]
  python experiments/bench_transformers.py --smoke          # seconds, random tiny pair (tests)

Refuses (exit 3) on a loaded machine unless --allow-loaded (bench_common: the load gate).

Rows per model pair, on the same test verses one at a time (batch 1), greedy:

  transformers greedy     target.generate(do_sample=False, num_beams=1)
  transformers assisted   target.generate(assistant_model=draft) with the assistant's generation
                          config set to the plain algorithm: num_assistant_tokens = gamma,
                          num_assistant_tokens_schedule = 'constant' (no +2/-1 heuristic) and
                          assistant_confidence_threshold = 0 (no early stop of the draft on low
                          confidence, no ROC re-tuning). Greedy acceptance is then exactly the
                          paper's: keep drafts up to the first mismatch with the target's argmax,
                          plus one target token. (The assistant still stops a block at EOS.)
  specjax autoregressive  decoding.autoregressive_decode, one compiled while_loop
  specjax speculative     decoding.speculative_decode(gamma), one compiled while_loop
  ctranslate2 greedy      CTranslate2 (the CPU inference engine translation users deploy) on the
                          same weights converted by its own converter, in a worker process
                          (experiments/ct2_peer.py), float32 (`--ct2`), at each torch thread
                          count (the x ctranslate2 column divides by the faster); where the
                          checkpoint has a tokenizer
  ... [int8] rows         with `--int8`: specjax's int8-weight target (load_t5(quantize='int8'))
                          and CTranslate2's int8 compute type; each int8 scheme is its own target,
                          so these rows are checked against specjax's int8 greedy tokens and
                          CTranslate2's int8 row reports the share of identical sequences

and a check that all of them produce identical tokens for every prompt. Each row is the median
over `repeats` rounds of decoding all prompts, rounds interleaved (A B C D A B C D ...) after one
warm-up round (reported separately: JAX compiles there).

Threads: XLA's CPU client uses all cores (2 here). Torch is timed with torch.set_num_threads(2) --
the same -- and, by default, also with 1 thread (`--torch_threads=0,1`), each setting its own
transformers rows: on a loaded machine torch's OpenMP workers at 2 threads spin against other
processes and run up to ~10x slower, which would flatter specjax. The `x tf ...` ratio columns use
the FASTEST transformers row, so they are the conservative figure.

Pairs: `tiny` = the shipped EN->ES pair (specjax/assets/tiny_pair; a random stand-in of the same
shapes while it is absent); `t5-small` = random t5-small-shaped target written by transformers
with a spread-out init and the draft = its own embedding/head + first 2 encoder/decoder blocks
(target blocks after those damped, see bench_common.build_hf_pair).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position
import ct2_peer  # noqa: E402  pylint: disable=wrong-import-position

COLUMNS = [
    ('method', 'method', ''),
    ('tokens_per_s', 'tokens/s', '.1f'),
    ('ms_per_seq', 'ms / sequence', '.2f'),
    ('vs_tf_greedy', 'x tf greedy', '.2f'),
    ('vs_tf_assisted', 'x tf assisted', '.2f'),
    ('vs_ct2', 'x ctranslate2', '.2f'),
    ('first_round_s', 'warm-up round s', '.2f'),
    ('identical', 'same tokens', ''),
]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--pairs', default='tiny,t5-small', help='comma list of tiny, t5-small')
  p.add_argument('--gamma', default='tiny=5,t5-small=3',
                 help="drafts per iteration, the same for transformers and specjax: an int, or "
                      "per pair 'tiny=5,t5-small=3' (t5-small's draft costs c ~ 0.6 of the "
                      "target -- the 32128-word head dominates -- so a short block suits it)")
  p.add_argument('--n', type=int, default=8, help='test verses (one sequence each, batch 1)')
  p.add_argument('--max_new_tokens', type=int, default=48)
  p.add_argument('--repeats', type=int, default=5)
  p.add_argument('--torch_threads', default='0,1',
                 help='comma list of torch thread counts to time (0 = all cores, as XLA); each '
                      'gets its own transformers rows. Ratios use the fastest transformers row.')
  p.add_argument('--ct2', default='float32',
                 help="CTranslate2 compute types to time beside (comma list; '' for none): "
                      'float32, int8')
  p.add_argument('--int8', action='store_true',
                 help='also time specjax with int8 weights (and CTranslate2 int8 if --ct2 has it)')
  a = bc.parse_bench_args(p, argv, smoke_help='random tiny pair, 2 prompts, 1 repeat')
  if a.smoke:
    a.pairs, a.n, a.max_new_tokens, a.repeats, a.gamma = 'smoke', 2, 12, 1, '3'
    a.torch_threads = '1'
  if a.ct2 and not ct2_peer.available():
    print('ctranslate2 is not installed (pip install ctranslate2): no CTranslate2 rows')
    a.ct2 = ''
  return a


def gamma_for(spec: str, pair: str) -> int:
  spec = str(spec)
  if '=' not in spec:
    return int(spec)
  table = dict(kv.split('=') for kv in spec.split(','))
  return int(table.get(pair, table.get('default', 5)))


def run_pair(name: str, args, log=print, gate=None) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  from transformers import T5ForConditionalGeneration  # pylint: disable=import-outside-toplevel
  from transformers.cache_utils import DynamicCache, EncoderDecoderCache  # pylint: disable=import-outside-toplevel
  from specjax.decoding import loop as decoding  # pylint: disable=import-outside-toplevel

  pair_start = gate.mark() if gate is not None else None
  tdir, ddir, desc = bc.resolve_pair(name, smoke=(name == 'smoke'))
  log(f'\n== {name}: {desc}')
  tf_target = T5ForConditionalGeneration.from_pretrained(str(tdir), dtype=torch.float32).eval()
  tf_draft = T5ForConditionalGeneration.from_pretrained(str(ddir), dtype=torch.float32).eval()
  gc = tf_draft.generation_config
  gc.num_assistant_tokens = gamma_for(args.gamma, name)
  gc.num_assistant_tokens_schedule = 'constant'
  gc.assistant_confidence_threshold = 0.0
  target, draft = bc.load_pair_jax(tdir, ddir, jnp.float32)
  cfg = target.config
  padded, ids, _ = bc.load_prompts(args.n, cfg.vocab_size, tdir, eos_id=cfg.eos_token_id)
  jax_prompts = [jnp.asarray(padded[i:i + 1]) for i in range(len(ids))]
  tf_prompts = [torch.tensor([x], dtype=torch.long) for x in ids]
  m, gamma = args.max_new_tokens, gamma_for(args.gamma, name)
  gen_kw = dict(max_new_tokens=m, do_sample=False, num_beams=1, min_new_tokens=0,
                repetition_penalty=None, no_repeat_ngram_size=None, length_penalty=None,
                decoder_start_token_id=cfg.decoder_start_token_id, eos_token_id=cfg.eos_token_id,
                pad_token_id=cfg.pad_token_id)
  stats = {}

  def tf_run(assisted, threads):
    def run():
      torch.set_num_threads(threads)
      outs = []
      with torch.inference_mode():
        for x in tf_prompts:
          kw = dict(gen_kw, assistant_model=tf_draft) if assisted else gen_kw
          # A lazily grown cache: transformers 5.24 sizes the default one from num_layers (the
          # encoder's), so a T5 with more decoder than encoder layers (the tiny pair: 2 + 4)
          # fails in generate with an IndexError.
          cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
          seq = tf_target.generate(input_ids=x, attention_mask=torch.ones_like(x), cache=cache,
                                   **kw)
          outs.append(seq[0, 1:].tolist())  # drop decoder_start
      return outs
    return run

  def jax_run(speculative, tgt=target):
    def run():
      outs = []
      for x in jax_prompts:
        if speculative:
          o = decoding.speculative_decode(tgt, draft, x, gamma=gamma, max_new_tokens=m)
          if tgt is target:
            stats.setdefault('spec', []).append(o.stats)
        else:
          o = decoding.autoregressive_decode(tgt, x, max_new_tokens=m)
        outs.append(o)
      toks = [np.asarray(o.tokens[0, :int(o.lengths[0])]).tolist() for o in outs]
      return toks
    return run

  threads = sorted({t or (os.cpu_count() or 1) for t in map(int, args.torch_threads.split(','))},
                   reverse=True)
  fns = {}
  for t in threads:
    fns[f'transformers greedy [{t} thr]'] = tf_run(False, t)
    fns[f'transformers assisted [{t} thr]'] = tf_run(True, t)
  fns['specjax autoregressive'] = jax_run(False)
  fns['specjax speculative'] = jax_run(True)
  workers = add_ct2_rows(fns, args, tdir, ids, m, threads, log)
  if getattr(args, 'int8', False):
    from specjax.models.checkpoints import load_t5  # pylint: disable=import-outside-toplevel
    target_i8 = load_t5(str(tdir), quantize='int8')
    fns['specjax autoregressive [int8]'] = jax_run(False, target_i8)
    fns['specjax speculative [int8]'] = jax_run(True, target_i8)
  methods = list(fns)
  results = {k: None for k in methods}

  def keep(name_, fn):
    def wrapped():
      results[name_] = fn()
      return None
    return wrapped

  try:
    timings = bc.interleave({k: keep(k, f) for k, f in fns.items()}, repeats=args.repeats)
  finally:
    for w in workers.values():
      w.close()
  for k, w in workers.items():  # the worker's own clock (no pipe), as the JAX rows time theirs
    timings[k]['times_s'] = list(w.seconds)
    timings[k]['median_s'] = statistics.median(w.seconds)
  torch.set_num_threads(threads[0])
  ref = results[methods[0]]
  refs = {k: results['specjax autoregressive [int8]'] if int8(k) else ref for k in methods}
  n_tokens = sum(len(x) for x in ref)
  rows = []
  for k in methods:
    t = timings[k]['median_s']
    n_k = sum(len(x) for x in results[k])
    if k.startswith('ctranslate2') and int8(k):  # its own int8 scheme: share of equal sequences
      same = f'{sum(a == b for a, b in zip(results[k], refs[k])) / len(ids):.0%} seqs'
    else:
      same = results[k] == refs[k]
    rows.append({'method': k, 'tokens_per_s': n_k / t, 'ms_per_seq': 1e3 * t / len(ids),
                 'median_s': t, 'times_s': timings[k]['times_s'],
                 'first_round_s': timings[k]['first_s'], 'identical': same, 'tokens': n_k})
  # Ratios against the FASTEST transformers configuration (conservative for specjax).
  tf_g = min(r['median_s'] for r in rows if r['method'].startswith('transformers greedy'))
  tf_a = min(r['median_s'] for r in rows if r['method'].startswith('transformers assisted'))
  for r in rows:
    r['vs_tf_greedy'] = tf_g / r['median_s']
    r['vs_tf_assisted'] = tf_a / r['median_s']
  for r in rows:  # tokens/s over CTranslate2's fastest thread setting with the same weights
    peers = [x['tokens_per_s'] for x in rows if x['method'].startswith('ctranslate2')
             and int8(x['method']) == int8(r['method'])]
    if peers and r['method'].startswith('specjax'):
      r['vs_ct2'] = r['tokens_per_s'] / max(peers)
  mismatches = [(i, k) for k, r in zip(methods, rows) if isinstance(r['identical'], bool)
                for i, (a, b) in enumerate(zip(results[k], refs[k])) if a != b]
  last = stats.get('spec', [])[-len(ids):]
  emitted = sum(int(np.sum(s.emitted)) for s in last)
  calls = sum(int(np.sum(s.target_calls)) for s in last)
  acc_sum = sum(float(np.sum(s.alpha_sum)) for s in last)
  acc_cnt = sum(int(np.sum(s.alpha_count)) for s in last)
  record = {
      'pair': name, 'description': desc, 'target_dir': str(tdir), 'draft_dir': str(ddir),
      'gamma': gamma, 'prompts': len(ids), 'max_new_tokens': m, 'generated_tokens': n_tokens,
      'source_len_padded': int(padded.shape[1]), 'repeats': args.repeats,
      'alpha': acc_sum / max(acc_cnt, 1), 'tokens_per_target_call': emitted / max(calls, 1),
      'rows': rows, 'all_identical': not mismatches, 'mismatches': mismatches[:20],
      'target_params': sum(int(np.prod(x.shape)) for x in jax.tree.leaves(target.params)),
      'draft_params': sum(int(np.prod(x.shape)) for x in jax.tree.leaves(draft.params)),
      'load_average_end': bc.load_average(),
  }
  log(f"gamma {gamma}, {len(ids)} prompts x batch 1, {n_tokens} generated tokens, "
      f"alpha {record['alpha']:.3f}, tokens/target call {record['tokens_per_target_call']:.2f}, "
      f"params target {record['target_params'] / 1e6:.2f}M draft {record['draft_params'] / 1e6:.2f}M")
  log(bc.markdown_table(rows, COLUMNS))
  if gate is not None:
    record['load'], line = bc.table_load(gate, pair_start)
    log(line)
  spec = rows[-1]
  at_all = next(r for r in rows if r['method'] == f'transformers assisted [{threads[0]} thr]')
  record['speedup_vs_tf_assisted'] = spec['vs_tf_assisted']
  record['speedup_vs_tf_assisted_all_threads'] = at_all['median_s'] / spec['median_s']
  log(f"specjax speculative vs transformers assisted: {spec['vs_tf_assisted']:.2f}x tokens/s "
      f"(vs the fastest torch thread setting; {record['speedup_vs_tf_assisted_all_threads']:.2f}x "
      f"vs {threads[0]} threads); identical tokens in all {len(methods)} rows: "
      f"{'yes' if not mismatches else 'NO ' + str(mismatches[:5])}")
  return record


def int8(method: str) -> bool:
  """Whether a row's method name is an int8-weight row ('... [int8]', '... [int8, 1 thr]')."""
  return '[int8' in method


def add_ct2_rows(fns, args, tdir, ids, max_new: int, threads, log) -> dict:
  """CTranslate2 rows (one worker process per compute type and thread count, as torch's rows:
  on a 2-core host its 2-thread setting can be the slower one) for a pair with a tokenizer; the
  workers' own round times replace the pipe-inclusive ones after timing."""
  types = [t for t in getattr(args, 'ct2', '').split(',') if t]
  tok = bc.load_tokenizer_for(tdir) if types else None
  if not types or tok is None or not (Path(tdir) / 'tokenizer.json').is_file():
    if types:
      log('no CTranslate2 rows for this pair: its checkpoint has no tokenizer to convert')
    return {}
  model_dir = ct2_peer.convert(tdir, bc.cache_dir())
  sources = [tok.convert_ids_to_tokens(x) for x in ids]
  workers = {}
  for ct in types:
    for t in threads:
      name = 'ctranslate2 greedy [' + ('int8, ' if ct == 'int8' else '') + f'{t} thr]'
      w = workers[name] = ct2_peer.Worker(model_dir, ct, t, max_new)
      w.seconds = []

      def run(w=w):
        secs, outs = w.round(sources)
        w.seconds.append(secs)
        return [tok.convert_tokens_to_ids(o) for o in outs]
      fns[name] = run
  log(f'CTranslate2 {ct2_peer.version()}: {", ".join(types)}; '
      f'{" and ".join(map(str, threads))} threads, ISA '
      f'{next(iter(workers.values())).isa}; model converted in {model_dir.name}')
  return workers


def main(argv=None) -> dict:
  args = parse_args(argv)
  gate = bc.load_gate(args)
  threads = bc.set_threads(None)
  import jax  # pylint: disable=import-outside-toplevel,unused-import
  import torch  # pylint: disable=import-outside-toplevel,unused-import
  import transformers  # pylint: disable=import-outside-toplevel,unused-import
  info = bc.machine_info()
  print(f'machine: {bc.describe_machine(info)}; XLA uses all {threads} cores; torch rows are '
        f'timed at torch.set_num_threads({args.torch_threads}) (0 = {threads}, the same as XLA)')
  t0 = time.perf_counter()
  out = {'machine': info, 'args': vars(args), 'pairs': []}
  for name in args.pairs.split(','):
    out['pairs'].append(run_pair(name.strip(), args, gate=gate))
    bc.write_json(args.out, out)
  out['wall_s'] = time.perf_counter() - t0
  out['all_identical'] = all(p['all_identical'] for p in out['pairs'])
  bc.finish_load(gate, out, args.out)
  if not out['all_identical']:
    print('ERROR: outputs differ between implementations', file=sys.stderr)
  return out


if __name__ == '__main__':
  result = main()
  sys.exit(0 if result['all_identical'] else 1)
