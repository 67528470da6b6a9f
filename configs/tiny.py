"""The embedded offline default: the shipped EN->ES tiny pair on held-out Bible verses.

  python -m specjax.run                       # same as --config=configs/tiny.py
  python -m specjax.run --config=configs/tiny.py:smoke

Runs on a laptop CPU with no network; the pair is trained by specjax itself (docs/tiny_pair.md).
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
  c.drafts = (os.path.join(ASSETS, 'draft'),)
  c.tasks = ('bible_en_es',)
  c.temperatures = (0.0, 1.0)
  c.gammas = (2, 3, 5)
  c.num_examples = 16
  c.max_source_len = 64
  c.max_new_tokens = 48
  c.repeats = 3
  c.dtype = 'float32'
  c.output_dir = 'results/tiny'
  if a.smoke:
    c.gammas = (3,)
    c.num_examples = 4
    c.max_new_tokens = 16
    c.repeats = 1
    c.output_dir = 'results/tiny_smoke'
  return c
