"""Exactness of speculative sampling at the loop level, on real (tiny) T5 models.

Shapes: N rows, V vocab, G gamma, M = 3 generated tokens.

One batched speculative_decode call generates the first M = 3 tokens of N = 20,000 independent rows
(the same prompt repeated). Their empirical joint law over the V^3 cells is compared by chi-square
with the exact target law, enumerated from teacher-forced target logits on all V^2 prefixes and
processed with specjax.decoding.sampling.probs under the same Sampling (temperature, top-k, top-p). The
draft is an independent random T5, so q != p and rejections, residual draws and bonus tokens are
all frequent. The same helper is run with deliberately broken verification rules (bare functions
handed to the loop as acceptance.FunctionVerifier): each must be rejected with p < 1e-6, which
shows the test has the power to see those bugs.

gamma = 2 with M = 3: a fully accepted first block emits the bonus token as token 3, a rejection
emits a residual draw at token 1 or 2 and a second iteration (the draft's catch-up path) follows.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from chi2 import chi2_pvalue  # tests/chi2.py
from test_feature_head import reused_step_noise  # tests/test_feature_head.py
from specjax.decoding import acceptance
from specjax.decoding.loop import speculative_decode
from specjax.decoding.drafts import ModelDraft
from specjax.decoding.sampling import Sampling, probs, sample
from specjax.models.t5 import T5Config, T5Model, init_params

V, N, M, GAMMA = 12, 20_000, 3, 2
PROMPT = np.array([[5, 3, 9, 2, 0]], np.int32)  # one right-padded prompt, repeated N times
SEED = 2023
SETTINGS = {
    'temp1': Sampling(temperature=1.0),
    'temp0.7': Sampling(temperature=0.7),
    'top_k5': Sampling(temperature=1.0, top_k=5),
    'top_p0.8': Sampling(temperature=1.0, top_p=0.8),
}


def _model(seed, scale):
  # v1.1 layout (untied head): with init scale 1 the conditionals are spread over many tokens
  # (~1000 of the 1728 cells have expected count >= 5) yet depend on the prefix (a bonus token
  # drawn from the wrong position moves ~0.3 of the mass), and alpha(target, draft) ~ 0.6.
  config = T5Config(vocab_size=V, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_decoder_layers=1,
                    num_heads=2, relative_attention_num_buckets=8,
                    relative_attention_max_distance=8, gated=True, tie_word_embeddings=False,
                    scale_logits=False)
  return T5Model(init_params(config, jax.random.PRNGKey(seed), scale=scale), config)


@functools.lru_cache(maxsize=None)
def models():
  """(target, draft): the draft has independent weights, so q is far from p."""
  return _model(seed=0, scale=1.0), _model(seed=1, scale=1.0)


# ----------------------------------------------------------------------------- the exact law


def exact_law(sampling):
  """P(y1, y2, y3) [V, V, V] under the processed target distributions (float64)."""
  prefixes = np.array(list(itertools.product(range(V), repeat=2)), np.int32)  # [V^2, 2]
  dec_in = np.concatenate([np.zeros((V * V, 1), np.int32), prefixes], axis=1)  # [0, y1, y2]
  logits = models()[0].logits(np.repeat(PROMPT, V * V, axis=0), dec_in)  # [V^2, 3, V]
  p = np.asarray(probs(logits, sampling), np.float64).reshape(V, V, 3, V)
  p1 = p[0, 0, 0]  # position 0 only sees the start token
  p2 = p[:, 0, 1]  # [y1, y2]
  p3 = p[:, :, 2]  # [y1, y2, y3]
  law = p1[:, None, None] * p2[:, :, None] * p3
  return law / law.sum()


@functools.lru_cache(maxsize=None)
def generate(sampling, rule=None, draft_cls=None):
  """One batched call: N rows x M tokens -> (counts over V^3 cells, stats). `rule`: a broken
  verification function (acceptance.verify's signature) run in place of the token rule."""
  target, draft = models()
  if draft_cls is not None:
    draft = draft_cls(model=draft)
  out = speculative_decode(
      target, draft, np.repeat(PROMPT, N, axis=0), gamma=GAMMA, max_new_tokens=M,
      temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
      rng=jax.random.PRNGKey(SEED), eos_id=-1,
      verifier=acceptance.FunctionVerifier(rule) if rule else 'token')
  tokens = np.asarray(out.tokens)
  assert tokens.shape == (N, M) and (np.asarray(out.lengths) == M).all()  # eos -1 never ends
  codes = tokens @ np.array([V * V, V, 1])
  return np.bincount(codes, minlength=V ** 3), jax.device_get(out.stats)


def law_pvalue(name, sampling, rule=None, draft_cls=None):
  counts, stats = generate(sampling, rule, draft_cls)
  p = chi2_pvalue(counts, exact_law(sampling))
  print(f'{name}: chi-square p = {p:.3g}')  # shown with pytest -rP
  return p, stats


# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize('name', list(SETTINGS))
def test_first_three_tokens_follow_target_law(name):
  # Catches any deviation from the target's processed law: wrong residual, q that is not the
  # distribution the draft sampled from, top-k/top-p applied differently to p and q, a bonus
  # token from the wrong position, a stale draft cache changing q without changing the samples...
  p, stats = law_pvalue(name, SETTINGS[name])
  hist = np.asarray(stats.accepted_hist).sum(0)
  # The draft is wrong often and right often: every branch of the acceptance rule is exercised.
  assert hist.min() > 1000, hist
  assert p > 1e-3, (name, p, hist)


# ----------------------------------------------------------------------------- negative controls
# Module-level (hashable, stable) functions with acceptance.verify's signature:
# (key, draft_tokens_G, q_GxV, p_G1xV, n) -> (m accepted, next_token); n = proposed drafts.


def _proposed(draft_tokens_G, n):
  return jnp.int32(draft_tokens_G.shape[0]) if n is None else n


def verify_always_accept(key, draft_tokens_G, q_GxV, p_G1xV, n=None):
  """(a) Accepts every draft, then a bonus token from p_n: the output drifts towards q."""
  n = _proposed(draft_tokens_G, n)
  return n, sample(key, p_G1xV[n])


def verify_residual_is_p(key, draft_tokens_G, q_GxV, p_G1xV, n=None):
  """(b) Correct acceptance, but a rejected position resamples from p instead of the residual."""
  m, _ = acceptance.verify(key, draft_tokens_G, q_GxV, p_G1xV, n)
  return m, sample(jax.random.fold_in(key, 1), p_G1xV[m])


def verify_bonus_from_last_draft_row(key, draft_tokens_G, q_GxV, p_G1xV, n=None):
  """(c') After a full acceptance the bonus token is drawn from p_{n-1} (the last draft's row)."""
  n = _proposed(draft_tokens_G, n)
  m, nxt = acceptance.verify(key, draft_tokens_G, q_GxV, p_G1xV, n)
  wrong = sample(jax.random.fold_in(key, 2), p_G1xV[jnp.maximum(n - 1, 0)])
  return m, jnp.where(m == n, wrong, nxt)


# The "dropped bonus token" (when all G are accepted, return n = G-1, next = draft[G-1]) is NOT a
# control here: it emits the G accepted drafts, whose law is already exact (the bonus token is
# just one more exact sample), so the output law is unchanged and no law test can detect it. It
# only lowers tokens per target call; tests/test_alpha.py detects it through that. The control
# for the bonus token is instead (c') above, a bonus drawn from the wrong row (tests/test_acceptance
# calls it verify_bonus_dropped). A sampler that skips verification altogether (emits the G draft
# samples) is always_accept without its bonus token; every control is one more compile of the
# loop (~5 s on CPU), so that variant is not run separately.
CONTROLS = {
    'always_accept': verify_always_accept,
    'residual_is_p': verify_residual_is_p,
    'bonus_from_last_draft_row': verify_bonus_from_last_draft_row,
}


@pytest.mark.parametrize('name', list(CONTROLS))
def test_negative_controls_are_detected(name):
  # Power check: the same chi-square on the same setup must reject each known-wrong sampler.
  p, _ = law_pvalue(f'control:{name}', SETTINGS['temp1'], CONTROLS[name])
  assert p < 1e-6, (name, p)


@struct.dataclass
class ReusedNoiseDraft(ModelDraft):
  """(d) A ModelDraft of its own class, so that its program is its own and is traced while
  `reused_step_noise` is in force."""


def test_reused_draft_noise_is_detected():
  # Every draft step samples with step 0's noise: each draft token alone is still a draw from its
  # q, but the block's tokens are dependent, so q is not the law they were drawn from given the
  # earlier drafts.
  with reused_step_noise():
    p, _ = law_pvalue('control:reused_draft_noise', SETTINGS['temp1'],
                      draft_cls=ReusedNoiseDraft)
  assert p < 1e-6, p
