"""The one error type for bad user input (configs, files, flags), shared by every entry point.

`python -m specjax.run` and `python -m specjax.finetune` print a `ConfigError` as one line and exit
with status 2; the message names the field (`config.gammas: ...`) or the file.
"""


class ConfigError(ValueError):
  """Bad configuration or input file; the message is one line naming the field or file."""
