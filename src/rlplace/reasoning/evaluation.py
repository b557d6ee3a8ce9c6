"""Held-out evaluation: which samples answer each problem, and the metrics their scores give.

Greedy by default (`rollout.eval_samples=1`, `rollout.eval_temperature=0`): one answer per problem, `eval/accuracy`
its mean score. Reasoning benchmarks are usually sampled instead (verl's `val_kwargs`): k answers per problem at a
temperature, `eval/accuracy` the mean over all of them (mean@k) and `eval/best@k` the mean over problems of their best
answer (pass@k for 0/1 scores). Records with a `data_source` field (verl's files) also get `eval/accuracy/<source>`,
so a held-out file mixing benchmarks reports each.

Sample j of held-out problem i is keyed by id `EVAL_SAMPLE_IDS + i * k + j`, above every training sample's, so an
evaluation draws the same noise whichever rank answers it, and every evaluation of a run draws the same (differences
between steps are the policy's, not the noise's).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

EVAL_SAMPLE_IDS = 1 << 62
"""The first sample id of held-out answers; training ids (`rollout._sample_groups`) stay far below it."""


class Answered(NamedTuple):
    """One held-out problem's scores, one per sample."""

    index: int
    """Its place in the task's `eval_set()`."""
    data_source: str | None
    scores: list[float]


def sample_ids(index: int, samples: int) -> list[int]:
    """The ids of held-out problem `index`'s samples."""
    return [EVAL_SAMPLE_IDS + index * samples + j for j in range(samples)]


def eval_metrics(answered: Sequence[Answered]) -> dict[str, float]:
    """`eval/accuracy` (mean score over every sample), `eval/best@k` when k > 1, and `eval/accuracy/<source>` per
    data source when the records name theirs."""
    answered = sorted(answered, key=lambda a: a.index)
    metrics = {"eval/accuracy": statistics.fmean(s for a in answered for s in a.scores)}
    samples = len(answered[0].scores)
    if samples > 1:
        metrics[f"eval/best@{samples}"] = statistics.fmean(max(a.scores) for a in answered)
    by_source: dict[str, list[float]] = defaultdict(list)
    for a in answered:
        if a.data_source is not None:
            by_source[a.data_source].extend(a.scores)
    for source, scores in sorted(by_source.items()):
        metrics[f"eval/accuracy/{source}"] = statistics.fmean(scores)
    return metrics
