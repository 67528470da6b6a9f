"""Defaults shared by every experiment config; each field documented once, here.

A config file is one runnable experiment: `get_config(arg)` returns a ConfigDict, any field can be
overridden on the command line (`--config.gammas=3,5 --config.num_examples=20`), and
`specjax.runner.config.run_spec` validates it before anything is loaded.
"""

import ml_collections


def parse_arg(arg, positional: str = '', **defaults):
  """Parses a config argument 'smoke' or 'key=value,flag' into a ConfigDict of named options; with
  `positional`, a bare word that is no option's name is that option's value ('xxl' = 'size=xxl')."""
  out = ml_collections.ConfigDict(defaults)
  for part in (arg or '').split(','):
    part = part.strip()
    if not part:
      continue
    key, _, value = part.partition('=')
    if positional and '=' not in part and key not in out:
      key, value = positional, part
    if key not in out:
      raise ValueError(f'config argument {key!r} unknown (known: {", ".join(out.keys())})')
    kind = type(out[key])
    out[key] = (value.lower() in ('1', 'true', 'yes', '')) if kind is bool else kind(value)
  return out


def base_config():
  c = ml_collections.ConfigDict()
  c.name = 'experiment'            # used in output paths and table titles
  c.target = ''                    # HF checkpoint directory or hub id of the target
  c.drafts = ()                    # checkpoints (dirs or hub ids) or 'unigram' / 'bigram' / 'prompt_lookup'
  c.tasks = ('ende',)              # 'ende' (WMT14 newstest2014), 'cnndm' (CNN/DM 3.0.0 test), 'bible_en_es'
  c.temperatures = (0.0, 1.0)      # 0 = greedy (exact argmax); >0 = sampling
  c.gammas = (1, 2, 3, 5, 7, 10)   # drafts per iteration; the paper's gamma is marked in the table
  c.top_k = 0                      # 0 = off
  c.top_p = 1.0                    # 1 = off
  c.num_examples = 100             # prompts per task (from the test split)
  c.max_source_len = 512           # source tokens kept (truncated beyond)
  c.max_new_tokens = 128           # decode length per prompt (stops earlier at EOS)
  c.batch_size = 1                 # 1 = the paper's setting
  c.repeats = 3                    # timed repeats per cell (median reported; compile excluded)
  c.dtype = 'bfloat16'             # parameter dtype; logits and acceptance are float32 regardless
  c.matmul_precision = ''          # '' = XLA's default; 'highest' with dtype float32 made greedy
                                   # output token-identical on a GPU too (docs/performance.md, 5)
  c.seed = 0
  c.output_dir = 'results/experiment'   # results.jsonl, table.csv, table.md, plots
  c.local_data = ''                # JSONL file with {"source", "reference"} fields instead of `datasets`
  c.ngram_data = ''                # text/JSONL to fit unigram/bigram drafts (default: task train split)
  c.ngram_examples = 10000         # training examples used to fit n-gram drafts
  c.mesh_shape = ()                # () = one device; (data, model) shards over devices
  c.compilation_cache = '~/.cache/specjax/xla'   # JAX persistent compilation cache ('' = off)
  c.plots = True                   # speedup vs gamma, alpha per draft, a trace picture (PNG)
  c.show_examples = 3              # outputs printed at the end
  return c


def t5xxl_config(arg, *, draft_size=None, ngram=None, smoke_gamma=5):
  """T5-XXL target sweeps (paper Tables 2 and 3); `arg` takes 'v11' and 'smoke'.

  Defaults to the original multitask checkpoints (t5-11b with t5-<size>), which run EnDe and CNN/DM
  without fine-tuning; 'v11' switches to google/t5-v1_1-* (fine-tune them with specjax.finetune for
  the paper's setting and pass the directories with --config.target / --config.drafts).
  """
  a = parse_arg(arg, v11=False, smoke=False)
  c = base_config()
  if ngram:
    c.name, c.drafts, c.gammas = f't5xxl_{ngram}', (ngram,), (1, 2, 3)
  else:
    c.name = f't5xxl_{draft_size}'
    c.drafts = (f'google/t5-v1_1-{draft_size}' if a.v11 else f't5-{draft_size}',)
  c.target = 'google/t5-v1_1-xxl' if a.v11 else 't5-11b'
  c.tasks = ('ende', 'cnndm')
  c.output_dir = f'results/{c.name}'
  if a.smoke:
    c.gammas = (smoke_gamma,)
    c.num_examples = 2
    c.max_new_tokens = 16
    c.repeats = 1
  return c
