"""adahop: MXFP4 training with outlier-pattern-aware Hadamard rotation, and its peers.

Submodules: ``formats`` (MXFP4 reference), ``hadamard`` (block Hadamard reference), ``backend``
(Triton vs reference switch), ``ops`` (public MXFP4 ops), ``provenance`` (results files).
"""

__version__ = "0.1.0"
