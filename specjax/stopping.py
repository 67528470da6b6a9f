"""Stop rules for adaptive draft length: `specjax.speculative_decode(..., gamma=G_MAX, stop=RULE)`.

Exact rules (the output law is the target's): Fixed, Confidence, Entropy, AlphaTracked.
UnsafeDropLowConfidence is biased on purpose (see its docstring). Definitions and the exactness
rule: specjax.decoding.stopping.
"""

from specjax.decoding.stopping import (AlphaTracked, Confidence, Entropy, Fixed, StopRule,
                                       UnsafeDropLowConfidence, entropy, optimal_gammas, parse,
                                       spec)

__all__ = ['AlphaTracked', 'Confidence', 'Entropy', 'Fixed', 'StopRule',
           'UnsafeDropLowConfidence', 'entropy', 'optimal_gammas', 'parse', 'spec']
