"""Outlier extraction: the row-absmax kernel (bit-exact), extract_outliers against its reference.

Tests take the ``device`` fixture of tests/kernels/conftest.py: CPU through Triton's interpreter
here, compiled kernels on a GPU machine.
"""

import pytest
import torch

from adahop import ops
from adahop_kernels.outliers import row_absmax

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "bf16", "fp16"]
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def planted(m: int, k: int, rows: list[int], dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    """Gaussian ``(m, k)`` with one large entry in each of ``rows`` (each larger than the last)."""
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
    for i, r in enumerate(rows):
        x[r, (7 * i) % k] = -(50.0 + 10 * i) if i % 2 else 50.0 + 10 * i
    return x.to(dtype)


def same_with_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0), b.nan_to_num(0))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows", [127, 128, 129])
@pytest.mark.parametrize("transposed", [False, True], ids=["rows", "columns"])
def test_row_absmax_is_bit_exact(dtype, rows, transposed, device):
    x = torch.randn(rows, 300).to(dtype).to(device)
    x = x.t() if transposed else x
    assert torch.equal(row_absmax(x), x.abs().amax(1).float())


@pytest.mark.parametrize("splits", [2, 4])
def test_row_absmax_split_along_k(splits, device):
    x = planted(70, 2000, [3, 50], seed=1)  # a large entry in the last split too
    x[50, 1999] = 99.0
    x = x.to(device)
    assert torch.equal(row_absmax(x, splits=splits), x.abs().amax(1))


def test_row_absmax_nan_row_is_nan_and_inf_counts(device):
    x = torch.randn(64, 96)
    x[5, 90], x[9, 0] = float("nan"), float("-inf")
    x = x.to(device)
    r = row_absmax(x)
    assert r[5].isnan() and r[9].item() == float("inf")
    assert same_with_nan(r, x.abs().amax(1))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_extract_outliers_finds_planted_rows(dtype, device):
    want = [2, 40, 127, 128]
    idx, rows = ops.extract_outliers(planted(129, 256, want, dtype).to(device), 4)
    assert idx.tolist() == want and idx.dtype == torch.int64
    assert rows.dtype == torch.bfloat16 and rows.shape == (4, 256)


def test_extract_outliers_matches_reference(device):
    x = torch.randn(300, 160)
    x[17, 3] = float("nan")
    x = x.to(device)
    idx, rows = ops.extract_outliers(x, 64)
    ref_idx, ref_rows = ops.extract_outliers_ref(x, 64)
    assert torch.equal(idx, ref_idx) and same_with_nan(rows.float(), ref_rows.float())
    assert 17 in idx.tolist()  # a NaN row ranks first


def test_equal_maxima_go_to_the_lower_index_on_every_backend_and_device(device):
    # bf16 rows of few distinct maxima: the k-th place falls among many equal ones.
    x = torch.randint(-4, 5, (300, 96), generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    x[:, 0] = 1.0
    x[[250, 7, 120], 5] = 8.0  # above every other row
    x[[299, 3], 9] = float("nan")  # two diverged rows rank first, the lower first
    want = sorted([3, 299, 7, 120, 250] + [r for r in range(300) if r not in (3, 7, 120, 250, 299)
                                           and x[r].float().abs().amax() == 4][:11])
    for operand in (x, x.t().contiguous().t()):  # row-major, and column-major
        for backend in ("reference", "triton"):
            idx, _ = ops.extract_outliers(operand.to(device), 16, backend=backend)
            assert idx.cpu().tolist() == want, backend
    assert ops.select_outliers(x, 16).tolist() == want


def test_rank_outliers_ties_and_nan():
    amax = torch.tensor([1.0, 3.0, 2.0, 3.0, float("nan"), 2.0, 3.0])
    assert ops.rank_outliers(amax, 3).tolist() == [1, 3, 4]
    assert ops.rank_outliers(amax, 5).tolist() == [1, 2, 3, 4, 6]
    assert ops.rank_outliers(amax, 0).tolist() == []


def test_column_outliers_are_rows_of_the_transpose(device):
    want = [5, 33, 200]
    x = planted(256, 129, want).to(device).t()  # (129, 256), outliers in columns 5, 33, 200
    idx, cols = ops.extract_outliers(x.t(), 3)
    assert idx.tolist() == want
    assert torch.equal(cols, x[:, idx].t().to(torch.bfloat16))


@pytest.mark.parametrize("k", [0, 129], ids=["none", "all"])
def test_extract_outliers_edge_k(k, device):
    x = torch.randn(129, 64, device=device)
    idx, rows = ops.extract_outliers(x, k)
    assert idx.tolist() == list(range(k))
    assert torch.equal(rows, x[idx].to(torch.bfloat16))


def test_reference_backend_runs_the_reference():
    x = planted(64, 64, [10, 20])
    assert ops.extract_outliers(x, 2, backend="reference")[0].tolist() == [10, 20]


@pytest.mark.parametrize("k", [-1, 130], ids=["negative", "above-rows"])
def test_rejects_k_out_of_range(k):
    with pytest.raises(ValueError, match="outlier rows requested"):
        ops.extract_outliers(torch.randn(129, 64), k)


def test_rejects_non_integer_k():
    with pytest.raises(TypeError, match="k must be an int"):
        ops.extract_outliers(torch.randn(8, 64), 2.0)


def test_rejects_wrong_rank():
    with pytest.raises(ValueError, match="2-D"):
        ops.extract_outliers(torch.randn(2, 8, 64), 1)


def test_rejects_integer_dtype():
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        ops.extract_outliers(torch.ones(8, 64, dtype=torch.int32), 1)


def test_rejects_empty_rows():
    with pytest.raises(ValueError, match="empty rows"):
        ops.extract_outliers(torch.randn(8, 0), 1)


def test_rejects_bad_splits(device):
    with pytest.raises(ValueError, match="splits"):
        row_absmax(torch.randn(8, 64, device=device), splits=0)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("transposed", [False, True], ids=["rows", "columns"])
def test_gpu_extract_outliers_matches_reference(transposed):
    x = planted(16384, 4096, [1, 999, 16383], torch.bfloat16).cuda()
    x = x.t() if transposed else x
    assert torch.equal(row_absmax(x), x.abs().amax(1).float())
    idx, rows = ops.extract_outliers(x, 64)
    ref_idx, ref_rows = ops.extract_outliers_ref(x, 64)
    assert torch.equal(idx, ref_idx) and torch.equal(rows, ref_rows)
    # The GPU ranks as the CPU does where maxima tie (bf16 rows hold many equal ones).
    assert torch.equal(idx.cpu(), ops.extract_outliers_ref(x.cpu(), 64)[0])
