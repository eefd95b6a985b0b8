"""Outlier-pattern detection: is an operand's outlier mass in a few rows, a few columns, or neither?

AdaHOP labels every GEMM operand ``row``, ``col`` or ``none``. The paper's statistic is not
public; this module defines one and makes it configurable.

**Statistic.** For a 2-D operand ``x (M, K)`` as stored (tokens × features for activations and
gradients, out × in for weights), take the RMS of every row and of every column. A few rows that
carry outliers make the largest row RMS stand far above the median row RMS, so the *row score* is
``max / median`` of the row RMS, and the *column score* likewise over columns. With
``cross_normalize`` (the default), the row score is computed on ``x`` with every column divided by
its median ``|x|``, and the column score with every row divided by its median ``|x|``. A line's
median ignores the few outlier entries crossing it, so this removes the other axis's outliers
and leaves this axis's intact: one outlier channel of 100× lifts the plain row score of 512
Gaussian tokens to ≈4.6 (the rows it hits hardest), the cross-normalised one stays ≈1.1. RMS
rather than absmax because a single large element moves a line's absmax by its full size but its
RMS only by ``1/sqrt(K)``: isolated spikes are not a pattern.

**Decision.** ``row`` if the row score is at least ``threshold`` and at least ``dominance`` times
the column score; ``col`` symmetrically; otherwise ``none``. So a tensor with outliers along both
axes at similar strength is ``none``: no single orientation to exploit, and the reference table
sends ``none`` pairs to plain IHT, the safe default.

Defaults (``threshold=4``, ``dominance=2``) and their measured accuracy on planted tensors are in
``tests/test_patterns.py``. Without planted structure, Gaussian tensors score ≈1.1 on both axes and
Student-t(4) below 2; heavier tails (t with 2.5 degrees of freedom) can pass the threshold on both
axes at once and stay ``none`` through the dominance rule. LLM outlier channels and tokens are
usually 10-100× the median.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from adahop import ops

Pattern = Literal["row", "col", "none"]
PATTERNS: tuple[Pattern, ...] = ("row", "col", "none")
_OPPOSITE = {"row": "col", "col": "row", "none": "none"}


def opposite(pattern: str) -> Pattern:
    """The label of the transposed operand: ``row`` ↔ ``col``, ``none`` stays."""
    try:
        return _OPPOSITE[pattern]
    except KeyError:
        raise ValueError(f"unknown pattern {pattern!r}; expected one of {PATTERNS}") from None


def _max_over_median(peak: float, mid: float) -> float:
    if peak == 0.0:
        return 1.0  # an all-zero operand has no outliers
    return peak / mid if mid > 0.0 else float("inf")


@dataclass(frozen=True)
class PatternDetector:
    """Labels a 2-D operand ``row``, ``col`` or ``none`` (see the module docstring).

    threshold: the smallest max/median line-RMS ratio that counts as outliers on an axis (> 1).
    dominance: how many times one axis's score must exceed the other's to win (>= 1).
    cross_normalize: score each axis after normalising the other one away.
    """

    threshold: float = 4.0
    dominance: float = 2.0
    cross_normalize: bool = True

    def __post_init__(self) -> None:
        for name in ("threshold", "dominance"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"detector {name} must be a float, got {type(value).__name__} {value!r}")
        if not isinstance(self.cross_normalize, bool):
            raise TypeError(f"detector cross_normalize must be a bool, got {type(self.cross_normalize).__name__} "
                            f"{self.cross_normalize!r}")
        if not self.threshold > 1.0:
            raise ValueError(f"threshold must be > 1 (a max/median ratio), got {self.threshold}")
        if not self.dominance >= 1.0:
            raise ValueError(f"dominance must be >= 1, got {self.dominance}")

    def scores(self, x: torch.Tensor, backend: str | None = None) -> tuple[float, float]:
        """``(row_score, col_score)`` of ``x (M, K)``: max/median of the per-row / per-column RMS.

        Equivalent to ``rms_rows.max() / rms_rows.median()`` (and for columns) when
        ``cross_normalize`` is off. Raises ValueError for input that is not a 2-D float32, bfloat16
        or float16 tensor, or holds NaN/Inf. ``backend``: which :mod:`adahop.ops` backend computes
        the line statistics (default: each op's own, :func:`adahop.ops.abs_median` and
        :func:`adahop.ops.scaled_mean_squares`); one host sync either way. On the Triton backend
        the mean squares sum in another order than the reference's, so scores agree to fp32
        rounding (a label can differ only for a score on the threshold).
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"pattern detection takes a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 2 or x.shape[0] < 2 or x.shape[1] < 2:
            raise ValueError(f"pattern detection takes a 2-D tensor with >= 2 rows and columns, got {tuple(x.shape)}")
        x = x.detach()
        divisors = ()
        if self.cross_normalize:
            # Median |x| of a line ignores the few outlier entries crossing it, so dividing by it
            # removes the other axis's outliers without touching this axis's. Zero medians (sparse
            # lines) divide by 1; NaN ones too (NaN input is refused below, after one sync).
            meds = (ops.abs_median(x.t(), backend), ops.abs_median(x, backend))
            divisors = tuple(torch.where(m > 0, m, torch.ones_like(m)) for m in meds)
        row_ms, col_ms, nonfinite = ops.scaled_mean_squares(x, *divisors, backend=backend)
        row_rms, col_rms = row_ms.sqrt(), col_ms.sqrt()
        stats = torch.stack([nonfinite.float(), row_rms.max(), row_rms.median(), col_rms.max(), col_rms.median()])
        n_bad, row_peak, row_mid, col_peak, col_mid = stats.tolist()
        if n_bad:
            raise ValueError("pattern detection got NaN or Inf values")
        return _max_over_median(row_peak, row_mid), _max_over_median(col_peak, col_mid)

    def __call__(self, x: torch.Tensor) -> Pattern:
        """The label of ``x (M, K)``. Equivalent to :func:`decide` applied to :meth:`scores`."""
        return self.decide(*self.scores(x))

    def decide(self, row_score: float, col_score: float) -> Pattern:
        if row_score >= self.threshold and row_score >= self.dominance * col_score:
            return "row"
        if col_score >= self.threshold and col_score >= self.dominance * row_score:
            return "col"
        return "none"


