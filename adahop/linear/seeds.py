"""Seeds of the layer's random draws: a static salt per draw, a device counter per forward.

Every stochastic-rounding draw and random-sign vector of a converted model has its own seed,
``draw_seed(counter, salt)``:

* ``salt`` (a Python int, fixed when the model is converted) mixes the run seed, the layer (or,
  for X, the layer's input group: sibling layers reading one input draw alike, so their identical
  quantizations are one computation under ``torch.compile``), the GEMM slot and the operand;
* ``counter`` is an int64 device tensor shared by every layer of a converted model
  (:class:`DrawState`), advanced after every optimizer step and, for gradient accumulation,
  between micro-batches (:func:`adahop.linear.advance_draws`): always eagerly, between graphs.
  Inside a compiled graph it is only read. (A counter mutated inside the graph that its backward
  also reads is unsafe: the partitioner may recompute its updated value from the already-updated
  buffer.)

So a step's draws differ from every other step's, and nothing a compiled graph reads changes
as a Python value between steps (a Python-int seed would recompile the graph
every step). The mixing is integer arithmetic on int64 tensors whose intermediates stay below
2**62: the same values on every device, in a few fused element-wise ops.
"""

from __future__ import annotations

import torch
from torch import nn

from adahop import library
from adahop.backend import Backend, resolve_backend
from adahop.hadamard import _seed_tensor_hash

_MASK64 = (1 << 64) - 1
_MASK31 = (1 << 31) - 1
SLOT_CODES = {"fwd": 1, "dgrad": 2, "wgrad": 3}
SIGNS, LEFT, RIGHT = 0, 1, 2


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


@torch.compiler.assume_constant_result
def derive_seed(*parts: int) -> int:
    """A 31-bit seed mixed from integers (splitmix64 chain): neighbours give unrelated seeds.

    31 bits fit every seed range the backends take (torch generators, the Triton kernels). A pure
    function of Python ints, which ``torch.compile`` calls instead of tracing: Dynamo would otherwise
    step through every shift and multiply of the chain, for each of a layer's draws.
    """
    h = 0
    for p in parts:
        h = _splitmix64(h ^ (int(p) & _MASK64))
    return h & _MASK31


def _mix31(z: torch.Tensor) -> torch.Tensor:
    # A 31-bit xorshift-multiply finaliser: z < 2**31 and multipliers < 2**31 keep products < 2**62.
    z = ((z ^ (z >> 15)) * 0x2C1B3C6D) & _MASK31
    z = ((z ^ (z >> 12)) * 0x297A2D39) & _MASK31
    return z ^ (z >> 15)


def draw_seed(counter: torch.Tensor, salt: int) -> torch.Tensor:
    """The int64 ``(1,)`` seed of the draw ``salt`` at ``counter`` (an int64 tensor), in [0, 2**31).

    Equivalent to ``mix31((mix31(counter mod 2**31) + salt) mod 2**31)``.
    """
    return _mix31((_mix31(counter.reshape(1) & _MASK31) + (salt & _MASK31)) & _MASK31)


def signs_from_seed(n: int, seed: torch.Tensor, dtype: torch.dtype,
                    backend: Backend | str | None = None) -> torch.Tensor:
    """The ±1 vector of length ``n`` for a seed tensor, on the seed's device.

    Equivalent to :func:`adahop.hadamard.random_signs` ``(n, int(seed))``, computed from the tensor
    without reading it on the host: ``adahop.library.signs_from_seed`` (the signs kernel, or
    :func:`signs_from_seed_ref` under the reference backend; ``backend`` resolved on the seed's
    device by :func:`adahop.backend.resolve_backend`).
    """
    return library.signs_from_seed(n, seed.reshape(1), dtype, resolve_backend(seed.device, backend).value)


def signs_from_seed_ref(n: int, seed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The reference of :func:`signs_from_seed`: the hash in int64 PyTorch ops."""
    return (1 - 2 * (_seed_tensor_hash(n, seed) >> 31)).to(dtype)


class DrawState(nn.Module):
    """Holds a model's draw counter (``value``, an int64 scalar buffer, not in the state dict).

    One instance is a submodule of every quantized layer of a converted model, so ``model.to()``
    moves the one counter that all of them read. Its
    value travels in the layers' extra state, so a resumed run draws as the original.
    ``labels`` keeps the calibration label of each input group for the current forward, so
    sibling layers reading one input detect its pattern once.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.register_buffer("value", torch.zeros((), dtype=torch.int64, device=device), persistent=False)
        self.labels: dict[tuple[int, int], str] = {}


def new_counter(device: torch.device | str | None = None) -> torch.Tensor:
    return torch.zeros((), dtype=torch.int64, device=device)
