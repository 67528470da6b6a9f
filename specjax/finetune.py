"""Entry point: `python -m specjax.finetune --config=configs/finetune/<run>.py[:arg]`.

Thin on purpose: flags in, specjax.training.finetune.main out (a notebook can call `train` directly).
"""

from __future__ import annotations

import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # configs/ import each other as the `configs` package
  sys.path.insert(0, _REPO)

from absl import app  # pylint: disable=wrong-import-position
from ml_collections import config_flags  # pylint: disable=wrong-import-position

_CONFIG = config_flags.DEFINE_config_file('config', None, 'configs/finetune/<run>.py[:arg]',
                                          lock_config=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  from specjax.training import finetune  # pylint: disable=import-outside-toplevel
  finetune.main(_CONFIG.value)


if __name__ == '__main__':
  app.run(main)
