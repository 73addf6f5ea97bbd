"""Tests run on the CPU, in float32, with rank promotion and x64 off."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
