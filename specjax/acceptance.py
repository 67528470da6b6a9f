"""`specjax.acceptance` is specjax.decoding.acceptance (the exact verification rules and the
verifier registry), under the public name the README uses; `from specjax.acceptance import
verify` and `from specjax import acceptance` give the same module."""

import sys

from specjax.decoding import acceptance as _module

sys.modules[__name__] = _module
