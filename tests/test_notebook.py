"""The Colab notebook runs headless on CPU with the shipped tiny pair (its TPU part switched off)."""

import glob
import os
import pathlib
import tempfile

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_colab_notebook_executes(tmp_path, monkeypatch):
  nb = nbformat.read(ROOT / 'notebooks' / 'specjax_colab.ipynb', as_version=4)
  monkeypatch.setenv('SPECJAX_NOTEBOOK_CI', '1')
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  monkeypatch.setenv('PYTHONPATH', str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', ''))
  leftovers = lambda: set(glob.glob(os.path.join(tempfile.gettempdir(), 'specjax_*')))
  before = leftovers()
  client = NotebookClient(nb, timeout=900, kernel_name='python3',
                          resources={'metadata': {'path': str(tmp_path)}})
  client.execute()  # and shuts the kernel down
  assert leftovers() <= before, 'the notebook left its results folder behind'
  text = '\n'.join(o.get('text', '') for c in nb.cells if c.cell_type == 'code'
                   for o in c.get('outputs', []) if o.get('output_type') == 'stream')
  assert 'tok/call' in text  # the results table was printed
  images = [o for c in nb.cells if c.cell_type == 'code' for o in c.get('outputs', [])
            if 'image/png' in o.get('data', {})]
  assert len(images) >= 2  # speedup vs gamma and the trace picture
  assert 'part 2 skipped' in text
