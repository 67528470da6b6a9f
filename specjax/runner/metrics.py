"""The paper's cost model and honest timing helpers.

alpha: expected acceptance E[sum_x min(p(x), q(x))]; gamma: drafts per iteration; c: draft/target
cost ratio per decode step; c_hat: draft/target arithmetic ratio per token.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable

import jax


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
  """E[tokens per target call] = (1 - alpha^(gamma+1)) / (1 - alpha)  (Eq. 1)."""
  if alpha >= 1.0:
    return float(gamma + 1)
  return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def walltime_improvement(alpha: float, gamma: int, c: float) -> float:
  """Expected walltime improvement (Theorem 3.8): E[tokens per call] / (gamma * c + 1)."""
  return expected_tokens_per_call(alpha, gamma) / (gamma * c + 1.0)


def operations_factor(alpha: float, gamma: int, c_hat: float = 0.0) -> float:
  """Expected increase in arithmetic operations (Theorem 3.11)."""
  return (gamma * c_hat + gamma + 1.0) / expected_tokens_per_call(alpha, gamma)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
  """The integer gamma >= 1 maximising walltime improvement (Figure 3)."""
  return max(range(1, max_gamma + 1), key=lambda g: walltime_improvement(alpha, g, c))


@dataclasses.dataclass(frozen=True)
class Timing:
  """Compile (first call) time apart from the median of warm repeats, all in seconds."""
  compile_s: float
  median_s: float
  times_s: tuple[float, ...]


def block(x: Any) -> Any:
  return jax.block_until_ready(x)


def time_call(fn: Callable[[], Any], repeats: int = 5) -> Timing:
  """First call (compile + run) timed apart; then `repeats` warm calls, block_until_ready each."""
  start = time.perf_counter()
  block(fn())
  compile_s = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    block(fn())
    times.append(time.perf_counter() - start)
  return Timing(compile_s, statistics.median(times), tuple(times))


def time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int = 5) -> dict[str, Timing]:
  """Times several callables side by side: warm-up each, then A B A B ... so drift hits all alike."""
  compile_s = {}
  for name, fn in fns.items():
    start = time.perf_counter()
    block(fn())
    compile_s[name] = time.perf_counter() - start
  times: dict[str, list[float]] = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      block(fn())
      times[name].append(time.perf_counter() - start)
  return {name: Timing(compile_s[name], statistics.median(t), tuple(t))
          for name, t in times.items()}
