"""Output quality per task: BLEU (sacrebleu) for translation, ROUGE F1 (rouge-score) for
summarisation."""

from __future__ import annotations

import numpy as np

SUMMARISATION = ('cnndm',)


def quality(task: str, hyps: list[str], refs: list[str]) -> dict[str, float]:
  if task in SUMMARISATION:
    from rouge_score import rouge_scorer  # pylint: disable=import-outside-toplevel
    scorer = rouge_scorer.RougeScorer(['rouge1', 'rouge2', 'rougeL'], use_stemmer=True)
    scores = [scorer.score(r, h) for h, r in zip(hyps, refs)]
    return {k: 100 * float(np.mean([s[k].fmeasure for s in scores]))
            for k in ('rouge1', 'rouge2', 'rougeL')}
  import sacrebleu  # pylint: disable=import-outside-toplevel
  return {'bleu': float(sacrebleu.corpus_bleu(hyps, [refs]).score)}
