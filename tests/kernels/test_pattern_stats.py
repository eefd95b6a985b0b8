"""The pattern-statistics kernels: line medians bit-identical to ``x.abs().median(dim=1)`` for every
dtype, stride and split; scaled mean squares equal to the fp32 reference up to summation order; the
detector built on them labelling as the reference does.

Tests take the ``device`` fixture of tests/kernels/conftest.py: CPU through Triton's interpreter
here, compiled kernels on a GPU machine.
"""

import pytest
import torch

from adahop import ops
from adahop.patterns import PatternDetector, planted_outliers
from adahop_kernels.pattern_stats import abs_median, scaled_mean_squares

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "bf16", "fp16"]


def reference(x: torch.Tensor) -> torch.Tensor:
    return x.abs().median(dim=1).values.float()


def same_with_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0), b.nan_to_num(0))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", [1, 2, 7, 300, 301])
@pytest.mark.parametrize("transposed", [False, True], ids=["rows", "columns"])
def test_abs_median_is_bit_exact(dtype, n, transposed, device):
    g = torch.Generator().manual_seed(n)
    # Heavy tails and a wide range of exponents, so every digit of the key is exercised.
    x = (torch.randn(70, n, generator=g) * torch.exp(3 * torch.randn(70, n, generator=g))).to(dtype).to(device)
    if transposed:
        x = x.t().contiguous().t()  # a column-major view: the kernel reads it strided
    assert torch.equal(abs_median(x), reference(x))


