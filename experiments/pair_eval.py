"""Quality and acceptance of the shipped pair and its drafts: BLEU, alpha, tokens per target call.

  python experiments/pair_eval.py [--drafts=draft,head,head:vocab=2582,runs/x/export] [--out=results/bench/pair_eval.json]
  python experiments/pair_eval.py --drafts='head;head:vocab=2582,parallel=1'   # ';' with options
  python experiments/pair_eval.py --smoke                                  # tests

Greedy BLEU (sacrebleu, 13a) of the target and of every T5 draft on the first --bleu_n test
verses; then for every draft (a T5 checkpoint or a feature-head directory; bare names are read
under specjax/assets/tiny_pair): speculative_decode of the first --alpha_n test verses at
T = 0 and T = 1, gamma --gamma, and the loop's statistics: alpha (the paper's
E[sum_x min(p, q)] at the verified prefixes), tokens per target call, empirical acceptance (also
by draft position), and whether greedy output equals autoregressive greedy. Counts, not timings: the load gate is not
needed for these figures (they do not depend on the machine), and the script prints none.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position

COLUMNS = [
    ('draft', 'draft', ''), ('kind', 'kind', ''), ('params_m', 'params M', '.2f'),
    ('bleu', 'BLEU (greedy)', '.1f'), ('alpha_t0', 'alpha T=0', '.3f'),
    ('tpc_t0', 'tokens/call T=0', '.2f'), ('alpha_t1', 'alpha T=1', '.3f'),
    ('tpc_t1', 'tokens/call T=1', '.2f'), ('same', 'greedy == AR', ''),
]


def by_position(accepted_hist_G1) -> list[float]:
  """P(draft i accepted | drafts 1 .. i-1 accepted), i = 1 .. gamma, from the loop's histogram of
  accepted counts: where acceptance falls off along the block (a head drafting from its own
  predicted features beyond position 1, say). Iterations cut short by the token budget count as
  if they had proposed gamma."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  reached = np.cumsum(np.asarray(accepted_hist_G1, np.float64)[::-1])[::-1]  # P(m >= i) * n
  return [float(reached[i] / reached[i - 1]) if reached[i - 1] else float('nan')
          for i in range(1, len(reached))]


def resolve(name: str, root: str) -> str:
  """A directory as given, else under root; a feature head's options ('head:vocab=2582') kept."""
  path = name.split(':')[0]
  return name if os.path.isdir(os.path.expanduser(path)) else os.path.join(root, name)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--drafts', default='draft,head')
  p.add_argument('--target', default='target')
  p.add_argument('--gamma', type=int, default=5)
  p.add_argument('--bleu_n', type=int, default=200, help='0: no BLEU (acceptance only)')
  p.add_argument('--alpha_n', type=int, default=64)
  p.add_argument('--max_new_tokens', type=int, default=96)
  p.add_argument('--batch', type=int, default=50)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--out', default='')
  p.add_argument('--smoke', action='store_true')
  a = p.parse_args(argv)
  if a.smoke:  # a random pair with a random head, in a folder removed afterwards
    import tempfile  # pylint: disable=import-outside-toplevel
    with tempfile.TemporaryDirectory(prefix='pair_eval_') as root:
      return evaluate(a, root)
  return evaluate(a, None)


