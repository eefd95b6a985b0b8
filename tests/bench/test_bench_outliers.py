"""Outlier extraction GB/s against the copy bandwidth, beside two PyTorch ways of doing the same.

Peers: ``torch-vector-norm`` (PyTorch's single-pass reduction ``vector_norm(x, inf, 1)``, then the
same top-k and gather) and ``reference`` (``extract_outliers_ref``: ``x.abs().amax(1)``, three
passes over x). Whether the row-absmax kernel earns its lines is read from these ratios.
"""

import pytest
import torch

from adahop import ops

K_OUTLIERS = 64  # the reference recipe's k


@pytest.mark.parametrize("orientation", ["rows", "columns"])
def test_extract_outliers(benchmark, bench, activation_shape, orientation):
    x = bench.randn(*activation_shape)
    x = x if orientation == "rows" else x.t()  # column outliers: rows of the transposed view
    rows, cols = x.shape
    # Bytes: x read once, k bf16 rows written (the M absmax values and the indices are < 0.1%).
    work = rows * cols * x.element_size() + K_OUTLIERS * cols * 2

    def torch_vector_norm():
        idx = torch.linalg.vector_norm(x, float("inf"), dim=1).topk(K_OUTLIERS).indices.sort().values
        return idx, x.index_select(0, idx).to(torch.bfloat16)

    bench.run(benchmark, lambda: ops.extract_outliers(x, K_OUTLIERS, backend=bench.backend),
              op=f"extract_outliers ({orientation})", shape=(rows, cols), dtype="bf16", work=work, unit="GB/s",
              ceiling="copy", peers={"torch-vector-norm": torch_vector_norm,
                                     "reference": lambda: ops.extract_outliers_ref(x, K_OUTLIERS)})
