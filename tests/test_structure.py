"""The package's structure, drawn from its imports: no circles, no arrow pointing up, small
modules and functions in decoding/, and public module paths that import.

Every `import` / `from ... import` of a specjax module, at module level or inside a function, is
an arrow from the importing module to the imported one (a package's own __init__ counts only for
what it imports itself). Layers, bottom to top: models < decoding < runner / training < the
entry points; the shims specjax.acceptance / .protocol / .stopping and specjax/__init__ sit on top.
"""

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / 'specjax'


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


MODULES = {module_name(p): p for p in PKG.rglob('*.py')}


def targets(node, importer: str) -> set[str]:
  """The specjax modules one import statement names."""
  if isinstance(node, ast.Import):
    names = [a.name for a in node.names]
  else:
    base = node.module or ''
    if node.level:  # relative import
      pkg = importer.split('.')[:-node.level + (1 if MODULES[importer].name == '__init__.py' else 0)]
      base = '.'.join(pkg + ([base] if base else []))
    names = [f'{base}.{a.name}' if f'{base}.{a.name}' in MODULES else base for a in node.names]
  return {n for n in names if n in MODULES}


def graph() -> dict[str, set[str]]:
  edges = {}
  for name, path in MODULES.items():
    tree = ast.parse(path.read_text())
    edges[name] = set()
    for node in ast.walk(tree):
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        edges[name] |= targets(node, name) - {name}
  return edges


def cycles(edges) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in edges[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  return out


LAYERS = [  # (module prefix, layer); the longest matching prefix wins
    ('specjax.errors', 0), ('specjax.timing', 0), ('specjax.ops', 0), ('specjax.programs', 0),
    ('specjax.models', 1),
    ('specjax.decoding', 2),
    ('specjax.testing', 3), ('specjax.configuring', 3), ('specjax.data', 3),
    ('specjax.runner', 4), ('specjax.training', 4), ('specjax.run', 5), ('specjax.finetune', 5),
    ('specjax.acceptance', 5), ('specjax.protocol', 5), ('specjax.stopping', 5), ('specjax', 6),
]


def layer(name: str) -> int:
  best = max((p for p, _ in LAYERS if name == p or name.startswith(p + '.')), key=len)
  return dict(LAYERS)[best]


def test_no_import_cycles():
  found = cycles(graph())
  assert not found, f'import cycles: {found}'


def test_a_cycle_is_seen():
  # Control: the same check on a graph with one arrow added back (engine -> loop) finds a cycle.
  edges = graph()
  edges['specjax.decoding.engine'] = edges['specjax.decoding.engine'] | {'specjax.decoding.loop'}
  assert any('specjax.decoding.engine' in c for c in cycles(edges))


def test_no_arrow_points_up():
  up = [(a, b) for a, bs in graph().items() for b in bs if layer(b) > layer(a)]
  assert not up, f'imports pointing up a layer: {up}'
  assert layer('specjax.decoding.refill') < layer('specjax.runner.metrics')  # the old arrow up


def test_decoding_modules_and_functions_are_small():
  for name, path in MODULES.items():
    if not name.startswith('specjax.decoding'):
      continue
    source = path.read_text()
    assert len(source.splitlines()) <= 450, (name, len(source.splitlines()))
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        assert node.end_lineno - node.lineno + 1 <= 60, (name, node.name)


@pytest.mark.parametrize('name', ['acceptance', 'protocol', 'stopping'])
def test_public_module_paths_import(name):
  # What `from specjax import X` exposes, `from specjax.X import ...` imports too.
  import specjax  # pylint: disable=import-outside-toplevel
  via_attribute = getattr(specjax, name)
  via_path = importlib.import_module(f'specjax.{name}')
  assert via_path is via_attribute
  for public in getattr(via_attribute, '__all__', []):
    assert getattr(via_path, public) is getattr(via_attribute, public)


def test_every_exported_module_has_a_path():
  import specjax  # pylint: disable=import-outside-toplevel
  modules = [n for n, m in specjax._EXPORTS.items() if m == f'specjax.{n}']  # pylint: disable=protected-access
  assert sorted(modules) == ['acceptance', 'protocol', 'stopping']
  for n in modules:
    assert f'specjax.{n}' in MODULES
