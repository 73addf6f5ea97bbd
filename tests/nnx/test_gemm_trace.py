"""Which parameters a GEMM reads, found in the traced program: through scans of stacked
layers, while loops, conds and remat, and not a table that is only added."""

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lab.nnx.gemm_trace import gemm_params
from fp4lab.nnx.rules import unseamed


class Custom(nnx.Module):
    def __init__(self, rngs):
        self.w = nnx.Param(jnp.ones((3, 8, 8)))  # stacked layers, scanned
        self.pos = nnx.Param(jnp.ones((4, 8)))  # only added
        self.v = nnx.Param(jnp.ones((8, 8)))  # in a while loop's body
        self.c = nnx.Param(jnp.ones((8, 8)))  # in one branch of a cond
        self.fc = nnx.Linear(8, 8, rngs=rngs)  # a seam

    def __call__(self, x):
        x = x + self.pos[...]
        x, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, self.w[...])
        step = lambda s: (s[0] + 1, s[1] @ self.v[...].astype(jnp.bfloat16).T)  # noqa: E731
        x = jax.lax.while_loop(lambda s: s[0] < 2, step, (0, x.astype(jnp.bfloat16)))[1]
        x = jax.lax.cond(x.sum() > 0, lambda a: a @ self.c[...], lambda a: a, x.astype(jnp.float32))
        return jax.checkpoint(lambda a: self.fc(a).sum())(x)


def test_gemm_params_follow_the_parameters_into_every_nested_program():
    model = Custom(nnx.Rngs(0))
    found = gemm_params(model, lambda m, x: m(x), jnp.ones((4, 8)))
    assert found == {"w", "v", "c", "fc.kernel"}


def test_unseamed_lists_the_module_and_keeps_it_only_where_a_gemm_reads_it():
    class Table(nnx.Module):
        def __init__(self):
            self.pos = nnx.Param(jnp.ones((4, 8)))

        def __call__(self, x):
            return x + self.pos[...]

    model = nnx.Sequential(Table(), nnx.Linear(8, 8, rngs=nnx.Rngs(0)), Custom(nnx.Rngs(1)))
    assert unseamed(model) == ["layers.0", "layers.2"]  # statically: both hold 2D+ Params
    x = jax.ShapeDtypeStruct((4, 8), jnp.float32)  # shapes are enough
    assert unseamed(model, lambda m, x: m(x), x) == ["layers.2"]
