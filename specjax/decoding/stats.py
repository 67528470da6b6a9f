"""What a speculative call reports: on-device statistics and the decode output.

Shape legend: B rows (requests under slot refill), W the proposal width (gamma, or a tree's depth
D), W1 = W + 1, I iterations recorded.

alpha is the paper's (specjax.decoding.theory): the mean of beta = sum_x min(p, q) over verified
positions whose prefix was accepted, for chains and trees alike. The empirical acceptance is
another number: accepted / proposed drafts for a chain, accepted / levels tried for a tree
(`TreeStats.level_acceptance`), and it is called acceptance_rate in both.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


def per_target_call(count_B, target_calls_B) -> float:
  """sum(count) / sum(target calls): a per-row counter averaged over the batch's target calls."""
  return float(np.sum(count_B) / max(int(np.sum(target_calls_B)), 1))


@struct.dataclass
class Verdict:
  """What one block step decided, per row (engine.block_step).

  n_B:        [B] int32    proposed depth: n drafts of a chain, D for a tree
  m_B:        [B] int32    accepted drafts (the accepted path's length), m <= n
  next_B:     [B] int32    the token drawn from the target at index m (corrected or bonus)
  beta_BxW:   [B, W] f32   sum_x min(p, q) at each depth of the proposal along the accepted path
  tokens_BxW: [B, W] int32 the proposal's tokens along that path (a chain's drafts)
  path_BxW1:  [B, W1]      block index of the accepted node per depth (None for a chain: 0 .. W)
  verified_B: [B] int32    tokens the target verified (n for a chain, M nodes for a tree)
  node_path_BxW1: [B, W1]  the accepted path in the draft's node numbering where it differs from
                           the block's (a dynamic tree's template), else None
  """
  n_B: jax.Array
  m_B: jax.Array
  next_B: jax.Array
  beta_BxW: jax.Array
  tokens_BxW: jax.Array
  path_BxW1: Any
  verified_B: jax.Array
  node_path_BxW1: Any = None


