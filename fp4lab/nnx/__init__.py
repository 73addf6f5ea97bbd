"""Flax NNX integration: unmodified models under per-layer rules, and their telemetry.

state       the Variable types a quantized op keeps (keys, amax histories, probes, stats)
op          the quantized op modules put at flax's seams
rules       Rule, quantize_model, describe, unquantize, unseamed (modules without a seam)
gemm_trace  which parameters a GEMM reads, from the traced program
telemetry   collect, value_and_grad, exact_grads, shadow_metrics, set_enabled
noise       more draws of the quantization keys: the gradient noise's zero-mean part and bias
"""
