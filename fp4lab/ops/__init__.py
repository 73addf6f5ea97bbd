"""Quantized primitives built on `fp4lab.core`.

layout        where each GEMM contracts each operand (dot_general, conv)
plan          the per-GEMM operand plan: which operands, which specs, which keys
custom_vjp    the one custom VJP every quantized op runs under (with the telemetry probe)
dot_general   qdot_general, a drop-in for lax.dot_general
conv          qconv_general_dilated, a drop-in for lax.conv_general_dilated
native        the hardware path (jax.nn.scaled_matmul, FP8 GEMMs) and backend resolution
"""