@struct.dataclass
class SpecStats:
  """On-device statistics of one speculative_decode call.

  iterations:      []       outer loop iterations (= target calls for the batch)
  draft_passes:    []       draft forward passes actually made (data-dependent under stop rules;
                            0 for model-free drafts); `draft_calls` is the same number
  target_calls:    [B]      iterations in which the row was still generating
  proposed_hist:   [B, W1]  how often the row proposed n = 0 .. W drafts in one iteration
  accepted_hist:   [B, W1]  how often m = 0 .. W drafts were accepted in one iteration
  proposed:        [B]      proposed (= verified) draft tokens
  accepted:        [B]      accepted draft tokens
  emitted:         [B]      tokens produced by verification (m + 1 per iteration, before any
                            truncation at EOS or max_new_tokens)
  alpha_sum:       [B]      sum over verified positions whose prefix was accepted of
                            sum_x min(p(x), q(x)) (the paper's beta, Cor. 3.6)
  alpha_count:     [B]      number of such positions
  nan:             []       a NaN appeared in the target's or draft's logits
  bad_draft:       []       a draft proposed a token id outside [0, V) (a broken draft)
  """
  iterations: jax.Array
  draft_passes: jax.Array
  target_calls: jax.Array
  proposed_hist: jax.Array
  accepted_hist: jax.Array
  proposed: jax.Array
  accepted: jax.Array
  emitted: jax.Array
  alpha_sum: jax.Array
  alpha_count: jax.Array
  nan: jax.Array
  bad_draft: jax.Array

  @classmethod
  def zeros(cls, batch: int, gamma: int, **extra) -> SpecStats:
    zeros_B, hist_BxW1 = jnp.zeros((batch,), jnp.int32), jnp.zeros((batch, gamma + 1), jnp.int32)
    return cls(iterations=jnp.int32(0), draft_passes=jnp.int32(0), target_calls=zeros_B,
               proposed_hist=hist_BxW1, accepted_hist=hist_BxW1, proposed=zeros_B,
               accepted=zeros_B, emitted=zeros_B, alpha_sum=jnp.zeros((batch,), jnp.float32),
               alpha_count=zeros_B, nan=jnp.bool_(False), bad_draft=jnp.bool_(False), **extra)

  def record(self, active_B, verdict: Verdict, passes, nan, bad_draft) -> SpecStats:
    """The statistics after one iteration: rows active_B proposed n and accepted m drafts."""
    act_B = active_B.astype(jnp.int32)
    n_B, m_B = verdict.n_B, verdict.m_B
    idx_W1 = jnp.arange(self.gamma + 1)
    beta_BxW = jnp.pad(verdict.beta_BxW.astype(jnp.float32),
                       ((0, 0), (0, self.gamma - verdict.beta_BxW.shape[1])))
    # beta counts at the verified positions whose prefix was accepted: i <= m and i < n.
    on_prefix_BxW = (idx_W1[None, :-1] <= m_B[:, None]) & (idx_W1[None, :-1] < n_B[:, None])
    return self.replace(
        iterations=self.iterations + 1,
        draft_passes=self.draft_passes + passes,
        target_calls=self.target_calls + act_B,
        proposed_hist=self.proposed_hist + act_B[:, None] * (idx_W1[None, :] == n_B[:, None]),
        accepted_hist=self.accepted_hist + act_B[:, None] * (idx_W1[None, :] == m_B[:, None]),
        proposed=self.proposed + act_B * n_B,
        accepted=self.accepted + act_B * m_B,
        emitted=self.emitted + act_B * (m_B + 1),
        alpha_sum=self.alpha_sum + jnp.where(active_B, jnp.sum(
            jnp.where(on_prefix_BxW, beta_BxW, 0.0), axis=1), 0.0),
        alpha_count=self.alpha_count + act_B * jnp.sum(on_prefix_BxW, axis=1),
        nan=self.nan | nan, bad_draft=self.bad_draft | bad_draft)

  @property
  def gamma(self) -> int:
    return self.accepted_hist.shape[-1] - 1

  @property
  def draft_calls(self):
    """Draft forward passes (the former name of draft_passes)."""
    return self.draft_passes

  @property
  def alpha(self) -> float:
    """The paper's alpha = E[sum_x min(p, q)], estimated on the target's own prefixes."""
    return float(np.sum(self.alpha_sum) / max(int(np.sum(self.alpha_count)), 1))

  @property
  def acceptance_rate(self) -> float:
    """Accepted drafts / proposed drafts (the empirical per-token acceptance)."""
    return float(np.sum(self.accepted) / max(int(np.sum(self.proposed)), 1))

  @property
  def tokens_per_target_call(self) -> float:
    return per_target_call(self.emitted, self.target_calls)

  @property
  def proposed_per_target_call(self) -> float:
    return per_target_call(self.proposed, self.target_calls)

  def summary(self) -> dict[str, Any]:
    return {
        'iterations': int(self.iterations),
        'draft_calls': int(self.draft_passes),
        'draft_passes': int(self.draft_passes),
        'target_calls': int(np.sum(self.target_calls)),
        'proposed_hist': np.asarray(self.proposed_hist).sum(0).tolist(),
        'accepted_hist': np.asarray(self.accepted_hist).sum(0).tolist(),
        'alpha': self.alpha,
        'acceptance_rate': self.acceptance_rate,
        'proposed_per_target_call': self.proposed_per_target_call,
        'tokens_per_target_call': self.tokens_per_target_call,
    }


