"""Honest timing: compile time apart, block_until_ready, medians, candidates interleaved.

Below both decoding (gamma='auto' times its own iterations) and the runner (cells, c, block cost),
so every timing in specjax goes through these few functions.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable

import jax


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


def time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int = 5,
                     warmups: dict[str, Callable[[], Any]] | None = None) -> dict[str, Timing]:
  """Times several callables side by side: warm-up each, then A B A B ... so drift hits all alike.

  `warmups` (optional, per name) replace the warm-up call by a cheaper one that compiles the same
  programs (one batch of several of the same shape); its time is reported as compile time."""
  compile_s = {}
  for name, fn in fns.items():
    start = time.perf_counter()
    block((warmups or {}).get(name, fn)())
    compile_s[name] = time.perf_counter() - start
  times: dict[str, list[float]] = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      block(fn())
      times[name].append(time.perf_counter() - start)
  return {name: Timing(compile_s[name], statistics.median(t), tuple(t))
          for name, t in times.items()}
