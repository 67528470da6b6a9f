"""The chi-square goodness-of-fit test shared by the exactness tests."""

import numpy as np
import scipy.stats


def chi2_pvalue(counts, law):
  """p-value of observed `counts` against the probabilities `law` (same shape, any rank; normalised
  here). Cells with expected count < 5 are pooled into one; an observation in a zero-probability
  cell is an impossible outcome and gives p = 0."""
  counts = np.asarray(counts, np.float64).ravel()
  law = np.asarray(law, np.float64).ravel()
  if counts[law == 0].sum() > 0:
    return 0.0
  expected = counts.sum() * law / law.sum()
  small = expected < 5
  obs = np.append(counts[~small], counts[small].sum())
  exp = np.append(expected[~small], expected[small].sum())
  keep = exp > 0
  return float(scipy.stats.chisquare(obs[keep], exp[keep]).pvalue)
