"""Paper Table 3 rows: alpha of a unigram draft for the T5-XXL target (EnDe and CNN/DM).

  python -m specjax.run --config=configs/t5xxl_unigram.py

The unigram model is fitted on the task's training split tokenised with the target's vocabulary
(--config.ngram_data=file.jsonl for a local file); its cost is ~0 (c = 0).
"""

from configs import common


def get_config(arg=None):
  return common.t5xxl_config(arg, ngram='unigram')
