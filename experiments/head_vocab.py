"""The feature head with a truncated draft vocabulary: acceptance and cost per pass against V_d.

  python experiments/head_vocab.py [--vocabs=500,1000,1500,2000,4000] [--split=dev] [--n=32]
  python experiments/head_vocab.py --split=test --vocabs=1000,4000      # the held-out check
  python experiments/head_vocab.py --write_vocab   # (re)writes the shipped head's vocab.json
  python experiments/head_vocab.py --smoke         # tests: a random head, seconds
  (--out=FILE.json keeps the rows)

For every V_d the shipped head (specjax/assets/tiny_pair/head) is cut to the lm_head columns of the
V_d most frequent target ids (its vocab.json: counts of the target-side ids of the training
verses) -- no retraining -- and decodes the first --n verses of --split with the shipped target:
alpha (the paper's E[sum_x min(p, q)]) at T = 0 and T = 1, tokens per target call at gamma
--gamma, and whether greedy output equals autoregressive greedy. Cost: one one-token head pass
(`FeatureHeadDraft.decode`, logits over the full V included) over one target decode step, both
timed inside compiled loops of 32 steps (runner.metrics.step_loop), every variant side by side in
one `time_interleaved` call (warm-up apart, block_until_ready, medians). V_d = V is the untruncated
head (the same program as without the option). Prints the CPU model and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position

COLUMNS = [
    ('vocab', 'V_d', ''), ('coverage', 'train token coverage', '.3f'),
    ('lm_head_share', 'lm_head share of weights', '.2f'),
    ('alpha_t0', 'alpha T=0', '.3f'), ('alpha_t1', 'alpha T=1', '.3f'),
    ('tpc_t0', 'tok/call T=0', '.2f'), ('tpc_t1', 'tok/call T=1', '.2f'),
    ('cost', 'cost per pass (target steps)', '.3f'), ('pass_us', 'pass us', '.0f'),
    ('same', 'greedy == AR', ''),
]


def write_vocab(head_dir, tokenizer, log=print):
  """vocab.json for the shipped head: the target-side (Spanish) ids of every training verse,
  EOS included, as the head's training labels are tokenised."""
  from specjax import data  # pylint: disable=import-outside-toplevel
  from specjax.models import head as head_lib  # pylint: disable=import-outside-toplevel
  rows = data.load_pairs('train')
  ids = tokenizer([r['es'] for r in rows])['input_ids']
  order, counts = head_lib.token_order(ids, len(tokenizer))
  path = head_lib.save_vocab(head_dir, order, counts,
                             f'target-side ids (EOS included) of the {len(rows)} bible_en_es '
                             'training verses')
  log(f'wrote {path}: {int(counts.sum())} tokens, {int((counts > 0).sum())} distinct ids')


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--vocabs', default='500,1000,1500,2000,4000')
  p.add_argument('--split', default='dev', choices=('dev', 'test'))
  p.add_argument('--n', type=int, default=32, help='verses decoded per V_d and temperature')
  p.add_argument('--gamma', type=int, default=5)
  p.add_argument('--max_new_tokens', type=int, default=64)
  p.add_argument('--repeats', type=int, default=9, help='timed repeats of the cost loops')
  p.add_argument('--cost_batch', type=int, default=1)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--write_vocab', action='store_true')
  p.add_argument('--out', default='', help='JSON of the rows (and the machine)')
  p.add_argument('--smoke', action='store_true')
  a = p.parse_args(argv)
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import specjax  # pylint: disable=import-outside-toplevel
  from specjax import data  # pylint: disable=import-outside-toplevel
  from specjax.decoding.feature_head import FeatureHeadDraft  # pylint: disable=import-outside-toplevel
  from specjax.models import head as head_lib  # pylint: disable=import-outside-toplevel
  from specjax.runner import metrics  # pylint: disable=import-outside-toplevel

  machine = bc.print_machine()
  tok = data.bible_tokenizer()
  head_dir = os.path.join(str(data.TINY_PAIR_DIR), 'head')
  tmp = None
  if a.smoke:  # the shipped target, a random narrow head with a ranking from a few verses
    tmp = tempfile.TemporaryDirectory(prefix='head_vocab_')
    head_dir = tmp.name
    t = specjax.load_t5(os.path.join(str(data.TINY_PAIR_DIR), 'target'))
    hc = head_lib.HeadConfig.for_target(t.config, d_model=16, num_heads=2, d_kv=8, d_ff=32)
    head_lib.save_head(head_lib.init_head_params(hc, jax.random.PRNGKey(0)), hc, head_dir)
    rows = data.load_pairs('train')[:200]
    head_lib.save_vocab(head_dir, *head_lib.token_order(tok([r['es'] for r in rows])['input_ids'],
                                                        len(tok)), 'smoke')
    a.vocabs, a.n, a.max_new_tokens, a.repeats, a.gamma = '100,4000', 4, 8, 2, 2
  elif a.write_vocab:
    write_vocab(head_dir, tok)
  target = specjax.load_t5(os.path.join(str(data.TINY_PAIR_DIR), 'target'))
  v = target.config.vocab_size
  with open(os.path.join(head_dir, head_lib.VOCAB_NAME), encoding='utf-8') as f:
    ranking = np.asarray(json.load(f)['counts'], np.float64)
  coverage = np.cumsum(ranking) / max(ranking.sum(), 1.0)
  rows_in = data.load_pairs(a.split)[:a.n]
  ids = tok([r['en'] for r in rows_in], return_tensors='np', padding=True).input_ids
  base = specjax.autoregressive_decode(target, ids, max_new_tokens=a.max_new_tokens)

  rows, heads = [], {}
  for vd in [int(x) for x in a.vocabs.split(',')]:
    head = FeatureHeadDraft.for_target(target, head_dir, vocab=None if vd >= v else vd)
    heads[vd] = head
    n_all = head_lib.param_count(head.config)
    d = head.config.d_model
    row = {'vocab': vd, 'coverage': float(coverage[min(vd, v) - 1]),
           'lm_head_share': d * head.draft_vocab / (n_all - d * (v - head.draft_vocab))}
    for temp, tag in ((0.0, 't0'), (1.0, 't1')):
      out = specjax.speculative_decode(target, head, ids, gamma=a.gamma,
                                       max_new_tokens=a.max_new_tokens, temperature=temp,
                                       rng=a.seed)
      s = out.stats
      row.update({f'alpha_{tag}': float(s.alpha), f'tpc_{tag}': float(s.tokens_per_target_call)})
      if temp == 0.0:
        row['same'] = bool(np.array_equal(np.asarray(out.tokens), np.asarray(base.tokens)))
    rows.append(row)
    print(f'V_d {vd}: {row}', flush=True)

  # Cost per pass: every head variant and the target, interleaved in one timing call.
  cost_ids = jnp.asarray(ids[:a.cost_batch])
  cache_len = 64
  b = cost_ids.shape[0]
  tok_Bx1 = jnp.zeros((b, 1), jnp.int32)
  lengths_B = jnp.full((b,), cache_len // 2, jnp.int32)
  target_cache = jax.jit(target.init_cache, static_argnums=1)(cost_ids, cache_len)
  fns = {'target': lambda: metrics.step_loop(target, target_cache, tok_Bx1, lengths_B, steps=32)}
  for vd, head in heads.items():
    state = jax.jit(lambda c, h=head: h.init(cost_ids, cache_len, target_cache=c))(target_cache)
    fns[vd] = (lambda h=head, st=state:
               metrics.step_loop(h, st, tok_Bx1, lengths_B, steps=32))
  timings = metrics.time_interleaved(fns, repeats=a.repeats)
  t_target = timings['target'].median_s
  for row in rows:
    row['cost'] = timings[row['vocab']].median_s / t_target
    row['pass_us'] = timings[row['vocab']].median_s / 32 * 1e6
  print(f"\n{a.n} {a.split} verses, gamma {a.gamma}, at most {a.max_new_tokens} new tokens, seed "
        f"{a.seed}; cost: batch {b}, cache {cache_len}, 32 steps per loop, median of {a.repeats}; "
        f"target step {t_target / 32 * 1e6:.0f} us; load average now "
        + ' '.join(f'{x:.2f}' for x in bc.load_average()))
  print(bc.markdown_table(rows, COLUMNS))
  if tmp is not None:
    tmp.cleanup()
  result = {'args': vars(a), 'machine': machine, 'load_average_end': bc.load_average(),
            'target_step_s': t_target / 32, 'rows': rows}
  if a.out:
    bc.write_json(a.out, result)
  return result


if __name__ == '__main__':
  main()
