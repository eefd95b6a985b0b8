"""Triton kernels of adahop, imported as ``adahop_kernels`` (see pyproject.toml).

One file per op, each with a launcher that checks its inputs. Nothing here is an nn.Module;
``adahop.ops`` is the public entry point that chooses between these kernels and the reference.
"""
