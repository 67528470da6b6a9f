"""The chain loop: speculative decoding with a chain of up to gamma drafts per row, one program.

Shape legend: B batch, S source, N decoder-sequence buffer, G gamma (the block width; G_MAX under
a stop rule), G1 = G + 1, V vocab, I iterations recorded in a trace.

Each iteration is engine.block_step with the form `engine.Chain.for_rule(gamma, stop)`: the draft
proposes n_B[b] <= G tokens (a stop rule may end a row early), the target scores [seq[L], d_1 ..
d_G] at offset L in ONE call (under a rule that may stop early, only as many of them as the longest
proposal needs, one of stopping.block_widths), row b commits m + 1 tokens (m <= n accepted drafts
and one corrected or bonus token drawn at index m). What this loop adds: keys fold_in(rng,
iteration) per row, and an optional trace of every iteration's drafts.

Public pieces: speculative_init / speculative_step (one iteration, usable from a Python loop or a
custom jit) and speculative_program (the jitted whole loop, unchecked: e.g. `.lower(...)` on
abstract shapes for compile-only checks). speculative_decode (specjax.decoding.loop) validates
and dispatches here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decoding import acceptance, engine, protocol
from specjax.decoding import sampling as sampling_lib
from specjax.decoding import stopping
from specjax.decoding.model_draft import as_draft
from specjax.decoding.stats import DecodeOutput, Verdict
from specjax.models.t5 import T5Model
from specjax.programs import typed_jit


@struct.dataclass
class SpecState(engine.LoopState):
  """Loop state of speculative decoding (engine.LoopState's fields, seq N = max_new + gamma + 2,
  caches max_new + gamma + 1 positions), plus

  trace_drafts / trace_accepted / trace_proposed / trace_beta / trace_features: see DecodeOutput
                  (iteration axis of length 0 when not traced)
  """
  trace_drafts: jax.Array
  trace_accepted: jax.Array
  trace_proposed: jax.Array
  trace_beta: jax.Array
  trace_features: jax.Array

  def record_trace(self, it, active_B, verdict: Verdict, features_BxGxF=None) -> SpecState:
    """Writes iteration `it`'s drafts, counts, betas and (from an
    acceptance_predictor.Recorder rule) the drafts' stop features into the trace (a no-op when
    not traced)."""
    if not self.trace_drafts.shape[1]:
      return self
    it = jnp.minimum(it, self.trace_drafts.shape[1] - 1)
    drafts_BxG = protocol.pad_after(verdict.tokens_BxW, verdict.n_B)
    proposed_BxG = jnp.arange(drafts_BxG.shape[1])[None, :] < verdict.n_B[:, None]
    beta_BxG = jnp.where(proposed_BxG & active_B[:, None], verdict.beta_BxW, 0.0)
    new = self.replace(
        trace_drafts=self.trace_drafts.at[:, it].set(jnp.where(active_B[:, None], drafts_BxG, 0)),
        trace_accepted=self.trace_accepted.at[:, it].set(jnp.where(active_B, verdict.m_B, -1)),
        trace_proposed=self.trace_proposed.at[:, it].set(jnp.where(active_B, verdict.n_B, -1)),
        trace_beta=self.trace_beta.at[:, it].set(beta_BxG))
    if features_BxGxF is None:
      return new
    return new.replace(trace_features=new.trace_features.at[:, it].set(
        jnp.where(active_B[:, None, None], features_BxGxF, 0.0)))


def speculative_init(target: T5Model, draft, input_ids_BxS, rng, *, gamma: int,
                     max_new_tokens: int, trace: bool = False) -> SpecState:
  """Runs both encoders once and builds the loop state (usable from a Python loop too)."""
  b = input_ids_BxS.shape[0]
  n_trace = max_new_tokens if trace else 0  # one slot per possible iteration
  return engine.init_state(
      target, as_draft(draft), input_ids_BxS, rng, form=engine.Chain(gamma),
      max_new_tokens=max_new_tokens, cls=SpecState,
      trace_drafts=jnp.zeros((b, n_trace, gamma), jnp.int32),
      trace_accepted=jnp.full((b, n_trace), -1, jnp.int32),
      trace_proposed=jnp.full((b, n_trace), -1, jnp.int32),
      trace_beta=jnp.zeros((b, n_trace, gamma), jnp.float32),
      trace_features=jnp.zeros((b, n_trace, gamma, len(stopping.FEATURES)), jnp.float32))


def speculative_step(target: T5Model, draft, state: SpecState, *, gamma: int,
                     max_new_tokens: int, sampling: sampling_lib.Sampling, eos_id: int,
                     stop: stopping.StopRule | None = None, verifier='token') -> SpecState:
  """One iteration of Algorithm 1 for every unfinished row: draft, score, verify, commit.

  `stop` (default stopping.Fixed()) sets how many of the gamma slots each row proposes;
  `verifier` is a name of acceptance.VERIFIERS or an acceptance.Verifier.
  """
  new, verdict, rule_state = engine.block_step(
      target, as_draft(draft), engine.Chain.for_rule(gamma, stop), state, state.keys(),
      sampling=sampling, verifier=acceptance.verifier_for(verifier), stop=stop or stopping.Fixed(),
      eos_id=eos_id, max_new_tokens=max_new_tokens, with_rule_state=True)
  recorded = (rule_state[1] if getattr(stop, 'records_features', False)
              and rule_state is not None else None)
  return new.record_trace(state.stats.iterations, ~state.done, verdict, recorded)


@typed_jit(static_argnames=('gamma', 'max_new_tokens', 'sampling', 'eos_id',
                            'trace', 'stop', 'verifier'))
def speculative_program(target, draft, input_ids_BxS, rng, *, gamma, max_new_tokens, sampling,
                        eos_id, trace=False, stop=None, verifier='token'):
  """The whole speculative loop as one jitted program (static: gamma .. verifier; `sampling` from
  make_sampling, `stop` a StopRule or None, `verifier` a name or a Verifier). No input checks
  (speculative_decode does them): the handle for compile-only checks,
  `speculative_program.lower(...)`."""
  state = speculative_init(target, draft, input_ids_BxS, rng, gamma=gamma,
                           max_new_tokens=max_new_tokens, trace=trace)
  step = functools.partial(speculative_step, target, draft, gamma=gamma,
                           max_new_tokens=max_new_tokens, sampling=sampling, eos_id=eos_id,
                           stop=stop, verifier=verifier)
  state = engine.run_loop(state, step)
  return DecodeOutput(
      tokens=engine.finish_tokens(state.seq, state.lengths, max_new_tokens,
                                  target.config.pad_token_id),
      lengths=state.lengths, stats=state.stats,
      trace_drafts=state.trace_drafts if trace else None,
      trace_accepted=state.trace_accepted if trace else None,
      trace_proposed=state.trace_proposed if trace else None,
      trace_beta=state.trace_beta if trace else None,
      trace_features=state.trace_features if trace else None)


def run(target, draft, input_ids, opts, rng) -> DecodeOutput:
  """The chain loop for validated options (loop.speculative_decode dispatches here)."""
  draft = as_draft(draft)
  out = speculative_program(target, draft, jnp.asarray(input_ids, jnp.int32), engine.as_key(rng),
                            gamma=opts.gamma, max_new_tokens=opts.max_new_tokens,
                            sampling=opts.sampling, eos_id=opts.eos_for(target), trace=opts.trace,
                            stop=opts.stop, verifier=opts.verifier)
  return engine.checked(out, 'speculative_decode', draft, target.config.vocab_size)
