"""Pattern detection GB/s against the copy bandwidth: what one calibrating GEMM operand costs.

AdaHOP's calibrating steps label every layer's x, w and grad_output (``adahop.patterns``); on the
H200 each costs from a fraction of a second to 2.5 s more than a ~0.3 s plain step of the 125m runs,
by the code each run trained with (``results/quality/gpu/quality.md``, where the training time went,
and the commit of each run's results). The detector runs its mean
squares on the one-read kernel of ``kernels/pattern_stats.py`` and its line medians on
``adahop.ops.ABS_MEDIAN_CUDA``: the faster, for each shape, of ``torch.median`` and the
radix-select kernel, timed on the first call (the warm-up here). Peers, in the same run:

* ``torch-reference``: the detector on the PyTorch reference ops (``torch.median`` per line, fp32
  elementwise passes), what it cost before the kernels;
* ``kernel-medians``: the detector with its medians on the radix-select kernel (the Triton
  backend throughout): with ``torch-reference``, the two that ``ABS_MEDIAN_CUDA`` chooses between;
* ``plain-rms``: the detector without ``cross_normalize`` (no medians): what the medians cost.

Work: the operand's bytes, read once.
"""

from adahop.patterns import PatternDetector


def test_pattern_detection(benchmark, bench, activation_shape):
    x = bench.randn(*activation_shape)
    detect, plain = PatternDetector(), PatternDetector(cross_normalize=False)
    peers = {
        "torch-reference": lambda: detect.scores(x, backend="reference"),
        "kernel-medians": lambda: detect.scores(x, backend="triton"),
        "plain-rms": lambda: plain(x),
    }
    bench.run(benchmark, lambda: detect(x), op="pattern detection", shape=tuple(activation_shape), dtype="bf16",
              work=x.numel() * x.element_size(), unit="GB/s", ceiling="copy", peers=peers)
