"""`specjax.stopping` is specjax.decoding.stopping: stop rules for adaptive drafting,
`specjax.speculative_decode(..., gamma=G_MAX, stop=RULE)`.

Exact rules (the output law is the target's): Fixed, Confidence, Entropy, AlphaTracked, Budget.
UnsafeDropLowConfidence is biased on purpose (see its docstring). A new rule is one class with
`@specjax.stopping.register('name')`. `from specjax.stopping import Confidence` and
`from specjax import stopping` give the same module.
"""

import sys

from specjax.decoding import stopping as _module

sys.modules[__name__] = _module