def planted_outliers(
    m: int,
    k: int,
    *,
    n_rows: int = 0,
    row_factor: float = 1.0,
    n_cols: int = 0,
    col_factor: float = 1.0,
    base: Literal["gaussian", "student_t"] = "gaussian",
    df: float = 4.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """A synthetic ``(m, k)`` operand with outliers planted in ``n_rows`` rows and ``n_cols`` columns.

    The base is i.i.d. N(0, 1) (or Student-t with ``df`` degrees of freedom: heavy tails, no
    structure); the chosen rows are multiplied by ``row_factor`` and the chosen columns by
    ``col_factor`` (both at once where they cross). Which rows/columns is drawn from ``seed``.
    Equivalent to ``base * row_scale[:, None] * col_scale[None, :]``.
    """
    if not (0 <= n_rows <= m and 0 <= n_cols <= k):
        raise ValueError(f"cannot plant {n_rows} rows / {n_cols} columns in a ({m}, {k}) tensor")
    gen = torch.Generator().manual_seed(seed)
    if base == "gaussian":
        x = torch.randn(m, k, generator=gen, dtype=torch.float64)
    elif base == "student_t":
        # t = z / sqrt(chi2_df / df), with chi2 drawn as a Gamma(df/2, 2).
        z = torch.randn(m, k, generator=gen, dtype=torch.float64)
        chi2 = torch._standard_gamma(torch.full((m, k), df / 2, dtype=torch.float64), generator=gen) * 2
        x = z / (chi2 / df).sqrt()
    else:
        raise ValueError(f"base must be 'gaussian' or 'student_t', got {base!r}")
    row_scale = torch.ones(m, dtype=torch.float64)
    row_scale[torch.randperm(m, generator=gen)[:n_rows]] = row_factor
    col_scale = torch.ones(k, dtype=torch.float64)
    col_scale[torch.randperm(k, generator=gen)[:n_cols]] = col_factor
    return (x * row_scale[:, None] * col_scale[None, :]).to(dtype)
