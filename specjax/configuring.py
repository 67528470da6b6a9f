"""The config boundary: an ml_collections ConfigDict becomes a frozen dataclass here, and only here.

A spec is a frozen dataclass whose fields are declared with `option(default, doc)`: the field list,
the defaults and the one-line docs live in that one place; `config_dict(cls)` builds the default
ConfigDict from it (configs/ start from that), `help_lines(cls)` prints it (`--help`), and
`read(cls, cfg)` reads a ConfigDict (or dict) back into the dataclass, casting every value by the
field's annotation. Unknown or missing keys and unreadable values raise a one-line `ConfigError`
naming the key (`config.temperature: unknown config key; did you mean "temperatures"?`).

Annotations understood: str, int, float, bool, tuple[X, ...] of those, and nested spec dataclasses
(a sub-ConfigDict, named `config.group.key` in errors). A field without a default must be given.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any

from specjax.errors import ConfigError

_DOC = 'doc'


def option(default: Any = dataclasses.MISSING, doc: str = '') -> Any:
  """A dataclass field with its one-line doc (tuples and lists become immutable tuples)."""
  if isinstance(default, list):
    default = tuple(default)
  return dataclasses.field(default=default, metadata={_DOC: doc})


def doc_of(field: dataclasses.Field) -> str:
  return field.metadata.get(_DOC, '')


def did_you_mean(name: str, known) -> str:
  """'; did you mean "x"?' for the closest known name (ml_collections' rule), else ''."""
  matches = difflib.get_close_matches(name, list(known), 1, 0.75)
  return f'; did you mean "{matches[0]}"?' if matches else ''


def unknown_key(path: str, name: str, known) -> ConfigError:
  hint = did_you_mean(name, known) or f' (known: {", ".join(sorted(known))})'
  return ConfigError(f'config.{path}{name}: unknown config key{hint}')


# ----------------------------------------------------------------------------- casts


def to_int(value) -> int:
  if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
    raise ValueError(value)
  return int(value)


def to_bool(value) -> bool:
  if isinstance(value, str):
    if value.lower() not in ('true', 'false', '1', '0', 'yes', 'no'):
      raise ValueError(value)
    return value.lower() in ('true', '1', 'yes')
  if not isinstance(value, (bool, int)):
    raise ValueError(value)
  return bool(value)


def to_str(value) -> str:
  if value is None:
    return ''
  if not isinstance(value, str):
    raise ValueError(value)
  return value


_SCALARS = {str: to_str, int: to_int, float: float, bool: to_bool}


def to_tuple(value, cast) -> tuple:
  """'3,5' / [3, 5] / (3, 5) / ('a,b',) (a flag value ml_collections kept whole) / 3 -> a tuple,
  each element cast."""
  if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], str):
    value = value[0]
  if isinstance(value, str):
    value = [v for v in value.replace(' ', '').split(',') if v]
  elif not isinstance(value, (list, tuple)):
    value = [value]
  return tuple(cast(v) for v in value)


def _caster(hint):
  if hint in _SCALARS:
    return _SCALARS[hint], hint.__name__
  if typing.get_origin(hint) is tuple:
    inner = typing.get_args(hint)[0]
    return (lambda v: to_tuple(v, _SCALARS[inner])), f'a list of {inner.__name__}'
  raise TypeError(f'configuring: unsupported field type {hint!r}')


def _is_spec(hint) -> bool:
  return isinstance(hint, type) and dataclasses.is_dataclass(hint)


# ----------------------------------------------------------------------------- the boundary


def _as_dict(cfg) -> dict[str, Any]:
  if hasattr(cfg, 'to_dict'):
    return {k: cfg[k] for k in cfg.keys()}  # keeps sub-ConfigDicts as they are
  return dict(cfg)


def read(cls, cfg, *, path: str = '') -> Any:
  """ConfigDict / dict -> `cls` (a dataclass of options); every failure is a ConfigError naming
  `config.<path><key>`."""
  return cfg if isinstance(cfg, cls) else cls(**read_fields(cls, cfg, path=path))


def read_fields(cls, cfg, *, path: str = '', skip: tuple[str, ...] = ()) -> dict[str, Any]:
  """The field values of `cls` read from `cfg` as a dict; fields in `skip` are neither read nor
  required (the caller derives them, or reads them as a sub-config of its own)."""
  data = _as_dict(cfg)
  hints = typing.get_type_hints(cls)
  fields = [f for f in dataclasses.fields(cls) if f.name not in skip]
  names = [f.name for f in fields]
  for key in data:
    if key not in names and key not in skip:
      raise unknown_key(path, key, names)
  kw = {}
  for f in fields:
    if f.name not in data:
      if f.default is not dataclasses.MISSING:
        kw[f.name] = f.default
        continue
      raise ConfigError(f'config.{path}{f.name}: missing config key')
    value, hint = data[f.name], hints[f.name]
    if _is_spec(hint):
      kw[f.name] = read(hint, value, path=f'{path}{f.name}.')
      continue
    cast, want = _caster(hint)
    try:
      kw[f.name] = cast(value)
    except (TypeError, ValueError):
      raise ConfigError(f'config.{path}{f.name}: cannot read {value!r} as {want}') from None
  return kw


