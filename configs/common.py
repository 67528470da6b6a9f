"""Defaults shared by every experiment config.

The fields, their defaults and one-line docs are `specjax.runner.config.RunSpec` (one place;
`python -m specjax.run --help` prints them). A config file is one runnable experiment:
`get_config(arg)` returns a ConfigDict, any field can be overridden on the command line
(`--config.gammas=3,5 --config.num_examples=20`), and `specjax.runner.config.run_spec` validates
it before anything is loaded.
"""

import ml_collections

from specjax import configuring
from specjax.runner.config import RunSpec


def parse_arg(arg, positional: str = '', **defaults):
  """Parses a config argument 'smoke' or 'key=value,flag' into a ConfigDict of named options; with
  `positional`, a bare word that is no option's name is that option's value ('xxl' = 'size=xxl')."""
  out = ml_collections.ConfigDict(defaults)
  for part in (arg or '').split(','):
    part = part.strip()
    if not part:
      continue
    key, _, value = part.partition('=')
    if positional and '=' not in part and key not in out:
      key, value = positional, part
    if key not in out:
      raise ValueError(f'config argument {key!r} unknown (known: {", ".join(out.keys())})')
    kind = type(out[key])
    out[key] = (value.lower() in ('1', 'true', 'yes', '')) if kind is bool else kind(value)
  return out


def base_config():
  """The default ConfigDict: every field of specjax.runner.config.RunSpec, where each is documented
  once (`python -m specjax.run --help` lists them)."""
  return configuring.config_dict(RunSpec)


def t5xxl_config(arg, *, draft_size=None, ngram=None, smoke_gamma=5):
  """T5-XXL target sweeps (paper Tables 2 and 3); `arg` takes 'v11' and 'smoke'.

  Defaults to the original multitask checkpoints (t5-11b with t5-<size>), which run EnDe and CNN/DM
  without fine-tuning; 'v11' switches to google/t5-v1_1-* (fine-tune them with specjax.finetune for
  the paper's setting and pass the directories with --config.target / --config.drafts).
  """
  a = parse_arg(arg, v11=False, smoke=False)
  c = base_config()
  if ngram:
    c.name, c.drafts, c.gammas = f't5xxl_{ngram}', (ngram,), (1, 2, 3)
  else:
    c.name = f't5xxl_{draft_size}'
    c.drafts = (f'google/t5-v1_1-{draft_size}' if a.v11 else f't5-{draft_size}',)
  c.target = 'google/t5-v1_1-xxl' if a.v11 else 't5-11b'
  c.tasks = ('ende', 'cnndm')
  c.output_dir = f'results/{c.name}'
  if a.smoke:
    c.gammas = (smoke_gamma,)
    c.num_examples = 2
    c.max_new_tokens = 16
    c.repeats = 1
  return c
