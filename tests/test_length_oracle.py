"""experiments/length_oracle.logged_betas: the oracle's betas per logged iteration.

Two sources: a T5 draft's q recomputed by a teacher-forced pass, or (any draft, e.g. the feature
head, whose q depends on features it predicted along its own rollout) the loop's own trace_beta.
On a T5 draft both are available: they must agree position by position, at T = 1 and T = 0; the
control shifts the traced betas by one position and must disagree.
"""

import os
import sys

import jax
import numpy as np
import pytest

import test_feature_head as fh  # the tiny V = 12 target
from specjax.decoding.model_draft import as_draft
from specjax.models.t5 import T5Model

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'experiments'))
import length_oracle  # noqa: E402  pylint: disable=wrong-import-position


def _models():
  """The tiny target and a draft near it (its params perturbed): agreeing often, not always."""
  target = fh.models()[0]
  leaves, tree = jax.tree.flatten(target.params)
  keys = jax.random.split(jax.random.PRNGKey(5), len(leaves))
  noisy = [x + 0.5 * x.std() * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return target, T5Model(jax.tree.unflatten(tree, noisy), target.config)


@pytest.mark.parametrize('temperature', [1.0, 0.0])
def test_traced_betas_are_the_recomputed_ones(temperature):
  target, draft = _models()
  prompts = np.asarray(jax.random.randint(jax.random.PRNGKey(3), (8, 5), 1, fh.V), np.int32)
  kw = dict(batch=4, temperature=temperature, gamma=3, max_new_tokens=8)
  beta_model, acc_model = length_oracle.logged_betas(target, draft, prompts, **kw)
  beta_trace, acc_trace = length_oracle.logged_betas(target, as_draft(draft), prompts, **kw)
  assert not isinstance(as_draft(draft), T5Model)  # the trace path was taken
  np.testing.assert_array_equal(acc_trace, acc_model)
  assert beta_trace.shape == beta_model.shape and len(acc_model) > 8
  np.testing.assert_allclose(beta_trace, beta_model, atol=1e-5)
  assert 0.05 < beta_model.mean() < 0.95  # neither all-accept nor all-reject
  # Control: betas one position off are seen.
  assert np.abs(beta_trace[:, 1:] - beta_model[:, :-1]).max() > 1e-2