def config_dict(cls):
  """The ConfigDict of `cls`'s defaults (what configs/ start from and override)."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  c = ml_collections.ConfigDict()
  for f in dataclasses.fields(cls):
    if f.default is dataclasses.MISSING:
      raise TypeError(f'{cls.__name__}.{f.name} has no default')
    c[f.name] = f.default
  return c


def help_lines(cls) -> list[str]:
  """'  --config.<name>  <doc> [<default>]', one line per field, from the dataclass."""
  fields = dataclasses.fields(cls)
  pad = max(len(f.name) for f in fields) + len('--config.') + 2
  lines = []
  for f in fields:
    default = f.default
    shown = ','.join(str(x) for x in default) if isinstance(default, tuple) else repr(default)
    lines.append(f'  {"--config." + f.name:<{pad}}{doc_of(f)} [{shown}]')
  return lines


def require(ok: bool, field: str, want: str, value) -> None:
  """ConfigError 'config.<field>: must be <want>, got <value>' unless ok."""
  if not ok:
    raise ConfigError(f'config.{field}: must be {want}, got {value!r}')


# ----------------------------------------------------------------------------- command line

HELP_FLAGS = ('-h', '--help', '--helpshort', '--helpfull', '-?')


def _one_line(message: str) -> str:
  return ' '.join(str(message).split())


def _config_argument(argv, name: str, default: str | None) -> str | None:
  """The value of --<name>=... / --<name> VALUE (the last one wins), else `default`."""
  value = default
  for i, arg in enumerate(argv):
    if arg.startswith(f'--{name}='):
      value = arg.split('=', 1)[1]
    elif arg == f'--{name}' and i + 1 < len(argv):
      value = argv[i + 1]
  return value


def load_config_file(argument: str, name: str = 'config'):
  """'path.py[:arg]' -> the ConfigDict its get_config(arg) returns; ConfigError naming the flag."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  path, _, arg = argument.partition(':')
  if not os.path.isfile(path):
    raise ConfigError(f'--{name}: config file not found: {path}')
  module_spec = importlib.util.spec_from_file_location('_specjax_config', path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError(f'--{name}={argument}: cannot load {path} ({_one_line(e)})') from None
  if not hasattr(module, 'get_config'):
    raise ConfigError(f'--{name}={argument}: {path} has no get_config()')
  try:
    return module.get_config(arg) if arg else module.get_config()
  except (ValueError, TypeError, KeyError) as e:
    raise ConfigError(f'--{name}={argument}: {_one_line(e)}') from None


def check_overrides(argv, config, name: str = 'config'):
  """Every --<name>.a.b=value names a key of the loaded config (else a did-you-mean error)."""
  prefix = f'--{name}.'
  for arg in argv:
    if not arg.startswith(prefix):
      continue
    path = arg[len(prefix):].split('=', 1)[0]
    node, done = config, ''
    for part in path.split('.'):
      keys = list(node.keys()) if hasattr(node, 'keys') else []
      if part not in keys:
        raise unknown_key(done, part, keys)
      node, done = node[part], f'{done}{part}.'
    if '=' not in arg and not isinstance(node, bool):
      raise ConfigError(f'config.{path}: no value (write --{name}.{path}=VALUE)')


def run_cli(prog: str, main, help_text, *, default: str | None = None, name: str = 'config',
            flag_help: str = 'config file (configs/*.py), optionally file.py:arg'):
  """`python -m` entry: absl flags with a config-file flag `--<name>`, then `main(argv, config)`.

  --help prints `help_text()`. A missing or broken config file, a bad config argument, an unknown
  or unreadable override become ONE line '<prog>: <message>' on stderr and exit status 2, before
  anything is loaded (absl and ml_collections would print a traceback or the usage, exit 1). The
  flag is defined only after the checks: ml_collections reads the overrides when it is defined.
  """
  import sys  # pylint: disable=import-outside-toplevel
  from absl import app  # pylint: disable=import-outside-toplevel
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel

  def fail(message):
    print(f'{prog}: {message}', file=sys.stderr)
    sys.exit(2)

  def guarded(fn, *args, **kwargs):
    try:
      return fn(*args, **kwargs)
    except ConfigError as e:
      fail(e)
    except (flags.Error, AttributeError, KeyError, ValueError, TypeError, OSError) as e:
      fail(_one_line(e).replace('Flags parsing error: ', ''))

  argv = sys.argv
  if any(a in HELP_FLAGS for a in argv[1:]):
    print(help_text())
    sys.exit(0)
  argument = _config_argument(argv[1:], name, default)
  if argument is None:
    fail(f'--{name}: required (--{name}=configs/<file>.py[:arg])')
  guarded(lambda: check_overrides(argv[1:], load_config_file(argument, name), name))
  holder = guarded(config_flags.DEFINE_config_file, name, default, flag_help, lock_config=True)
  app.run(lambda rest: main(rest, holder.value), flags_parser=lambda a: guarded(flags.FLAGS, a))
