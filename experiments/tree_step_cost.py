"""Where one speculative iteration's time goes: a chain against static and dynamic trees, batch 1.

  python experiments/tree_step_cost.py [--draft=model|head] [--temps=0,1] [--gamma=8]
                                       [--trees='(2,1,1,1);dynamic:8,2,1,1,1,1,1,1,1:reach=0.1']
  python experiments/tree_step_cost.py --smoke      # seconds, random smoke pair (tests)

bench_tree measures tokens per target call and tok/s; this script says why a tree that verifies
more tokens per call can still lose in wall clock. For each form (engine.Chain(gamma), a static
Tree, a DynamicForm) it times, each jitted on its own at the state after one prompt's encoder
and 10 decoded positions (the shipped tiny pair, the first test verse):

  propose   the draft's proposal (a chain's rollout, a tree's level-by-level expansion, plus a
            dynamic tree's scoring and choice)
  score     the target's one pass over the block (decode / decode_tree, features for the head)
  verify    the acceptance rule (verify_chain / recursive rejection sampling over the tree)
  step      the whole engine.block_step (the above plus commit, the cache's path gather, stats),
            as the loop runs it

in ms (median of --repeats after a warm-up; every call ends in block_until_ready), beside the
target's 1-token decode step, and the step over the chain's step. The pieces jitted apart pay
their own dispatch and output copies, so they need not add up to the step. The load is recorded.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402  pylint: disable=wrong-import-position

COLUMNS = [('form', 'form', ''), ('propose', 'propose ms', '.2f'), ('score', 'score ms', '.2f'),
           ('verify', 'verify ms', '.2f'), ('step', 'step ms', '.2f'),
           ('vs_chain', 'step / chain step', '.2f'), ('vs_target', 'step / target step', '.2f')]
DEFAULT_TREES = '(2,1,1,1);(2,1,1,1,1,1,1,1);dynamic:8,2,1,1,1,1,1,1,1;dynamic:8,2,1,1,1,1,1,1,1:reach=0.1'


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--draft', default='model', choices=('model', 'head'))
  p.add_argument('--temps', default='0,1')
  p.add_argument('--gamma', type=int, default=8, help='the chain every form is compared with')
  p.add_argument('--trees', default=DEFAULT_TREES, help="trees separated by ';'")
  p.add_argument('--repeats', type=int, default=30)
  args = bc.parse_bench_args(p, argv, out_default=None, smoke_help='random smoke pair, 3 repeats')
  if args.smoke:
    args.repeats, args.trees, args.gamma = 3, '(2,1);dynamic:4,2,2', 4
  return args


def median_ms(fn, *a, repeats: int) -> float:
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  jax.block_until_ready(fn(*a))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn(*a))
    times.append(time.perf_counter() - t)
  return 1e3 * float(np.median(times))


def forms(args):
  from specjax.decoding import engine, shapes  # pylint: disable=import-outside-toplevel
  from specjax.decoding import tree as tree_lib  # pylint: disable=import-outside-toplevel
  yield f'chain {args.gamma}', engine.Chain(args.gamma)
  for shape in shapes.parse_trees(args.trees):
    yield (str(shape) if isinstance(shape, shapes.DynamicTree) else f'tree {shape}',
           tree_lib.form_for(shape))


def measure(target, draft, prompt_1xS, temperature, args) -> list[dict]:
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.decoding import acceptance, engine, stopping  # pylint: disable=import-outside-toplevel
  from specjax.decoding.sampling import Sampling  # pylint: disable=import-outside-toplevel
  from specjax.decoding.model_draft import as_draft  # pylint: disable=import-outside-toplevel
  from specjax.decoding.tree_form import as_tree_draft  # pylint: disable=import-outside-toplevel

  sampling = Sampling(temperature=temperature)
  verifier, stop = acceptance.verifier_for('token'), stopping.Fixed()
  vocab = target.config.vocab_size
  rows = []
  for name, form in forms(args):
    d = as_draft(draft) if isinstance(form, engine.Chain) else as_tree_draft(draft)
    st = engine.init_state(target, d, prompt_1xS, jax.random.PRNGKey(0), form=form,
                           max_new_tokens=48)
    st = st.replace(lengths=jnp.full_like(st.lengths, 10))
    keys = engine.split_keys(engine.row_keys(st.rng, 0, st.lengths.shape[0]))
    limit = jnp.full(st.lengths.shape, form.width, jnp.int32)
    propose = jax.jit(lambda st, k, form=form, d=d: form.propose(
        d, st.draft_state, st, k, sampling, stop, limit, vocab))
    score = jax.jit(lambda st, p, form=form, d=d: form.score(target, d, st.target_cache, p, st))
    verify = jax.jit(lambda p, lg, k, form=form: form.verify(verifier, k, p, lg, sampling))
    step = jax.jit(lambda st, k, form=form, d=d: engine.block_step(
        target, d, form, st, k, sampling=sampling, verifier=verifier, stop=stop, eos_id=-1,
        max_new_tokens=48)[0])
    prop = propose(st, keys[0])
    logits = score(st, prop)[0]
    rows.append(dict(form=name, propose=median_ms(propose, st, keys[0], repeats=args.repeats),
                     score=median_ms(score, st, prop, repeats=args.repeats),
                     verify=median_ms(verify, prop, logits, keys[1], repeats=args.repeats),
                     step=median_ms(step, st, keys, repeats=args.repeats)))
  one = jax.jit(lambda c: target.decode(c, jnp.ones((1, 1), jnp.int32),
                                        jnp.full((1,), 10, jnp.int32))[0])
  target_ms = median_ms(one, st.target_cache, repeats=args.repeats)
  for r in rows:
    r.update(vs_chain=r['step'] / rows[0]['step'], vs_target=r['step'] / target_ms)
  rows.append(dict(form='target 1-token step', step=target_ms, vs_target=1.0))
  return rows


def run_pair(name, args, gate=None, log=print) -> dict:
  import numpy as np  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  target, draft, desc, padded, _ = bc.load_bench_pair(name, 1, smoke=(name == 'smoke'))
  if args.draft == 'head':
    draft, head_desc = bc.head_draft(name, target)
    desc = f'{desc}; draft: {head_desc}'
  log(f'\n== {name}: {desc}')
  record = {'pair': name, 'description': desc, 'draft': args.draft, 'settings': []}
  for temperature in [float(t) for t in args.temps.split(',')]:
    start = gate.mark() if gate is not None else None
    rows = measure(target, draft, jnp.asarray(np.asarray(padded)[:1]), temperature, args)
    setting = dict(batch=1, temperature=temperature, rows=rows)
    log(f'\n{name}, batch 1, T = {temperature:g}, one iteration at 10 decoded positions')
    log(bc.markdown_table(rows, COLUMNS))
    if gate is not None:
      setting['load'], line = bc.table_load(gate, start)
      log(line)
    record['settings'].append(setting)
  return record


def main(argv=None) -> dict:
  args = parse_args(argv)
  args.pairs = 'smoke' if args.smoke else 'tiny'
  result, gate = bc.run_pairs(args, run_pair)
  bc.finish_load(gate, result, args.out)
  return result


if __name__ == '__main__':
  main()
