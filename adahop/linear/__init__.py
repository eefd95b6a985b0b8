"""The quantized linear layer, one concern a file.

* :mod:`~adahop.linear.seeds`: the draws' seeds (static salts, a device counter per forward);
* :mod:`~adahop.linear.gemm`: one GEMM under a strategy (quantization specs, operands, FP8 layouts);
* :mod:`~adahop.linear.function`: the autograd Function and its frozen plan;
* :mod:`~adahop.linear.module`: :class:`QuantLinear` and its calibration states;
* :mod:`~adahop.linear.convert`: the model-level API (``convert`` and friends);
* :mod:`~adahop.linear.meter`: what autograd saves, measured.
"""

from adahop.linear.convert import (
    SIBLINGS,
    advance_draws,
    calibrating,
    convert,
    eager_while_calibrating,
    export_strategies,
    fix_strategies,
    on_optimizer_step,
    quant_layers,
    refresh_weights,
    strategy_fixes,
)
from adahop.linear.function import LayerPlan, QuantLinearFunction, SlotPlan
from adahop.linear.gemm import GemmConfig, Operand, QuantSpec, Quantized, Want, quantize, score_strategies, slot_specs, strategy_mm, top_rows
from adahop.linear.meter import SavedTensorMeter
from adahop.linear.module import QuantLinear
from adahop.linear.seeds import DrawState, derive_seed, draw_seed

__all__ = [
    "SIBLINGS", "advance_draws", "calibrating", "DrawState", "eager_while_calibrating", "GemmConfig", "LayerPlan", "Operand", "QuantLinear", "QuantLinearFunction", "QuantSpec",
    "Quantized", "SavedTensorMeter", "SlotPlan", "Want", "convert", "derive_seed", "draw_seed", "export_strategies",
    "fix_strategies", "on_optimizer_step", "quant_layers", "quantize", "refresh_weights", "score_strategies", "slot_specs",
    "strategy_fixes", "strategy_mm", "top_rows",
]
