"""Machine load around a timing: load averages, cores, and the CPU that other processes took.

A ratio of two interleaved timings does not cancel other processes' load: on a loaded 2-core CPU
torch's OpenMP threads lose far more than XLA's thread pool, so a loaded run flatters specjax
(by ~2X against transformers' assisted generation; experiments/bench_load.py shows the drift).
Every benchmark therefore records the load around its timings and, by default, refuses to report
a comparison measured on a loaded machine. Two measures, both recorded:

  * load average (1, 5, 15 min; `os.getloadavg`) and the cores, at the start and at the end. The
    1-minute figure at the start says whether the machine was busy just before; at the end it
    includes the benchmark's own threads (~1-2 on 2 cores), so it is recorded, not gated on.
  * others' CPU: the machine's busy CPU time (/proc/stat) minus this process's own (threads and
    waited-for children, `os.times`) over the run, in cores, plus the time the hypervisor stole
    from this VM. That is exactly what competed with the timings. Linux only (None elsewhere; the
    gate then uses the load average alone).

The gate (`assess`) marks a record `loaded` when the 1-minute load average at the start exceeds
`Limits.load_per_core` x cores, or others' CPU during the run exceeds `Limits.others_per_core` x
cores; `refused` = loaded and not explicitly allowed. The default limits come from the measured
drift (docs/performance.md, "Machine load").
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any, Callable

# Limits chosen by measurement (experiments/bench_load.py; docs/performance.md, "Machine load").
LOAD_PER_CORE = 0.5
OTHERS_PER_CORE = 0.1


class LoadedMachine(SystemExit):
  """Raised (exit status 3) when a benchmark refuses to report figures measured under load."""

  def __init__(self, message: str):
    super().__init__(3)
    self.message = message

  def __str__(self):
    return self.message


@dataclasses.dataclass(frozen=True)
class Snapshot:
  """What the machine had done up to one instant (every CPU time in seconds, all cores summed)."""
  wall_s: float  # time.monotonic()
  loadavg: tuple[float, float, float]  # 1, 5, 15 minutes
  cores: int
  busy_s: float | None  # machine's non-idle CPU time since boot (None: no /proc/stat)
  steal_s: float | None  # time the hypervisor ran other guests on this VM's CPUs
  own_s: float  # this process (all threads) + its waited-for children, user + system
  time: str = ''  # local wall-clock time, for the record


@dataclasses.dataclass(frozen=True)
class Limits:
  """A run is loaded above either limit (both are fractions of the machine's cores)."""
  load_per_core: float = LOAD_PER_CORE  # 1-minute load average at the start
  others_per_core: float = OTHERS_PER_CORE  # other processes' (+ stolen) CPU during the run


def _proc_stat(path: str = '/proc/stat') -> tuple[float, float] | None:
  """(busy, steal) CPU seconds of the whole machine, or None where /proc/stat does not exist."""
  try:
    with open(path, encoding='ascii') as f:
      fields = f.readline().split()
  except OSError:
    return None
  if not fields or fields[0] != 'cpu':
    return None
  ticks = [int(x) for x in fields[1:]] + [0] * 8
  user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
  hz = os.sysconf('SC_CLK_TCK') if hasattr(os, 'sysconf') else 100
  # guest time is already inside user; idle and iowait are idle.
  return (user + nice + system + irq + softirq) / hz, steal / hz


def _loadavg() -> tuple[float, float, float]:
  try:
    return tuple(float(x) for x in os.getloadavg())
  except (OSError, AttributeError):
    return (float('nan'),) * 3


def snapshot() -> Snapshot:
  stat = _proc_stat()
  t = os.times()
  return Snapshot(wall_s=time.monotonic(), loadavg=_loadavg(), cores=os.cpu_count() or 1,
                  busy_s=None if stat is None else stat[0],
                  steal_s=None if stat is None else stat[1],
                  own_s=t.user + t.system + t.children_user + t.children_system,
                  time=time.strftime('%Y-%m-%dT%H:%M:%S'))


def others_cores(start: Snapshot, end: Snapshot) -> float | None:
  """Mean cores used by other processes (and stolen by the hypervisor) between two snapshots."""
  if start.busy_s is None or end.busy_s is None:
    return None
  wall = end.wall_s - start.wall_s
  if wall <= 0:
    return 0.0
  others = (end.busy_s - start.busy_s) - (end.own_s - start.own_s)
  stolen = (end.steal_s or 0.0) - (start.steal_s or 0.0)
  return max(0.0, others + stolen) / wall


def assess(start: Snapshot, end: Snapshot | None = None, limits: Limits = Limits(),
           allow_loaded: bool = False) -> dict[str, Any]:
  """The JSON record of a run's load and the gate's verdict (end None: the start check only)."""
  cores = start.cores
  reasons = []
  if start.loadavg[0] > limits.load_per_core * cores:
    reasons.append(f'1-min load average {start.loadavg[0]:.2f} at the start > '
                   f'{limits.load_per_core * cores:.2f} ({limits.load_per_core:g} x {cores} cores)')
  rec: dict[str, Any] = {
      'cores': cores,
      'load_average_start': list(start.loadavg), 'time_start': start.time,
      'limits': dataclasses.asdict(limits),
  }
  if end is not None:
    others = others_cores(start, end)
    rec.update(load_average_end=list(end.loadavg), time_end=end.time,
               wall_s=end.wall_s - start.wall_s, own_cores=(end.own_s - start.own_s) /
               max(end.wall_s - start.wall_s, 1e-9), others_cores=others)
    if others is not None and others > limits.others_per_core * cores:
      reasons.append(f'other processes used {others:.2f} cores during the run > '
                     f'{limits.others_per_core * cores:.2f} ({limits.others_per_core:g} x '
                     f'{cores} cores)')
  rec.update(loaded=bool(reasons), reasons=reasons, allowed=bool(allow_loaded),
             refused=bool(reasons) and not allow_loaded)
  return rec


def describe(rec: dict[str, Any]) -> str:
  """One line for beside a table: the loads, and LOADED when the gate says so."""
  la = lambda xs: '/'.join(f'{x:.2f}' for x in xs)  # noqa: E731
  parts = [f"load average (1/5/15 min) {la(rec['load_average_start'])} at the start"]
  if 'load_average_end' in rec:
    parts.append(f"{la(rec['load_average_end'])} at the end")
  text = ', '.join(parts) + f" on {rec['cores']} cores"
  if rec.get('others_cores') is not None:
    text += (f"; other processes used {rec['others_cores']:.2f} cores over "
             f"{rec['wall_s']:.0f} s")
  if not rec['loaded']:
    return f'load: {text} (quiet)'
  verdict = ('LOADED, kept by --allow-loaded: not comparable with quiet figures'
             if rec['allowed'] else 'LOADED: refused, not a reportable figure')
  return f"load: {text}. {verdict} ({'; '.join(rec['reasons'])})"


class Gate:
  """The load gate of one benchmark run: a start snapshot, checks, and the final record."""

  def __init__(self, limits: Limits = Limits(), allow_loaded: bool = False,
               take: Callable[[], Snapshot] | None = None):
    self.limits, self.allow_loaded = limits, allow_loaded
    self._take = take or (lambda: snapshot())  # pylint: disable=unnecessary-lambda  # patchable
    self.start = self._take()

  def wait_quiet(self, seconds: float, poll_s: float = 10.0, log=print) -> None:
    """Waits up to `seconds` for the 1-minute load average to fall under the limit."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
      rec = assess(self.start, limits=self.limits)
      if not rec['loaded']:
        return
      log(f"waiting for a quiet machine: {'; '.join(rec['reasons'])}")
      time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
      self.start = self._take()

  def check_start(self) -> dict[str, Any]:
    """Raises LoadedMachine before any work when the machine is already loaded (unless allowed)."""
    rec = assess(self.start, limits=self.limits, allow_loaded=self.allow_loaded)
    if rec['refused']:
      # SystemExit prints nothing for an int code: say why before exiting 3.
      print(_refusal(rec), file=sys.stderr)
      raise LoadedMachine(_refusal(rec))
    return rec

  def record(self, since: Snapshot | None = None) -> dict[str, Any]:
    """The load record from `since` (default: the start) to now."""
    return assess(since or self.start, self._take(), self.limits, self.allow_loaded)

  def mark(self) -> Snapshot:
    return self._take()


def _refusal(rec: dict[str, Any]) -> str:
  return ('refusing to report timings from a loaded machine: ' + '; '.join(rec['reasons']) +
          '. Rerun when the machine is quiet (--wait_quiet=SECONDS waits for it), or pass '
          '--allow-loaded to keep the figures marked as loaded.')


def finish(rec: dict[str, Any], log=print) -> None:
  """Prints the final load line; raises LoadedMachine if the run's figures are refused."""
  log(describe(rec))
  if rec['refused']:
    print(_refusal(rec), file=sys.stderr)
    raise LoadedMachine(_refusal(rec))