@struct.dataclass
class TreeStats(SpecStats):
  """SpecStats of tree decoding (n = D per iteration), plus:

  verified:  [B]  tree nodes the target verified (M per call)
  levels:    [B]  depths at which candidates were tried (m + 1, or D for a full path)
  """
  verified: jax.Array
  levels: jax.Array

  @classmethod
  def zeros(cls, batch: int, gamma: int, **extra) -> TreeStats:
    z_B = jnp.zeros((batch,), jnp.int32)
    return super().zeros(batch, gamma, verified=z_B, levels=z_B, **extra)

  def record(self, active_B, verdict: Verdict, passes, nan, bad_draft) -> TreeStats:
    act_B = active_B.astype(jnp.int32)
    out = super().record(active_B, verdict, passes, nan, bad_draft)
    return out.replace(verified=self.verified + act_B * verdict.verified_B,
                       levels=self.levels + act_B * jnp.minimum(verdict.m_B + 1, self.gamma))

  @property
  def level_acceptance(self) -> float:
    """Per-level acceptance: accepted levels / levels tried (a chain's accepted / proposed; with
    more candidates per node it grows, which is the point of the tree)."""
    return float(np.sum(self.accepted) / max(int(np.sum(self.levels)), 1))

  @property
  def nodes_per_target_call(self) -> float:
    """Nodes verified per target call (a chain's proposed tokens per call)."""
    return per_target_call(self.verified, self.target_calls)

  # The empirical acceptance of a tree is its per-level acceptance; what it proposes, its nodes.
  acceptance_rate = level_acceptance
  proposed_per_target_call = nodes_per_target_call

  @property
  def mean_accepted(self) -> float:
    """Mean accepted path length per target call."""
    return per_target_call(self.accepted, self.target_calls)

  def summary(self) -> dict[str, Any]:
    out = super().summary()
    out.update(accepted=int(np.sum(self.accepted)), emitted=int(np.sum(self.emitted)),
               verified=int(np.sum(self.verified)),
               nodes_per_target_call=self.nodes_per_target_call, mean_accepted=self.mean_accepted,
               level_acceptance=self.level_acceptance)
    return out


@struct.dataclass
class RefillStats(SpecStats):
  """SpecStats with per-REQUEST rows ([Q] / [Q, G1]; iterations, draft_passes, nan, bad_draft are
  of the whole call), plus:

  slots:          []   int32  B, the rows that lived in the loop
  row_iterations: []   int32  row-iterations paid: trips x the loop's width at each trip (the width
                              halves in the tail, after the queue is empty)
  gamma_hist:     [G1] int32  iterations run at each gamma (gamma='auto'; a fixed gamma: one bin)
  gamma_trace:    [I]  int32  gamma of iteration i for the first I iterations, -1 after the last
  """
  slots: jax.Array
  row_iterations: jax.Array
  gamma_hist: jax.Array
  gamma_trace: jax.Array

  @property
  def row_utilisation(self) -> float:
    """Row-iterations that advanced a request / all row-iterations paid."""
    return float(np.sum(self.target_calls) / max(int(self.row_iterations), 1))

  def summary(self) -> dict[str, Any]:
    out = super().summary()
    out.update(slots=int(self.slots), row_utilisation=self.row_utilisation,
               row_iterations=int(self.row_iterations),
               gamma_hist=np.asarray(self.gamma_hist).tolist())
    return out


@struct.dataclass
class DecodeOutput:
  """tokens [B, max_new_tokens] (pad after each row's end), lengths [B] (EOS counted), stats.

  With trace=True, `trace_drafts` [B, I, G] holds each iteration's drafted tokens (0 past the
  proposal), `trace_proposed` [B, I] how many were proposed and `trace_accepted` [B, I] how many
  were accepted (both -1 once the row had finished); the committed tokens give the corrected /
  bonus token of each iteration. `trace_beta` [B, I, G] holds beta_k = sum_x min(p_k, q_k) of
  each proposed draft (the probability it is accepted given the drafts before it were; 0 past the
  proposal), and under an acceptance_predictor.Recorder rule `trace_features` [B, I, G, F] each
  draft's stopping.FEATURES (zeros otherwise): the log a learned stop rule is fitted on.
  """
  tokens: jax.Array
  lengths: jax.Array
  stats: Any = None
  trace_drafts: Any = None
  trace_accepted: Any = None
  trace_proposed: Any = None
  trace_beta: Any = None
  trace_features: Any = None

  def to_host(self) -> DecodeOutput:
    """tokens and lengths as numpy arrays, which tokenizers' batch_decode accepts (a JAX array
    it does not); kept on device when sharded over several hosts (not addressable here)."""
    host = lambda x: np.asarray(x) if getattr(x, 'is_fully_addressable', True) else x  # noqa: E731
    return self.replace(tokens=host(self.tokens), lengths=host(self.lengths))
