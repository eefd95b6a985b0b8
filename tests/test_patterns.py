"""Outlier-pattern detection (adahop.patterns) on tensors with planted structure.

Accuracy measured with the default detector (threshold 4, dominance 2, cross-normalised) on
(256, 128) tensors, 4 seeds per case (and on (512, 256), 10 seeds, when the defaults were chosen):
none 100%, row 100%, col 100%, mixed 100%, borderline (factor 2.5 / 6) 100%. Planting 4 rows or
columns at factor f, the detection rate over 20 seeds is 0% for f <= 3, 10% at 3.5 (2/20 rows,
0/20 columns), 90-95% at f = 4 (the threshold) and 100% from 4.5 up: the transition is as sharp
as the threshold. The tests below assert those floors.
"""

import itertools

import pytest
import torch

from adahop.patterns import PatternDetector, opposite, planted_outliers


pytestmark = pytest.mark.usefixtures("one_thread")

SHAPE = (256, 128)
SEEDS = range(4)


def _cases():
    m, k = SHAPE
    for s in SEEDS:
        gen = torch.Generator().manual_seed(s)
        yield "none", "gaussian", planted_outliers(m, k, seed=s), "none"
        yield "none", "student_t4", planted_outliers(m, k, base="student_t", df=4, seed=s), "none"
        yield "none", "student_t2.5", planted_outliers(m, k, base="student_t", df=2.5, seed=s), "none"
        channel_scales = torch.exp(0.3 * torch.randn(k, generator=gen))  # natural per-channel spread
        yield "none", "lognormal_channels", planted_outliers(m, k, seed=s) * channel_scales, "none"
        for n, f in itertools.product((1, 8, 32), (10, 30, 100)):
            yield "row", f"n{n}_f{f}", planted_outliers(m, k, n_rows=n, row_factor=f, seed=s), "row"
            yield "col", f"n{n}_f{f}", planted_outliers(m, k, n_cols=n, col_factor=f, seed=s), "col"
        yield "mixed", "row30_col5", planted_outliers(m, k, n_rows=4, row_factor=30, n_cols=4, col_factor=5, seed=s), "row"
        yield "mixed", "col30_row5", planted_outliers(m, k, n_rows=4, row_factor=5, n_cols=4, col_factor=30, seed=s), "col"
        # Both axes equally strong: no orientation to exploit, labelled none by design.
        yield "mixed", "row20_col20", planted_outliers(m, k, n_rows=4, row_factor=20, n_cols=4, col_factor=20, seed=s), "none"
        for f, expected in ((2.5, "none"), (6.0, None)):
            yield "borderline", f"row_f{f}", planted_outliers(m, k, n_rows=4, row_factor=f, seed=s), expected or "row"
            yield "borderline", f"col_f{f}", planted_outliers(m, k, n_cols=4, col_factor=f, seed=s), expected or "col"


@pytest.fixture(scope="module")
def accuracy():
    det = PatternDetector()
    hits: dict[str, list[bool]] = {}
    misses = []
    for category, name, x, expected in _cases():
        got = det(x)
        hits.setdefault(category, []).append(got == expected)
        if got != expected:
            misses.append((category, name, got, expected))
    return {c: sum(v) / len(v) for c, v in hits.items()}, misses


@pytest.mark.parametrize("category", ["none", "row", "col", "mixed", "borderline"])
def test_accuracy_on_planted_tensors(accuracy, category):
    rates, misses = accuracy
    assert rates[category] == 1.0, [m for m in misses if m[0] == category]


@pytest.mark.parametrize("axis", ["row", "col"])
def test_detection_switches_on_at_the_threshold(axis):
    det = PatternDetector()
    kw = "n_rows" if axis == "row" else "n_cols"
    fk = "row_factor" if axis == "row" else "col_factor"

    def rate(f):
        return sum(det(planted_outliers(*SHAPE, **{kw: 4, fk: f}, seed=s)) == axis for s in range(10)) / 10

    assert rate(3.0) == 0.0
    assert rate(4.5) == 1.0


