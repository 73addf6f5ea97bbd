"""Pure JAX numerics: no flax, no pandas.

Each module imports only modules listed below it. The quantizer's route from `fake_quant` goes
down this list: quantize, blocks, then kernel_route and cpu_kernels, or the reference's scaling
and dequant (docs/architecture.md §1, "The quantizer's route").

    stats      operand_stats: the error a quantizer makes on one operand (the blocks API)
    recipes    the registry of named recipes, override (GemmRecipe re-exported)
    gemm_recipe  GemmRecipe: the six operand specs and the backward mode, one value
    quantize   the entry points: fake_quant, quantize_dequantize, quantize, QTensor; the blocks
               API of the statistics
    blocks     how a spec becomes blocks and blocks become x_hat: the blocked view, the rotation,
               the kernel or the reference for the blocks, and the way back
    kernel_route  when the quantizer runs as one call of the CPU kernel, and that call
    dequant    x_hat from a quantization's parts
    scaling    the reference's scale rules: NVFP4 ("te", "jax"), MX, FP32 blocks, per-scope FP8
    subnormal  float32 steps below 2**-126 from the bits, exact where the backend flushes them
    spec       QuantSpec and the constructors nvfp4 / mxfp4 / mxfp8 / fp8 / cast_spec
    formats    element and scale formats (E2M1, E4M3, E5M2, E8M0, INT4/8, casts), bit-exact
    hadamard   blockwise Hadamard rotations
    prng       Threefry keys and random bits, bit for bit as jax.random's
    cpu_kernels   C++ kernels built at install (setup.py), called through XLA's FFI
    kernel_build  the kernels' build: the library's stamp, a failed build recorded once
"""
