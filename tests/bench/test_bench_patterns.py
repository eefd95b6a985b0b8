"""Pattern detection GB/s against the copy bandwidth: what one calibrating GEMM operand costs.

AdaHOP's calibrating steps label every layer's x, w and grad_output (``adahop.patterns``); on the
H200 those steps took ~2.5 s against ~0.3 s for a plain step of the 125m runs
(``results/quality/gpu/quality.md``, where the training time went). The detector runs on the
kernels of ``kernels/pattern_stats.py`` (radix-select line medians, one-read scaled mean squares).
Peers: ``torch-reference``, the same detector on the PyTorch reference ops (``torch.median`` per
line and fp32 elementwise passes: what the detector cost before the kernels, at 5779bdd 19-31 GB/s
here); ``plain-rms``, the detector without ``cross_normalize`` (no medians), so the ratio shows
what the medians cost. Work: the operand's bytes, read once.
"""

from adahop.patterns import PatternDetector


def test_pattern_detection(benchmark, bench, activation_shape):
    x = bench.randn(*activation_shape)
    detect, plain = PatternDetector(), PatternDetector(cross_normalize=False)
    bench.run(benchmark, lambda: detect(x), op="pattern detection", shape=tuple(activation_shape), dtype="bf16",
              work=x.numel() * x.element_size(), unit="GB/s", ceiling="copy",
              peers={"torch-reference": lambda: detect.scores(x, backend="reference"), "plain-rms": lambda: plain(x)})
