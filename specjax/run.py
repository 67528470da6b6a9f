"""Entry point: `python -m specjax.run [--config=configs/tiny.py] [--config.gammas=3,5 ...]`.

Parses flags, validates the config into a RunSpec (errors name the field, before anything is loaded
or compiled) and calls specjax.runner.experiment.run, which a notebook can call directly too.
"""

from __future__ import annotations

import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # configs/ import each other as the `configs` package
  sys.path.insert(0, _REPO)

from absl import app  # pylint: disable=wrong-import-position
from ml_collections import config_flags  # pylint: disable=wrong-import-position

DEFAULT_CONFIG = os.path.join(_REPO, 'configs', 'tiny.py')

_CONFIG = config_flags.DEFINE_config_file(
    'config', DEFAULT_CONFIG, 'Experiment config file (configs/*.py), optionally file.py:arg.',
    lock_config=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  from specjax.runner import config as config_lib  # pylint: disable=import-outside-toplevel
  try:
    spec = config_lib.run_spec(_CONFIG.value)
  except config_lib.ConfigError as e:
    print(f'specjax.run: {e}', file=sys.stderr)
    sys.exit(2)
  from specjax.runner import experiment  # pylint: disable=import-outside-toplevel
  try:
    experiment.run(spec)
  except (config_lib.ConfigError, FileNotFoundError) as e:
    print(f'specjax.run: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  app.run(main)