def reference_scores(x: torch.Tensor) -> tuple[float, float]:
    """The statistic as the module docstring defines it, written out in fp32."""
    xf = x.float()
    col_med, row_med = xf.abs().median(dim=0).values, xf.abs().median(dim=1).values
    col_med = torch.where(col_med > 0, col_med, torch.ones_like(col_med))
    row_med = torch.where(row_med > 0, row_med, torch.ones_like(row_med))
    row_rms, col_rms = (xf / col_med).square().mean(dim=1).sqrt(), (xf / row_med[:, None]).square().mean(dim=0).sqrt()
    def ratio(v):
        peak, mid = v.max().item(), v.median().item()
        return 1.0 if peak == 0 else peak / mid if mid > 0 else float("inf")

    return ratio(row_rms), ratio(col_rms)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(96, 64), (64, 97), (256, 33)])
def test_scores_are_the_statistic_exactly_in_every_dtype(dtype, shape):
    """Medians taken in the operand's own dtype, over contiguous lines: the same numbers as fp32."""
    detector = PatternDetector()
    for seed, kw in enumerate([{}, {"n_rows": 3, "row_factor": 30}, {"n_cols": 2, "col_factor": 50}]):
        x = planted_outliers(*shape, seed=seed, **kw).to(dtype)
        x[0, : shape[1] // 2 + 1] = 0  # a line whose median is 0, and ties
        assert detector.scores(x) == reference_scores(x)


def test_transpose_swaps_the_label():
    x = planted_outliers(*SHAPE, n_cols=4, col_factor=20, seed=1)
    det = PatternDetector()
    assert det(x) == "col"
    assert det(x.t()) == opposite("col") == "row"


def test_cross_normalisation_keeps_one_outlier_channel_out_of_the_row_score():
    # The case the docstring gives: one 100x channel in 512 Gaussian tokens.
    x = planted_outliers(512, 256, n_cols=1, col_factor=100, seed=0)
    plain_row, _ = PatternDetector(cross_normalize=False).scores(x)
    cross_row, cross_col = PatternDetector().scores(x)
    assert plain_row > 4.0  # would cross the threshold on its own
    assert cross_row < 1.3
    assert cross_col > 50


def test_thresholds_are_configurable():
    x = planted_outliers(*SHAPE, n_rows=4, row_factor=6, seed=0)
    assert PatternDetector(threshold=4)(x) == "row"
    assert PatternDetector(threshold=8)(x) == "none"
    mixed = planted_outliers(*SHAPE, n_rows=4, row_factor=30, n_cols=4, col_factor=10, seed=0)
    assert PatternDetector(dominance=2)(mixed) == "row"
    assert PatternDetector(dominance=4)(mixed) == "none"


def test_zero_and_sparse_tensors():
    det = PatternDetector()
    assert det(torch.zeros(64, 64)) == "none"
    x = torch.zeros(64, 64)
    x[3] = 1.0  # one non-zero row: median row RMS is 0
    assert det.scores(x)[0] == float("inf")
    assert det(x) == "row"


@pytest.mark.parametrize(
    "bad,err",
    [(torch.zeros(8), ValueError), (torch.zeros(1, 8), ValueError), ([[1.0]], TypeError)],
    ids=["1d", "one_row", "list"],
)
def test_bad_input_is_rejected(bad, err):
    with pytest.raises(err):
        PatternDetector()(bad)


def test_nan_is_rejected():
    x = torch.randn(8, 8)
    x[2, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        PatternDetector()(x)


@pytest.mark.parametrize("kw", [{"threshold": 1.0}, {"dominance": 0.5}], ids=["threshold", "dominance"])
def test_bad_configuration_is_rejected(kw):
    with pytest.raises(ValueError):
        PatternDetector(**kw)


def test_planted_outliers_is_reproducible_and_checked():
    assert torch.equal(planted_outliers(32, 32, n_rows=2, row_factor=5, seed=3),
                       planted_outliers(32, 32, n_rows=2, row_factor=5, seed=3))
    with pytest.raises(ValueError):
        planted_outliers(8, 8, n_rows=9)
