"""Entry point: `python -m specjax.run [--config=configs/tiny.py] [--config.gammas=3,5 ...]`.

Parses flags, validates the config into a RunSpec (errors name the field, before anything is loaded
or compiled) and calls specjax.runner.experiment.run, which a notebook can call directly too.
Every bad input -- flags, config file, config values, checkpoint and data files, the mesh -- is one
line on stderr and exit status 2. `--help` lists the config fields (specjax.runner.config.RunSpec).
"""

from __future__ import annotations

import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # configs/ import each other as the `configs` package
  sys.path.insert(0, _REPO)

PROG = 'specjax.run'
DEFAULT_CONFIG = os.path.join(_REPO, 'configs', 'tiny.py')


def help_text() -> str:
  from specjax import configuring  # pylint: disable=import-outside-toplevel
  from specjax.runner.config import RunSpec  # pylint: disable=import-outside-toplevel
  return '\n'.join([
      'usage: python -m specjax.run [--config=configs/<file>.py[:arg]] [--config.<field>=VALUE ...]',
      '',
      '  --config=FILE[:ARG]  experiment config (default configs/tiny.py: the shipped tiny pair,',
      '                       offline); e.g. configs/tiny.py:smoke, configs/t5xxl_base.py:v11',
      '',
      'config fields (override any with --config.<field>=VALUE; [base default], config files',
      'set their own):',
      *configuring.help_lines(RunSpec),
  ])


def _fail(message) -> None:
  print(f'{PROG}: {" ".join(str(message).split())}', file=sys.stderr)
  sys.exit(2)


def main(argv, config):
  if len(argv) > 1:
    _fail(f'unexpected arguments: {" ".join(argv[1:])} (fields are set as --config.<field>=VALUE)')
  from specjax.errors import ConfigError  # pylint: disable=import-outside-toplevel
  from specjax.runner import config as config_lib  # pylint: disable=import-outside-toplevel
  try:
    spec = config_lib.run_spec(config)
  except ConfigError as e:
    _fail(e)
  from specjax import data  # pylint: disable=import-outside-toplevel
  from specjax.runner import experiment  # pylint: disable=import-outside-toplevel
  try:
    experiment.run(spec)
  except (ConfigError, FileNotFoundError, data.TaskUnavailableError) as e:
    _fail(e)


def cli():
  from specjax.runner import console  # pylint: disable=import-outside-toplevel
  console.quiet()  # before the libraries that log at import or start-up
  from specjax import configuring  # pylint: disable=import-outside-toplevel
  configuring.run_cli(PROG, main, help_text, default=DEFAULT_CONFIG,
                      flag_help='Experiment config file (configs/*.py), optionally file.py:arg.')


if __name__ == '__main__':
  cli()
