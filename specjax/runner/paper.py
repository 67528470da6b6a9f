"""The paper's published numbers (arXiv:2211.17192 v2), shipped as data to print beside ours."""

from __future__ import annotations

# Table 2: T5-XXL target, batch 1, one TPU-v4. c from Table 4 (profiler traces).
TABLE2 = [
    # task, draft, temperature, gamma, alpha, speedup, c
    ('ende', 't5-small', 0, 7, 0.75, 3.4, 0.02),
    ('ende', 't5-base', 0, 7, 0.80, 2.8, 0.04),
    ('ende', 't5-large', 0, 7, 0.82, 1.7, 0.11),
    ('ende', 't5-small', 1, 7, 0.62, 2.6, 0.02),
    ('ende', 't5-base', 1, 5, 0.68, 2.4, 0.04),
    ('ende', 't5-large', 1, 3, 0.71, 1.4, 0.11),
    ('cnndm', 't5-small', 0, 5, 0.65, 3.1, 0.02),
    ('cnndm', 't5-base', 0, 5, 0.73, 3.0, 0.04),
    ('cnndm', 't5-large', 0, 3, 0.74, 2.2, 0.11),
    ('cnndm', 't5-small', 1, 5, 0.53, 2.3, 0.02),
    ('cnndm', 't5-base', 1, 3, 0.55, 2.2, 0.04),
    ('cnndm', 't5-large', 1, 3, 0.56, 1.7, 0.11),
]

# Table 3: alpha at temperature 0 / 1 for T5-XXL targets.
TABLE3 = {
    ('ende', 'unigram'): (0.08, 0.07), ('ende', 'bigram'): (0.20, 0.19),
    ('ende', 't5-small'): (0.75, 0.62), ('ende', 't5-base'): (0.80, 0.68),
    ('ende', 't5-large'): (0.82, 0.71),
    ('cnndm', 'unigram'): (0.13, 0.08), ('cnndm', 'bigram'): (0.23, 0.16),
    ('cnndm', 't5-small'): (0.65, 0.53), ('cnndm', 't5-base'): (0.73, 0.55),
    ('cnndm', 't5-large'): (0.74, 0.56),
}

# Table 1 (c = 0): alpha, gamma -> (operations factor, walltime improvement).
TABLE1 = [
    (0.6, 2, 1.53, 1.96), (0.7, 3, 1.58, 2.53), (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69), (0.9, 2, 1.11, 2.71), (0.9, 10, 1.60, 6.86),
]


def table2_row(task: str, draft: str, temperature: float):
  """The paper's Table 2 row for (task, draft, temperature), or None."""
  for row in TABLE2:
    if row[0] == task and row[1] == draft and float(row[2]) == float(temperature):
      return dict(zip(('task', 'draft', 'temperature', 'gamma', 'alpha', 'speedup', 'c'), row))
  return None


def table3_alpha(task: str, draft: str, temperature: float):
  pair = TABLE3.get((task, draft))
  if pair is None or float(temperature) not in (0.0, 1.0):
    return None
  return pair[0] if float(temperature) == 0.0 else pair[1]
