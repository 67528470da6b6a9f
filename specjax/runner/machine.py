"""The machine a figure was measured on: what it is (`host_record`) and how loaded it was (`Gate`).

`host_record()` describes the host for every published record (docs/results/): CPU model, cores,
caches, ISA flags, memory, a measured memory bandwidth (`mem_bw_gbs`, an XLA matrix-vector product
streaming an array several times the L3), the accelerator, package versions, XLA_FLAGS, the git
commit and the date, and `host_id(rec)`, the short stable name of the hardware that keys its
records. No hostname and no path of the machine is recorded. `bandwidth_floor_ms` turns the
measured bandwidth into the time a step that streams N bytes cannot beat.

Load around a timing: load averages, cores, and the CPU that other processes took.

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
drift (docs/performance.md, "Method").
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any, Callable

# Limits chosen by measurement (experiments/bench_load.py; docs/performance.md, "Method").
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
           allow_loaded: bool = False, start_load: bool = True) -> dict[str, Any]:
  """The JSON record of a run's load and the gate's verdict (end None: the start check only).

  `start_load=False` for a span that begins mid-run: the load average then counts the run's own
  work, so only the other processes' CPU time speaks for the span."""
  cores = start.cores
  reasons = []
  if start_load and start.loadavg[0] > limits.load_per_core * cores:
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
    """The load record from `since` (default: the start) to now. A `since` after the start is
    judged by the other processes' CPU time only (the load average then holds this run's own)."""
    since = since or self.start
    return assess(since, self._take(), self.limits, self.allow_loaded,
                  start_load=since is self.start)

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


# ----------------------------------------------------------------------------- the host record

# Packages whose versions change timings (reported when installed; read from their metadata, so
# nothing is imported for it).
VERSIONED = ('jax', 'jaxlib', 'flax', 'numpy', 'transformers', 'torch', 'ctranslate2', 'optax')
# CPU flags that decide which kernels XLA and oneDNN pick.
ISA_FLAGS = ('avx2', 'fma', 'avx512f', 'avx512_vnni', 'avx512_bf16', 'amx_tile', 'amx_bf16')
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(path: str) -> str:
  try:
    with open(path, encoding='utf-8') as f:
      return f.read()
  except OSError:
    return ''


def _cpuinfo(key: str) -> str:
  for line in _read('/proc/cpuinfo').splitlines():
    if line.startswith(key):
      return line.split(':', 1)[1].strip()
  return ''


def _size_bytes(text: str) -> int | None:
  """'32768K' / '1M' / '48 KiB' -> bytes."""
  text = text.strip().upper().replace('IB', '').replace(' ', '')
  scale = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}
  try:
    return int(text[:-1]) * scale[text[-1]] if text[-1:] in scale else int(text)
  except ValueError:
    return None


def cache_sizes(cpu: int = 0) -> dict[str, int | None]:
  """{'l2_bytes', 'l3_bytes'} of the caches CPU `cpu` uses (sysfs; None where unknown)."""
  out = {'l2_bytes': None, 'l3_bytes': None}
  root = f'/sys/devices/system/cpu/cpu{cpu}/cache'
  for index in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    level = _read(f'{root}/{index}/level').strip()
    kind = _read(f'{root}/{index}/type').strip()
    if level in ('2', '3') and kind in ('Unified', 'Data'):
      out[f'l{level}_bytes'] = _size_bytes(_read(f'{root}/{index}/size'))
  return out


def _git(*args: str) -> str | None:
  import subprocess  # pylint: disable=import-outside-toplevel
  try:
    done = subprocess.run(['git', '-C', REPO, *args], capture_output=True, text=True, timeout=10,
                          check=True)
  except (OSError, subprocess.SubprocessError):
    return None
  return done.stdout.strip()


def git_state() -> dict[str, Any]:
  """{'commit', 'dirty'}: the checkout's commit, and whether tracked code differs from it
  (docs/ excluded: records and rendered pages change while figures are being produced)."""
  commit = _git('rev-parse', '--short=12', 'HEAD')
  status = _git('status', '--porcelain', '--untracked-files=no', '--', '.', ':(exclude)docs')
  return {'commit': commit, 'dirty': None if status is None else bool(status)}


def versions() -> dict[str, str]:
  """python and every installed package of VERSIONED, from package metadata (nothing imported)."""
  import importlib.metadata as md  # pylint: disable=import-outside-toplevel
  import platform  # pylint: disable=import-outside-toplevel
  out = {'python': platform.python_version()}
  for name in VERSIONED:
    try:
      out[name] = md.version(name)
    except md.PackageNotFoundError:
      pass
  return out


