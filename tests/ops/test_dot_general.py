"""qdot_general: the three GEMMs, their specs and the backward modes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import fp4lab as fl
from fp4lab.core import recipes
from fp4lab.ops.dot_general import qdot_general
from fp4lab.ops.layout import DotLayout

DN_2D = (((1,), (0,)), ((), ()))  # x (M, K) . w (K, N)
DN_3D = (((2,), (0,)), ((), ()))  # x (B, T, K) . w (K, N), as nnx.Linear
DN_BATCHED = (((2,), (1,)), ((0,), (0,)))  # (B, M, K) . (B, K, N)


def _xw(shape_x=(32, 64), shape_w=(64, 96), seed=0):
    kx, kw = jax.random.split(jax.random.key(seed))
    return jax.random.normal(kx, shape_x), jax.random.normal(kw, shape_w)


def _loss(dn, recipe, key=None):
    def f(x, w):
        y = qdot_general(x, w, dn, recipe, key=key)
        return jnp.sum(y * jnp.cos(y))  # a non-trivial cotangent

    return f


def _ref_loss(dn, fx, fw):
    def f(x, w):
        y = lax.dot_general(fx(x), fw(w), dn)
        return jnp.sum(y * jnp.cos(y))

    return f


@pytest.mark.parametrize(
    "dn,shapes", [(DN_2D, ((32, 64), (64, 48))), (DN_3D, ((2, 16, 64), (64, 96)))]
)
@pytest.mark.parametrize("jit", [False, True])
def test_identity_recipe_is_bit_identical_to_dot_general(dn, shapes, jit):
    x, w = _xw(*shapes)
    f = _loss(dn, recipes.GemmRecipe())
    ref = _ref_loss(dn, lambda a: a, lambda b: b)
    if jit:
        f, ref = jax.jit(f), jax.jit(ref)
    np.testing.assert_array_equal(
        qdot_general(x, w, dn, recipes.GemmRecipe()), lax.dot_general(x, w, dn)
    )
    for a, b in zip(jax.grad(f, (0, 1))(x, w), jax.grad(ref, (0, 1))(x, w), strict=True):
        np.testing.assert_array_equal(a, b)


def _vjps(f, g_f, x, w, cotangent_seed=3):
    """Gradients of f and g_f at (x, w) for the same cotangent, and both forward values.

    The same cotangent isolates the backward: a compiled forward may differ from an eager one
    in the last bit (XLA's dot on CPU), which a nonlinear loss would feed into the gradient.
    """
    y, vjp = jax.vjp(f, x, w)
    y_ref, vjp_ref = jax.vjp(g_f, x, w)
    g = jax.random.normal(jax.random.key(cotangent_seed), y.shape)
    return y, y_ref, vjp(g), vjp_ref(g)


@pytest.mark.parametrize("name", ["nvfp4-rl", "mxfp4", "mxfp4-h16", "fp8", "nvfp4-h-fprop"])
@pytest.mark.parametrize(
    "shapes,dn", [(((32, 64), (64, 96)), DN_2D), (((2, 16, 64), (64, 96)), DN_3D)]
)
def test_dequantized_backward_is_the_gradient_of_the_quantized_forward(name, shapes, dn):
    """Bit for bit: the VJP of dot(fake_quant(x), fake_quant(w)) with the same specs."""
    recipe = recipes.get(name).replace(backward="dequantized")
    x, w = _xw(*shapes)
    # fake_quant with a Hadamard returns the unrotated dequantized operands: the exact gradient
    # of the rotated forward (R R^T = I)
    sx = recipe.fprop_x.replace(axis=x.ndim - 1)
    sw = recipe.fprop_w.replace(axis=0)
    y, y_ref, got, want = _vjps(
        lambda a, b: qdot_general(a, b, dn, recipe),
        lambda a, b: lax.dot_general(fl.fake_quant(a, sx), fl.fake_quant(b, sw), dn),
        x,
        w,
    )
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "fp8"])
def test_high_precision_backward_is_the_plain_gradient_for_the_same_cotangent(name):
    recipe = recipes.get(name).replace(backward="high_precision")
    x, w = _xw()
    key = jax.random.key(1)
    y, vjp = jax.vjp(lambda a, b: qdot_general(a, b, DN_2D, recipe, key=key), x, w)
    g = jax.random.normal(jax.random.key(2), y.shape)
    _, vjp_ref = jax.vjp(lambda a, b: lax.dot_general(a, b, DN_2D), x, w)
    for a, b in zip(vjp(g), vjp_ref(g), strict=True):
        np.testing.assert_array_equal(a, b)


def _fq(a, spec, axis, key=None, tkey=None):
    if spec is None:
        return a
    return fl.quantize(a, spec.replace(axis=axis), key=key, transform_key=tkey).dequantize(
        rotated=True
    )


@pytest.mark.parametrize(
    "name", ["nvfp4", "mxfp4", "mxfp8", "fp8", "mxfp4-h16", "nvfp4-h-dgrad", "nvfp4-sr-weights"]
)
def test_quantized_backward_equals_a_hand_composed_reference(name, documented_keys):
    """Dgrad = Q(dy) Q(w)^T along N; Wgrad = Q(x)^T Q(dy) along M, each with its own spec."""
    recipe = recipes.get(name)
    x, w = _xw()  # (M, K), (K, N)
    key = jax.random.key(7)
    g = jax.random.normal(jax.random.key(3), (x.shape[0], w.shape[1]))  # (M, N)

    @jax.jit  # one program each, not hundreds of op-by-op compiles
    def grads(x, w, g):
        _, vjp = jax.vjp(lambda a, b: qdot_general(a, b, DN_2D, recipe, key=key), x, w)
        return vjp(g)

    ks = documented_keys(key)
    kd, kw = ks["dgrad_transform"], ks["wgrad_transform"]

    @jax.jit
    def reference(x, w, g):
        # Dgrad contracts N: dy (M, N) along its last axis, w (K, N) along its last axis.
        dy_d = _fq(g, recipe.dgrad_dy, 1, ks["dgrad_dy"], kd)
        w_d = _fq(w, recipe.dgrad_w, 1, ks["dgrad_w"], kd)
        # Wgrad contracts M: x (M, K) along axis 0, dy (M, N) along axis 0.
        x_w = _fq(x, recipe.wgrad_x, 0, ks["wgrad_x"], kw)
        dy_w = _fq(g, recipe.wgrad_dy, 0, ks["wgrad_dy"], kw)
        return dy_d @ w_d.T, x_w.T @ dy_w

    dx, dw = grads(x, w, g)
    dx_ref, dw_ref = reference(x, w, g)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-5, atol=1e-4)
    # and it is really quantized: far from the exact gradient
    assert float(jnp.linalg.norm(dw - x.T @ g) / jnp.linalg.norm(x.T @ g)) > 1e-3


def test_fprop_quantizes_each_operand_along_the_contraction_axis():
    recipe = recipes.get("nvfp4")
    x, w = _xw()
    y = qdot_general(x, w, DN_2D, recipe, key=jax.random.key(0))
    ref = fl.fake_quant(x, recipe.fprop_x.replace(axis=1)) @ fl.fake_quant(
        w, recipe.fprop_w.replace(axis=0)
    )
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-5)


def test_hadamard_on_an_unquantized_gemm_cancels():
    h = fl.Hadamard(16, "none")
    spec = fl.cast_spec("fp32").replace(transform=h)
    recipe = recipes.GemmRecipe(fprop_x=spec, fprop_w=None)
    x, w = _xw()
    np.testing.assert_allclose(qdot_general(x, w, DN_2D, recipe), x @ w, rtol=1e-5, atol=1e-4)


def test_stochastic_keys_differ_per_operand_and_call_and_reproduce(documented_keys):
    recipe = recipes.get("nvfp4")  # SR on gradients
    x, w = _xw()

    def grads(key):
        return jax.grad(_loss(DN_2D, recipe, key), (0, 1))(x, w)

    a, b, c = grads(jax.random.key(1)), grads(jax.random.key(1)), grads(jax.random.key(2))
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[1], c[1])
    ks = documented_keys(jax.random.key(1))
    datas = {n: tuple(np.asarray(jax.random.key_data(k)).ravel()) for n, k in ks.items()}
    assert len(set(datas.values())) == len(datas)


def test_missing_key_is_an_error():
    x, w = _xw()
    with pytest.raises(ValueError, match="needs a PRNG key"):
        qdot_general(x, w, DN_2D, "nvfp4")


def test_unknown_recipe_lists_known_names():
    x, w = _xw()
    with pytest.raises(ValueError, match="known recipes: .*nvfp4"):
        qdot_general(x, w, DN_2D, "nvfp5")


def test_batched_dimension_numbers_and_vmap():
    recipe = recipes.get("mxfp4")
    x = jax.random.normal(jax.random.key(0), (3, 32, 64))
    w = jax.random.normal(jax.random.key(1), (3, 64, 32))
    y = qdot_general(x, w, DN_BATCHED, recipe)
    per = jax.vmap(lambda a, b: qdot_general(a, b, DN_2D, recipe))(x, w)
    np.testing.assert_allclose(y, per, rtol=1e-6, atol=1e-5)
    gx = jax.grad(lambda a: qdot_general(a, w, DN_BATCHED, recipe).sum())(x)
    assert gx.shape == x.shape and bool(jnp.all(jnp.isfinite(gx)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dtypes_pass_through(dtype):
    x, w = _xw()
    x, w = x.astype(dtype), w.astype(dtype)
    y = qdot_general(x, w, DN_2D, "mxfp4")
    assert y.dtype == dtype
    gx, gw = jax.grad(
        lambda a, b: qdot_general(a, b, DN_2D, "mxfp4").astype(jnp.float32).sum(), (0, 1)
    )(x, w)
    assert gx.dtype == dtype and gw.dtype == dtype


def test_layout_round_trips():
    lay = DotLayout.of((2, 5, 3, 4), (4, 3, 7), (((3, 2), (0, 1)), ((), ())))
    x = jnp.arange(2 * 5 * 3 * 4.0).reshape(2, 5, 3, 4)
    w = jnp.arange(4 * 3 * 7.0).reshape(4, 3, 7)
    np.testing.assert_array_equal(lay.lhs_from(lay.lhs_to(x)), x)
    np.testing.assert_array_equal(lay.rhs_from(lay.rhs_to(w)), w)
    x3, w3 = lay.lhs_to(x), lay.rhs_to(w)
    y = lax.dot_general(x, w, lay.dimension_numbers)
    np.testing.assert_allclose(jnp.einsum("bmk,bnk->bmn", x3, w3).reshape(y.shape), y)


def test_batch_invariance_with_row_scale_and_not_with_tensor_scale():
    x, w = _xw((32, 64), (64, 96))
    other = x.at[1:].set(100.0 * jax.random.normal(jax.random.key(9), (31, 64)))
    row = recipes.GemmRecipe(fprop_x=fl.nvfp4(scope="row"), fprop_w=fl.nvfp4())
    ten = recipes.GemmRecipe(fprop_x=fl.nvfp4(), fprop_w=fl.nvfp4())
    np.testing.assert_array_equal(
        qdot_general(x, w, DN_2D, row)[0], qdot_general(other, w, DN_2D, row)[0]
    )
    assert not np.array_equal(
        qdot_general(x, w, DN_2D, ten)[0], qdot_general(other, w, DN_2D, ten)[0]
    )


def _gemm(recipe, telemetry=False, backends=("simulated",) * 3, stats="fused"):
    from fp4lab.ops.dot_general import DotGemm

    return DotGemm(
        recipe=recipes.get(recipe) if isinstance(recipe, str) else recipe,
        telemetry=telemetry,
        stats=stats,
        dimension_numbers=DN_2D,
        backends=backends,
    )


def test_dgrad_takes_fprop_weight_only_where_the_blocks_coincide():
    """`shares_weight`: square tiles (or one scale per tensor), RNE, no rotation, no reference
    statistics, a dot layout whose N and K the tile divides; everything else quantizes w
    again."""
    shapes = ((32, 64), (64, 48))
    assert _gemm("nvfp4").shares_weight(*shapes)  # 16x16 weight blocks
    assert _gemm("fp8").shares_weight(*shapes)  # one scale per tensor
    assert _gemm("bf16").shares_weight(*shapes)  # an elementwise cast
    assert _gemm("nvfp4", telemetry=True).shares_weight(*shapes)  # fused: Fprop's statistics
    assert not _gemm("nvfp4", telemetry=True, stats="reference").shares_weight(*shapes)
    assert not _gemm("nvfp4").shares_weight((32, 64), (64, 40))  # 16 does not divide N = 40
    assert not _gemm("mxfp4").shares_weight(*shapes)  # 1x32 tiles: other blocks along N
    assert not _gemm("nvfp4-sr-weights").shares_weight(*shapes)  # random bits per layout
    assert not _gemm("nvfp4-h-dgrad").shares_weight(*shapes)  # Dgrad rotates w
    assert not _gemm("nvfp4-h-fprop").shares_weight(*shapes)  # Fprop rotates w
    assert not _gemm("nvfp4-rl").shares_weight(*shapes)  # four-over-six, dequantized backward
    row = recipes.get("fp8").replace(fprop_w=fl.nvfp4(scope="row"), dgrad_w=fl.nvfp4(scope="row"))
    assert not _gemm(row).shares_weight(*shapes)  # a per-row scale depends on the axis
    native = ("simulated", "native", "simulated")
    assert not _gemm("nvfp4", backends=native).shares_weight(*shapes)


@pytest.mark.parametrize("recipe", ["nvfp4", "fp8", "bf16"])
def test_the_shared_weight_is_the_one_dgrad_would_quantize_bit_for_bit(recipe):
    """The fact sharing rests on, checked on its own: w quantized along K and along N under a
    shared spec are the same array, NaN and zero blocks included."""
    r = recipes.get(recipe)
    w = jax.random.normal(jax.random.key(4), (64, 48)) * jnp.logspace(-3, 3, 48)[None, :]
    w = w.at[3, 5].set(jnp.nan).at[16:32, 16:32].set(0.0)
    along_k = fl.fake_quant(w, r.fprop_w.replace(axis=0))
    along_n = fl.fake_quant(w, r.dgrad_w.replace(axis=1))
    np.testing.assert_array_equal(along_k, along_n)


def _count_quantizers(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.params.get("name") == "_quantize_dequantize"
        for p in eqn.params.values():
            for sub in p if isinstance(p, tuple | list) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    n += _count_quantizers(inner)
    return n


def test_shared_weight_gradients_are_bit_identical_and_skip_one_quantizer(monkeypatch):
    from fp4lab.ops.dot_general import DotGemm

    x, w = _xw((32, 64), (64, 48))
    g = jax.random.normal(jax.random.key(3), (32, 48))
    key = jax.random.key(5)

    def grads(x, w, g):
        _, vjp = jax.vjp(lambda a, b: qdot_general(a, b, DN_2D, "nvfp4", key=key), x, w)
        return vjp(g)

    shared = jax.jit(grads)(x, w, g)
    n_shared = _count_quantizers(jax.make_jaxpr(grads)(x, w, g).jaxpr)
    monkeypatch.setattr(DotGemm, "shares_weight", lambda self, *shapes: False)
    jax.clear_caches()  # the scaffold's traces are cached per (gemm, shapes)
    apart = jax.jit(grads)(x, w, g)
    n_apart = _count_quantizers(jax.make_jaxpr(grads)(x, w, g).jaxpr)
    for a, b in zip(shared, apart, strict=True):
        np.testing.assert_array_equal(a, b)
    assert (n_shared, n_apart) == (5, 6)  # Fprop x, w; Dgrad dy (+ w apart); Wgrad x, dy


def test_telemetry_of_a_shared_weight_is_fprops_and_leaves_the_gradients_alone():
    """With the fused statistics Dgrad takes Fprop's w and its statistics: the same blocks of
    the same values as Dgrad's own quantization (counts exact, float sums to rounding)."""
    from fp4lab.core.stats import operand_stats
    from fp4lab.schema import BWD_OPERANDS, STATS

    x, w = _xw((32, 64), (64, 48))
    g = jax.random.normal(jax.random.key(3), (32, 48))
    key = jax.random.key(5)
    r = recipes.get("nvfp4")

    def f(x, w, probe):
        y, fstats = qdot_general(x, w, DN_2D, r, key=key, probe=probe)
        return jnp.sum(y * g), fstats

    probe = jnp.zeros((len(BWD_OPERANDS), len(STATS)))
    (dx, dw, bstats), fstats = jax.grad(f, (0, 1, 2), has_aux=True)(x, w, probe)
    np.testing.assert_array_equal(bstats[1], fstats[1])  # Dgrad's w row is Fprop's w row
    own = operand_stats(w.T[None], r.dgrad_w.replace(axis=1))[1]  # Dgrad's w on its own
    counts = [STATS.index(s) for s in ("flush", "saturated", "underflow", "map4")]
    np.testing.assert_array_equal(np.asarray(bstats[1])[counts], np.asarray(own)[counts])
    np.testing.assert_allclose(bstats[1], own, rtol=1e-6)
    plain = jax.grad(lambda x, w: jnp.sum(qdot_general(x, w, DN_2D, r, key=key) * g), (0, 1))
    for a, b in zip((dx, dw), plain(x, w), strict=True):
        np.testing.assert_array_equal(a, b)  # telemetry on or off: the same gradients
