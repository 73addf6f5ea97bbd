"""Pure JAX numerics: no flax, no pandas.

    formats    element and scale formats (E2M1, E4M3, E5M2, E8M0, INT4/8, casts), bit-exact
    tiny       float32 steps below 2**-126 from the bits, exact where the backend flushes them
    scaling    the block-scaling rules of NVFP4 ("te", "jax"), MX, FP32 blocks and per-scope FP8
    hadamard   blockwise Hadamard rotations
    spec       QuantSpec and the constructors nvfp4 / mxfp4 / mxfp8 / fp8 / cast_spec
    quantize   QTensor, quantize, quantize_dequantize, fake_quant, and the blocks API
    cpu_kernels  C++ kernels built at install (setup.py), called through XLA's FFI
    stats      operand_stats: the error a quantizer makes on one operand
    gemm_recipe  GemmRecipe: the six operand specs and the backward mode, one value
    recipes    the registry of named recipes, override (GemmRecipe re-exported)

Modules here import each other in that order only (docs/architecture.md §1).
"""
