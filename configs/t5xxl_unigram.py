"""Paper Table 3 rows: alpha of a unigram draft for the T5-XXL target (EnDe and CNN/DM).

  python -m specjax.run --config=configs/t5xxl_unigram.py

The unigram model is fitted on the task's training split tokenised with the target's vocabulary
(--config.ngram_data=file.jsonl for a local file); its cost is ~0 (c = 0).
"""

from configs import common


def get_config(arg=None):
  a = common.parse_arg(arg, v11=False)
  c = common.base_config()
  c.name = 't5xxl_unigram'
  c.target = 'google/t5-v1_1-xxl' if a.v11 else 't5-11b'
  c.drafts = ('unigram',)
  c.tasks = ('ende', 'cnndm')
  c.gammas = (1, 2, 3)
  c.output_dir = 'results/t5xxl_unigram'
  return c
