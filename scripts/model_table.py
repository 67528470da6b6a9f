"""Prints the README's model table: parameters, bf16 bytes and KV-cache bytes per token.

Computed from specjax.models.presets by shape evaluation (nothing is materialised or downloaded):
  python scripts/model_table.py
"""

from specjax.models import presets
from specjax.models.t5 import kv_cache_bytes_per_token, param_count


def _gib(n: float) -> str:
  return f'{n / 2**30:.2f} GiB' if n >= 2**30 else f'{n / 2**20:.0f} MiB'


def table() -> str:
  rows = ['| checkpoint | family | params | bf16 bytes | self-attn KV cache / token (bf16) |',
          '|---|---|---|---|---|']
  for name, cfg in presets.PRESETS.items():
    n = param_count(cfg)
    family = 'v1.1 (gated-GELU, untied)' if cfg.gated else 'original (ReLU, tied)'
    kv = kv_cache_bytes_per_token(cfg, 2)
    rows.append(f'| {name} | {family} | {n / 1e6:,.0f}M | {_gib(2 * n)} | {kv / 1024:.0f} KiB |')
  return '\n'.join(rows)


if __name__ == '__main__':
  print(table())
