"""adahop: MXFP4 training with outlier-pattern-aware Hadamard rotation, and its peers.

Submodules: ``formats`` (MXFP4 reference), ``checks`` (argument checks), ``hadamard`` (block
Hadamard reference), ``backend`` (Triton vs reference switch), ``library`` (the kernels' entry
points), ``ops`` (public MXFP4 ops), ``patterns`` (outlier-pattern detection), ``policy``
(strategy table, calibration), ``recipes`` (the registry of recipes), ``hot`` (HOT's GEMMs),
``linear`` (the quantized layer and the model-level API below). The experiment harness
(``adahop.harness``: model, corpus, training, evaluation, results files) is a layer above this
one, imported only by what uses it (DESIGN §7, "Two layers").

Model-level API::

    model = adahop.convert(model, "adahop", skip=("lm_head",), **overrides)
    ...  # after every optimizer.step():
    adahop.on_optimizer_step(model)
    with adahop.eager_while_calibrating(model):  # a compiled model's steps, while it calibrates
        ...
    adahop.export_strategies(model)  # per-layer labels and strategies as JSON-ready data
    adahop.fix_strategies(model, {name: {"fwd": ..., "dgrad": ..., "wgrad": ...}})  # reuse a map
    adahop.refresh_weights(model, torch.bfloat16)  # recipes with weight_cache: before compiling
"""

from adahop.linear import (
    QuantLinear,
    convert,
    eager_while_calibrating,
    export_strategies,
    fix_strategies,
    on_optimizer_step,
    refresh_weights,
)
from adahop.recipes import RECIPES, Recipe, get_recipe

__all__ = [
    "QuantLinear",
    "RECIPES",
    "Recipe",
    "convert",
    "eager_while_calibrating",
    "export_strategies",
    "fix_strategies",
    "get_recipe",
    "on_optimizer_step",
    "refresh_weights",
]

__version__ = "0.1.0"
