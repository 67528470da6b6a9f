"""Entry point: `python -m specjax.finetune --config=configs/finetune/<run>.py[:arg]`.

Thin on purpose: flags in, specjax.training.finetune.main out (a notebook can call `train` directly).
A missing config file, a bad config argument or an unknown override is one line, exit status 2.
"""

from __future__ import annotations

import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # configs/ import each other as the `configs` package
  sys.path.insert(0, _REPO)


def help_text() -> str:
  return ('usage: python -m specjax.finetune --config=configs/finetune/<run>.py[:arg] '
          '[--config.<field>=VALUE ...]\n\nThe fields and their docs: configs/finetune/common.py.')


def main(argv, config):
  if len(argv) > 1:
    print(f'specjax.finetune: unexpected arguments: {" ".join(argv[1:])}', file=sys.stderr)
    sys.exit(2)
  from specjax.training import finetune  # pylint: disable=import-outside-toplevel
  finetune.main(config)


if __name__ == '__main__':
  from specjax import configuring  # pylint: disable=wrong-import-position
  configuring.run_cli('specjax.finetune', main, help_text, flag_help='configs/finetune/<run>.py[:arg]')