def bandwidth_probe(array_bytes: int, *, passes: int = 4, repeats: int = 3) -> float:
  """Memory bandwidth in GB/s that XLA reaches streaming `array_bytes` of float32 weights: a
  matrix-vector product (a decode step's access pattern, on every thread XLA's dot uses) inside
  one compiled loop of `passes` products, best of `repeats`. A different vector each pass keeps
  XLA from hoisting the product out of the loop."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  cols = 1024
  rows = max(array_bytes // (4 * cols), 1)
  w_RxC = jnp.ones((rows, cols), jnp.float32)

  @jax.jit
  def stream(w_RxC):
    def body(i, acc):
      v_C = jnp.full((cols,), (i + 1).astype(jnp.float32))
      return acc + jnp.sum(w_RxC @ v_C)
    return jax.lax.fori_loop(0, passes, body, jnp.float32(0))

  stream(w_RxC).block_until_ready()  # compile
  best = float('inf')
  for _ in range(repeats):
    t0 = time.perf_counter()
    stream(w_RxC).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  del w_RxC
  return passes * rows * cols * 4 / best / 1e9


def _probe_bytes(l3_bytes: int | None, accelerator: bool) -> int:
  """6x the L3 (32 MiB assumed where unknown), within 96-512 MiB; 1 GiB on an accelerator."""
  if accelerator:
    return 1 << 30
  return min(max(6 * (l3_bytes or 32 << 20), 96 << 20), 512 << 20)


def host_record(*, probe_bandwidth: bool = True) -> dict[str, Any]:
  """What the figures of a record were measured on (JSON-ready; nothing cached across calls).

  Keys: cpu_model, cores (os.cpu_count), cores_usable (the affinity set), l2_bytes, l3_bytes,
  isa (the ISA_FLAGS the CPU has), mem_bytes, mem_bw_gbs (bandwidth_probe; None when not probed),
  probe_bytes, platform (JAX backend), device_kind, device_count, accelerator (the device kind
  on a GPU/TPU, else None), versions, xla_flags, os, commit, dirty, load_average, created (UTC
  ISO 8601), host_id. The probe takes about a second on a 2-core CPU.
  """
  import platform  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  flags = set(_cpuinfo('flags').split())
  mem_kb = next((int(line.split()[1]) for line in _read('/proc/meminfo').splitlines()
                 if line.startswith('MemTotal:')), None)
  try:
    usable = len(os.sched_getaffinity(0))
  except AttributeError:
    usable = os.cpu_count()
  backend = jax.default_backend()
  devices = jax.devices()
  rec: dict[str, Any] = {
      'cpu_model': _cpuinfo('model name') or platform.processor() or platform.machine(),
      'cores': os.cpu_count(), 'cores_usable': usable, **cache_sizes(),
      'isa': [f for f in ISA_FLAGS if f in flags],
      'mem_bytes': None if mem_kb is None else mem_kb * 1024,
      'platform': backend, 'device_kind': devices[0].device_kind, 'device_count': len(devices),
      'accelerator': None if backend == 'cpu' else devices[0].device_kind,
      'versions': versions(), 'xla_flags': os.environ.get('XLA_FLAGS', ''),
      'os': f'{platform.system()} {platform.release()}', **git_state(),
      'load_average': list(_loadavg()),
      'created': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
  }
  rec['probe_bytes'] = _probe_bytes(rec['l3_bytes'], rec['accelerator'] is not None)
  rec['mem_bw_gbs'] = bandwidth_probe(rec['probe_bytes']) if probe_bandwidth else None
  rec['host_id'] = host_id(rec)
  return rec


def host_id(rec: dict[str, Any]) -> str:
  """A short stable name of the hardware: 'amd-epyc-2c-1f3a9c' (the accelerator's name instead of
  the CPU's on a GPU/TPU). Records are kept per host id, so a new host adds records."""
  import hashlib  # pylint: disable=import-outside-toplevel
  import re  # pylint: disable=import-outside-toplevel
  key = [rec.get('cpu_model'), rec.get('cores_usable') or rec.get('cores'), rec.get('l3_bytes'),
         rec.get('accelerator'), rec.get('device_count') if rec.get('accelerator') else None]
  digest = hashlib.sha256(repr(key).encode()).hexdigest()[:6]
  name = rec.get('accelerator') or rec.get('cpu_model') or 'cpu'
  name = re.sub(r'\((r|tm)\)|\bprocessor\b|\bcpu\b|@.*$', '', name, flags=re.I)
  slug = '-'.join(re.findall(r'[a-z0-9]+', name.lower())[:4]) or 'host'
  cores = rec.get('cores_usable') or rec.get('cores')
  return f'{slug}-{cores}c-{digest}'


def describe_host(rec: dict[str, Any]) -> str:
  """One line: 'AMD EPYC, 2 cores, L3 32 MiB, avx512_bf16, 24 GiB, 31 GB/s; jax 0.10.2 (cpu)'."""
  parts = [rec.get('cpu_model') or '?', f"{rec.get('cores_usable') or rec.get('cores')} cores"]
  if rec.get('l3_bytes'):
    parts.append(f"L3 {rec['l3_bytes'] / (1 << 20):.0f} MiB")
  isa = [f for f in ('avx512_bf16', 'amx_tile') if f in rec.get('isa', [])]
  isa = isa or [f for f in ('avx512f', 'avx2') if f in rec.get('isa', [])][:1]
  parts += isa
  if rec.get('mem_bytes'):
    parts.append(f"{rec['mem_bytes'] / (1 << 30):.0f} GiB")
  if rec.get('mem_bw_gbs'):
    parts.append(f"{rec['mem_bw_gbs']:.0f} GB/s")
  if rec.get('accelerator'):
    parts.insert(0, f"{rec['device_count']} x {rec['accelerator']}")
  jax_v = (rec.get('versions') or {}).get('jax', '?')
  return ', '.join(parts) + f"; jax {jax_v} ({rec.get('platform', '?')})"


def bandwidth_floor_ms(bytes_per_step: float, rec: dict[str, Any]) -> float | None:
  """The time (ms) a step that must stream `bytes_per_step` cannot beat at the host's measured
  bandwidth (rec: a host_record); None when the bandwidth was not probed."""
  bw = rec.get('mem_bw_gbs')
  return None if not bw else bytes_per_step / (bw * 1e9) * 1e3
