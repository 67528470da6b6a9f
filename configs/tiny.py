"""The embedded offline default: the shipped EN->ES tiny pair on held-out Bible verses.

  python -m specjax.run                       # same as --config=configs/tiny.py
  python -m specjax.run --config=configs/tiny.py:smoke

Runs on a laptop CPU with no network (under 2 minutes on 2 cores): a memory-bound 24.3M-param
target, a distilled 1.6M-param T5 draft and a feature head that reads the target's hidden states,
all trained by specjax itself (docs/tiny_pair.md), at T = 0 and 1 and gamma 3 and 5. The smoke
variant (tests) runs the draft only, at one gamma.
"""

import os

import specjax
from configs import common

ASSETS = os.path.join(os.path.dirname(os.path.abspath(specjax.__file__)), 'assets', 'tiny_pair')


def get_config(arg=None):
  a = common.parse_arg(arg, smoke=False)
  c = common.base_config()
  c.name = 'tiny'
  c.target = os.path.join(ASSETS, 'target')
  # The distilled small T5 draft and the feature head that reads the target's own hidden states
  # (specjax.decoding.feature_head), side by side. The head drafts from the 2582 target ids that
  # occur in the training verses' targets (its vocab.json; the other 1418 never do): alpha as with
  # all 4000, a quarter less per pass (docs/tiny_pair.md, truncated draft vocabulary). Its
  # matrices are stored in int8 for the CPU kernels: a draft's weights change q only, never the
  # output law; alpha within 0.005 of the bf16 head's, a gamma-3 proposal 0.29 -> 0.21 target
  # steps (experiments/pair_eval.py, draft_cost.py; docs/cpu_kernels.md).
  c.drafts = (os.path.join(ASSETS, 'draft'),
              os.path.join(ASSETS, 'head') + ':vocab=2582,weights=int8')
  c.tasks = ('bible_en_es',)
  c.temperatures = (0.0, 1.0)
  c.gammas = (3, 5)
  c.num_examples = 8
  c.max_source_len = 64
  c.max_new_tokens = 40
  c.repeats = 5
  c.block_cost = True  # measured: (gamma+1)-token step / 1-token step, call and iteration costs
  c.dtype = 'float32'
  c.output_dir = 'results/tiny'
  if a.smoke:
    c.drafts = c.drafts[:1]
    c.block_cost = False
    c.gammas = (3,)
    c.num_examples = 4
    c.max_new_tokens = 16
    c.repeats = 1
    c.output_dir = 'results/tiny_smoke'
  return c