@pytest.mark.parametrize("rows", [127, 128, 129])
def test_abs_median_rows_around_a_tile_boundary(rows, device):
    x = torch.randn(rows, 33, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16).to(device)
    assert torch.equal(abs_median(x), reference(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_abs_median_of_columns_through_a_transposed_view(dtype, device):
    x = torch.randn(301, 40, generator=torch.Generator().manual_seed(1)).to(dtype).to(device)
    assert torch.equal(abs_median(x.t()), reference(x.t()))


@pytest.mark.parametrize("splits", [2, 3, 7])
def test_abs_median_split_along_the_line(splits, device):
    x = torch.randn(20, 1000, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).to(device)
    assert torch.equal(abs_median(x, splits=splits), reference(x))


def test_abs_median_ties_zeros_and_signs(device):
    # Repeated values (the median is one of several equal keys), all-zero lines, -0.0, and lines
    # whose values are all one magnitude with mixed signs.
    x = torch.tensor([
        [0.0, -0.0, 0.0, 0.0, 1.0],
        [2.0, -2.0, 2.0, -2.0, 2.0],
        [1.0, 1.0, 3.0, 3.0, 3.0],
        [-5.0, 4.0, -3.0, 2.0, -1.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
    ])
    for dtype in DTYPES:
        xd = x.to(dtype).to(device)
        got = abs_median(xd)
        assert torch.equal(got, reference(xd)) and got.tolist() == [0.0, 2.0, 3.0, 3.0, 0.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_abs_median_extremes_inf_and_nan(dtype, device):
    info = torch.finfo(dtype)
    x = torch.randn(6, 9, generator=torch.Generator().manual_seed(3))
    x[0] = info.max
    x[1] = info.smallest_normal / 4  # subnormal (fp16 and fp32; bf16 too)
    x[2, :5] = float("inf")  # more than half infinite: the median is inf
    x[3, 0] = float("-inf")  # one infinity: a finite median
    x[4, 8] = float("nan")  # NaN anywhere: NaN, as torch.median
    x = x.to(dtype).to(device)
    got, want = abs_median(x), reference(x)
    assert same_with_nan(got, want)
    assert got[2].item() == float("inf") and got[4].isnan() and torch.isfinite(got[3])


def test_abs_median_shapes_and_errors(device):
    assert abs_median(torch.empty(0, 5, device=device)).shape == (0,)
    with pytest.raises(ValueError, match="empty rows"):
        abs_median(torch.empty(3, 0, device=device))
    with pytest.raises(ValueError, match="2-D"):
        abs_median(torch.ones(2, 3, 4, device=device))
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        abs_median(torch.ones(2, 3, dtype=torch.float64, device=device))
    with pytest.raises(ValueError, match="splits"):
        abs_median(torch.ones(2, 3, device=device), splits=0)


def _divisors(m: int, k: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return (torch.rand(k, generator=g) + 0.5).to(device), (torch.rand(m, generator=g) + 0.5).to(device)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "scaled"])
@pytest.mark.parametrize("transposed", [False, True], ids=["row-major", "column-major"])
def test_scaled_mean_squares_matches_reference(dtype, scaled, transposed, device):
    x = (torch.randn(130, 300, generator=torch.Generator().manual_seed(4)) * 3).to(dtype).to(device)
    if transposed:
        x = x.t().contiguous().t()
    divs = _divisors(*x.shape, device) if scaled else ()
    got, want = scaled_mean_squares(x, *divs), ops.scaled_mean_squares_ref(x, *divs)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=0)
    assert got[2].item() == want[2].item() == 0


def test_scaled_mean_squares_counts_nonfinite_entries(device):
    x = torch.randn(70, 90)
    x[3, 4], x[60, 89], x[69, 0] = float("nan"), float("inf"), float("-inf")
    x = x.to(torch.bfloat16).to(device)
    assert scaled_mean_squares(x)[2].item() == 3 == ops.scaled_mean_squares_ref(x)[2].item()
    assert scaled_mean_squares(x, *_divisors(70, 90, device))[2].item() == 3


def test_scaled_mean_squares_checks_its_divisors(device):
    x = torch.ones(4, 6, device=device)
    col, row = torch.ones(6, device=device), torch.ones(4, device=device)
    with pytest.raises(ValueError, match="both col_div and row_div"):
        scaled_mean_squares(x, col, None)
    with pytest.raises(ValueError, match=r"row_div must be fp32 of shape \(4,\)"):
        scaled_mean_squares(x, col, torch.ones(6, device=device))
    with pytest.raises(ValueError, match="col_div must be fp32"):
        scaled_mean_squares(x, col.double(), row)
    with pytest.raises(ValueError, match="no entries"):
        scaled_mean_squares(torch.ones(0, 6, device=device))


@pytest.mark.parametrize("planted", [dict(n_rows=3, row_factor=30.0), dict(n_cols=3, col_factor=30.0), dict()],
                         ids=["rows", "columns", "none"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_detector_on_the_kernels_scores_as_the_reference(planted, dtype, device):
    x = planted_outliers(128, 160, dtype=dtype, seed=5, **planted).to(device)
    detect = PatternDetector()
    got, want = detect.scores(x, backend="triton"), detect.scores(x, backend="reference")
    assert got == pytest.approx(want, rel=1e-5)
    assert detect.decide(*got) == detect.decide(*want) == {"n_rows": "row", "n_cols": "col"}.get(next(iter(planted), ""), "none")
    bad = x.clone()
    bad[1, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        detect.scores(bad, backend="triton")


def test_abs_median_without_a_backend_times_both_on_cuda_and_takes_the_reference_elsewhere(monkeypatch, device):
    import adahop_kernels.pattern_stats as ps

    calls = []
    monkeypatch.setattr(ps, "abs_median", lambda x: calls.append("kernel") or reference(x))
    monkeypatch.delenv("ADAHOP_BACKEND", raising=False)
    x = torch.randn(8, 9).to(device)
    assert set(ops.ABS_MEDIAN_CUDA.candidates) == {"torch.median", "radix-select kernel"}
    monkeypatch.setattr(ops, "ABS_MEDIAN_CUDA", lambda x: calls.append("faster-of") or reference(x))
    assert torch.equal(ops.abs_median(x), reference(x))
    assert calls == (["faster-of"] if x.is_cuda else [])
    calls.clear()
    ops.abs_median(x, backend="triton")
    monkeypatch.setenv("ADAHOP_BACKEND", "triton")
    ops.abs_median(x)
    assert calls == ["kernel", "kernel"]
