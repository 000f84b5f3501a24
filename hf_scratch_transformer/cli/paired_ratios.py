"""How sure a side-by-side timing is. The machines we time on drift by up to 30% within a run, so each run of one
side is divided by the other side's run beside it (the pair shares the drift), and the median of those paired ratios
gets a bootstrap interval: where the interval holds 1.0, the two sides are tied within this run's noise."""

import random
import statistics

CONFIDENCE = 0.95


def median_interval(ratios: list[float], draws: int = 1000, seed: int = 0) -> tuple[float, float]:
    """The central CONFIDENCE interval of the median of `ratios` over bootstrap resamples (seeded: a report prints
    the same interval for the same samples)."""
    if not ratios:
        raise ValueError("median_interval needs at least one paired ratio")
    generator = random.Random(seed)
    medians = sorted(statistics.median(generator.choices(ratios, k=len(ratios))) for _ in range(draws))
    tail = (1 - CONFIDENCE) / 2
    return medians[int(tail * draws)], medians[int((1 - tail) * draws) - 1]


def verdict(interval: tuple[float, float]) -> str:
    """Where an interval of ours / native (throughput, or a time ratio native / ours) lies against 1.0: "faster",
    "slower" or "tied"."""
    low, high = interval
    if low > 1.0:
        return "faster"
    if high < 1.0:
        return "slower"
    return "tied"
