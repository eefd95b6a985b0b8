"""adahop.harness: the experiment harness that ``experiments/`` and the workflow drive.

It uses the library (``import adahop``) and is never imported by it, so the library loads without
the harness's dependencies (transformers, tokenizers, lm-eval, pandas, ...): DESIGN §7, "Two layers".

Modules: ``model`` (a Llama-style decoder, exported to transformers), ``markup``, ``corpus`` and
``data`` (the corpus, its tokenizer and token shards), ``train`` (the pretraining loop),
``eval`` (lm-eval offline; ``paper_reference.yaml``, the paper's numbers), ``quality`` (each
recipe's gap to bf16), ``capture`` and ``study`` (the outlier-pattern study), ``provenance``
(results files) and ``kernel_compile`` (every kernel compiled for sm_90 without a GPU).
Importing this package imports none of them.
"""
