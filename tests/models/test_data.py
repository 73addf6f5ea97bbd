"""Synthetic data: Markov entropy rate against Monte Carlo, teacher exactness, char round trips."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lab.data import CharDataset, MarkovLM, Teacher

# MarkovLM is a hashable value, so it can be a static argument: one compile per (chain, shape).
_sample = jax.jit(MarkovLM.sample, static_argnums=(0, 2, 3))

# --- Markov language ------------------------------------------------------------------------


@pytest.mark.parametrize("order", [1, 2])
def test_markov_table_rows_are_distributions_with_k_support(order):
    m = MarkovLM(vocab=12, order=order, branching=3, seed=0)
    P = m.table
    assert P.shape == (12**order, 12)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    assert ((P > 0).sum(axis=1) == 3).all() and (P >= 0).all()


def _context_matrix(m):
    """Dense context-to-context transition matrix, built independently of the library."""
    V, C, P = m.vocab, m.n_contexts, m.table
    M = np.zeros((C, C))
    for c in range(C):
        for t in range(V):
            M[c, (c * V) % C + t] += P[c, t]
    return M


@pytest.mark.parametrize("order", [1, 2])
def test_markov_stationary_distribution_and_entropy_rate(order):
    m = MarkovLM(vocab=6, order=order, branching=2, seed=3)
    M = _context_matrix(m)
    np.testing.assert_allclose(m.pi_C @ M, m.pi_C, atol=1e-12)
    assert abs(m.pi_C.sum() - 1.0) < 1e-12
    with np.errstate(divide="ignore", invalid="ignore"):
        h_C = -np.nansum(m.table * np.log(m.table), axis=1)
    assert m.entropy_rate == pytest.approx(float(m.pi_C @ h_C), abs=1e-12)
    assert 0.0 < m.entropy_rate <= np.log(2) + 1e-12


@pytest.mark.parametrize("order", [1, 2])
def test_markov_entropy_rate_matches_monte_carlo(order):
    m = MarkovLM(vocab=16, order=order, branching=4, seed=1, alpha=0.5)
    tokens = _sample(m, jax.random.key(7), 256, 256)
    nll = np.asarray(m.nll(tokens), np.float64)
    assert np.isfinite(nll).all()  # every sampled transition is in the support
    per_sequence = nll.mean(axis=1)  # independent sequences: iid estimates
    estimate = per_sequence.mean()
    stderr = per_sequence.std(ddof=1) / np.sqrt(per_sequence.size)
    assert abs(estimate - m.entropy_rate) < 4 * stderr, (estimate, m.entropy_rate, stderr)
    # a transition outside the support has infinite loss; one inside has -log P(t | c)
    context, c = ([3], 3) if order == 1 else ([3, 3], 3 * 16 + 3)
    outside = next(t for t in range(16) if t not in set(m.next_CxK[c].tolist()))
    inside = int(m.next_CxK[c, 0])
    nll_2x1 = np.asarray(m.nll(jnp.array([context + [outside], context + [inside]], jnp.int32)))
    assert nll_2x1.shape == (2, 1) and nll_2x1[0, 0] == np.inf
    assert nll_2x1[1, 0] == pytest.approx(-np.log(m.table[c, inside]), rel=1e-6)


def test_markov_sampling_is_keyed():
    m = MarkovLM(vocab=16, order=2, branching=4, seed=1, alpha=0.5)  # as in the test above
    a = _sample(m, jax.random.key(0), 256, 256)
    assert a.shape == (256, 256) and a.dtype == jnp.int32
    assert int(a.min()) >= 0 and int(a.max()) < 16
    np.testing.assert_array_equal(a, _sample(m, jax.random.key(0), 256, 256))
    assert not np.array_equal(a, _sample(m, jax.random.key(1), 256, 256))
    keys = jnp.stack([jax.random.key(0), jax.random.key(1)])
    batched = jax.jit(jax.vmap(lambda k: m.sample(k, 4, 8)))(keys)
    np.testing.assert_array_equal(batched[0], m.sample(jax.random.key(0), 4, 8))  # no-jit


def test_markov_is_a_hashable_value():
    a, b = MarkovLM(vocab=8, seed=4), MarkovLM(vocab=8, seed=4)
    assert a == b and hash(a) == hash(b)
    np.testing.assert_array_equal(a.table, b.table)
    assert not np.array_equal(a.table, MarkovLM(vocab=8, seed=5).table)


@pytest.mark.parametrize(
    "kwargs, field",
    [(dict(order=3), "order"), (dict(branching=9), "branching"), (dict(alpha=0.0), "alpha")],
)
def test_markov_validation_names_field(kwargs, field):
    with pytest.raises(ValueError, match=f"MarkovLM.{field}"):
        MarkovLM(vocab=8, **kwargs)


# --- teacher-student ------------------------------------------------------------------------


def test_teacher_targets_are_exact():
    t = Teacher(din=8, dout=3, hidden=(16, 16), seed=0)
    x, y = t.sample(jax.random.key(0), 32)
    assert x.shape == (32, 8) and y.shape == (32, 3)
    np.testing.assert_array_equal(y, t(x))
    # an independent numpy forward pass
    h = np.asarray(x)
    for i, (w, b) in enumerate(zip(t.weights, t.biases, strict=True)):
        h = h @ w + b
        h = np.tanh(h) if i < len(t.weights) - 1 else h
    np.testing.assert_allclose(y, h, rtol=1e-5, atol=1e-5)


def test_teacher_outlier_channels_are_scaled():
    key = jax.random.key(3)
    plain = Teacher(din=8, dout=2, seed=0)
    outl = Teacher(din=8, dout=2, seed=0, outlier_channels=(1, 6), outlier_scale=20.0)
    x0, _ = plain.sample(key, 64)
    x1, y1 = outl.sample(key, 64)
    np.testing.assert_array_equal(x1[:, (1, 6)], x0[:, (1, 6)] * 20.0)
    np.testing.assert_array_equal(x1[:, (0, 2, 3, 4, 5, 7)], x0[:, (0, 2, 3, 4, 5, 7)])
    np.testing.assert_array_equal(y1, outl(x1))


def test_teacher_weights_follow_seed():
    a, b = Teacher(din=4, dout=2, seed=0), Teacher(din=4, dout=2, seed=1)
    np.testing.assert_array_equal(a.weights[0], Teacher(din=4, dout=2, seed=0).weights[0])
    assert not np.array_equal(a.weights[0], b.weights[0])
    with pytest.raises(ValueError, match="Teacher.outlier_channels"):
        Teacher(din=4, dout=2, outlier_channels=(4,))


# --- character text -------------------------------------------------------------------------

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"


def test_char_dataset_round_trips(tmp_path):
    ds = CharDataset.from_text(TEXT)
    assert ds.vocab_size == len(set(TEXT)) and list(ds.chars) == sorted(set(TEXT))
    assert ds.decode(ds.encode(TEXT)) == TEXT
    assert ds.decode(ds.data) == TEXT
    path = tmp_path / "t.txt"
    path.write_text(TEXT, encoding="utf-8")
    from_file = CharDataset.from_file(path)
    assert from_file.chars == ds.chars
    np.testing.assert_array_equal(from_file.data, ds.data)
    with pytest.raises(KeyError, match="vocabulary"):
        ds.encode("Z")


def test_char_dataset_samples_windows():
    ds = CharDataset.from_text(TEXT)
    w = ds.sample(jax.random.key(0), 8, 10)
    assert w.shape == (8, 10) and w.dtype == jnp.int32
    for row in np.asarray(w):
        assert ds.decode(row) in TEXT
    np.testing.assert_array_equal(w, ds.sample(jax.random.key(0), 8, 10))
    assert not np.array_equal(w, ds.sample(jax.random.key(1), 8, 10))
    full = ds.sample(jax.random.key(0), 2, len(ds))
    assert ds.decode(full[0]) == TEXT
    with pytest.raises(ValueError, match="length"):
        ds.sample(jax.random.key(0), 2, len(ds) + 1)
    train, val = ds.split(0.75)
    assert train.chars == ds.chars and len(train) + len(val) == len(ds)