def evaluate(a, smoke_root) -> dict:
  import numpy as np  # pylint: disable=import-outside-toplevel
  import sacrebleu  # pylint: disable=import-outside-toplevel
  import specjax  # pylint: disable=import-outside-toplevel
  from specjax import data  # pylint: disable=import-outside-toplevel
  from specjax.models import head as head_lib  # pylint: disable=import-outside-toplevel
  from specjax.models.t5 import param_count  # pylint: disable=import-outside-toplevel
  from specjax.runner import drafts as drafts_lib  # pylint: disable=import-outside-toplevel
  root = str(data.TINY_PAIR_DIR)
  if smoke_root is not None:
    import jax  # pylint: disable=import-outside-toplevel
    from specjax import testing  # pylint: disable=import-outside-toplevel
    root = smoke_root
    testing.write_random_pair(root, data.bible_tokenizer())
    t = specjax.load_t5(os.path.join(root, 'target'))
    hc = head_lib.HeadConfig.for_target(t.config, d_model=16, num_heads=2, d_kv=8, d_ff=32)
    head_lib.save_head(head_lib.init_head_params(hc, jax.random.PRNGKey(0)), hc,
                       os.path.join(root, 'head'))
    a.bleu_n, a.alpha_n, a.max_new_tokens, a.batch, a.gamma = 4, 4, 8, 4, 2
  tok = data.bible_tokenizer()
  test = data.load_pairs('test')
  src, ref = [r['en'] for r in test], [r['es'] for r in test]
  target = specjax.load_t5(resolve(a.target, root))

  def ids_of(texts):
    return tok(texts, return_tensors='np', padding=True).input_ids

  def translate(model, n):
    out = []
    for i in range(0, n, a.batch):
      o = specjax.autoregressive_decode(model, ids_of(src[i:min(i + a.batch, n)]),
                                        max_new_tokens=a.max_new_tokens)
      out += tok.batch_decode(np.asarray(o.tokens), skip_special_tokens=True)
    return out

  def bleu(model):  # --bleu_n=0: acceptance only
    if not a.bleu_n:
      return float('nan')
    return sacrebleu.corpus_bleu(translate(model, a.bleu_n), [ref[:a.bleu_n]]).score

  rows = [{'draft': 'target', 'kind': 'T5', 'params_m': param_count(target.config) / 1e6,
           'bleu': bleu(target)}]
  ids = ids_of(src[:a.alpha_n])
  base = specjax.autoregressive_decode(target, ids, max_new_tokens=a.max_new_tokens)
  # ';' separates drafts when a head's options hold a ',' ('head:vocab=2582,parallel=1').
  for name in a.drafts.split(';' if ';' in a.drafts else ','):
    path = resolve(name.strip(), root)
    if drafts_lib.is_head_dir(path):  # 'head', 'head:vocab=2582' (truncated), ':parallel=1', ':weights=int8'
      draft = drafts_lib.head_draft(target, path)
      row = {'draft': name, 'kind': 'feature head',
             'params_m': sum(int(x.size) for x in draft.params.values()) / 1e6}
    else:
      draft = specjax.load_t5(path)
      row = {'draft': name, 'kind': 'T5', 'params_m': param_count(draft.config) / 1e6,
             'bleu': bleu(draft)}
    for temp, tag in ((0.0, 't0'), (1.0, 't1')):
      out = specjax.speculative_decode(target, draft, ids, gamma=a.gamma,
                                       max_new_tokens=a.max_new_tokens, temperature=temp,
                                       rng=a.seed)
      s = out.stats
      row.update({f'alpha_{tag}': s.alpha, f'tpc_{tag}': s.tokens_per_target_call,
                  f'accept_{tag}': s.acceptance_rate,
                  f'by_pos_{tag}': by_position(np.asarray(s.accepted_hist).sum(0))})
      if temp == 0.0:
        row['same'] = bool((np.asarray(out.tokens) == np.asarray(base.tokens)).all())
    rows.append(row)
    print(f'{name}: {row}', flush=True)
  print(f'\n{a.alpha_n} test verses (alpha), {a.bleu_n} (BLEU), gamma {a.gamma}, '
        f'{a.max_new_tokens} new tokens at most, seed {a.seed}')
  print(bc.markdown_table(rows, COLUMNS))
  print('\nacceptance by draft position (given the ones before it were accepted), T = 0 | T = 1')
  for r in rows[1:]:
    print(f"{r['draft']}: " + ' '.join(f'{x:.2f}' for x in r['by_pos_t0']) + ' | '
          + ' '.join(f'{x:.2f}' for x in r['by_pos_t1']))
  result = {'args': vars(a), 'rows': rows}
  bc.write_json(a.out, result)
  return result


if __name__ == '__main__':
  main()
