"""`specjax.protocol` is specjax.decoding.protocol (the Draft protocol, Proposal, TreeProposal,
rollout), under the public name the README uses; `from specjax.protocol import Draft` and
`from specjax import protocol` give the same module."""

import sys

from specjax.decoding import protocol as _module

sys.modules[__name__] = _module
