"""Reproduces the paper's Table 1 and Figure 3 from the formulas (no models involved).

  python experiments/theory.py [--out_dir=results/theory]

Table 1: operations factor and walltime improvement at c = 0 for the paper's (alpha, gamma) pairs.
Figure 3: the optimal gamma as a function of alpha for c in {0.01, 0.02, 0.05, 0.1}.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from specjax.runner import metrics
from specjax.runner import paper

FIG3_C = (0.01, 0.02, 0.05, 0.1)


def table1_rows():
  rows = []
  for alpha, gamma, ops_paper, speed_paper in paper.TABLE1:
    rows.append({'alpha': alpha, 'gamma': gamma,
                 'operations': metrics.operations_factor(alpha, gamma, 0.0),
                 'speed': metrics.walltime_improvement(alpha, gamma, 0.0),
                 'paper_operations': ops_paper, 'paper_speed': speed_paper})
  return rows


def figure3_curves(alphas=np.linspace(0.05, 0.95, 91), cs=FIG3_C):
  return {c: [metrics.optimal_gamma(float(a), c) for a in alphas] for c in cs}, alphas


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out_dir', default='results/theory')
  args = parser.parse_args()
  print('Table 1 (c = 0)')
  print('| alpha | gamma | operations | paper | speed | paper |')
  print('|---|---|---|---|---|---|')
  for r in table1_rows():
    print(f"| {r['alpha']} | {r['gamma']} | {r['operations']:.2f}X | {r['paper_operations']:.2f}X "
          f"| {r['speed']:.2f}X | {r['paper_speed']:.2f}X |")
  curves, alphas = figure3_curves()
  print('\nFigure 3: optimal gamma')
  grid = [0.5, 0.6, 0.7, 0.8, 0.9]
  print('| c | ' + ' | '.join(f'alpha={a}' for a in grid) + ' |')
  print('|---|' + '---|' * len(grid))
  for c in FIG3_C:
    print(f'| {c} | ' + ' | '.join(str(metrics.optimal_gamma(a, c)) for a in grid) + ' |')
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  os.makedirs(args.out_dir, exist_ok=True)
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for c, gammas in curves.items():
    ax.step(alphas, gammas, where='mid', label=f'c = {c}')
  ax.set_xlabel('alpha')
  ax.set_ylabel('optimal gamma')
  ax.set_yscale('log')
  ax.legend()
  ax.set_title('Optimal gamma (paper Figure 3)')
  path = os.path.join(args.out_dir, 'figure3_optimal_gamma.png')
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print(f'\nwrote {path}')


if __name__ == '__main__':
  main()
