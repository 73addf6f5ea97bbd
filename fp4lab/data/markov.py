"""A synthetic language: a seeded sparse Markov chain of order 1 or 2 over `vocab` tokens.

Each context c (the previous `order` tokens, indexed c = t_1 * V + t_2 for order 2) allows
`branching` = k distinct next tokens, drawn uniformly without replacement, with probabilities
drawn from a symmetric Dirichlet(alpha). Everything is built in numpy from `seed`.

The entropy rate is exact (float64):
    H = -sum_c pi(c) sum_t P(t | c) log P(t | c)        [nats per token]
with pi the stationary distribution of the context chain. Sequences start from pi, so every
transition is distributed as (c ~ pi, t ~ P(. | c)) and the expected next-token loss of the true
model is H at every position that has `order` tokens of context. A language model that sees the
whole prefix can reach H at those positions and no lower: H is the optimum of the training loss.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["MarkovLM", "stationary_distribution"]


def stationary_distribution(
    next_CxK: np.ndarray, prob_CxK: np.ndarray, vocab: int, order: int, *, tol: float = 1e-13
) -> np.ndarray:
    """Stationary distribution pi of the context chain, by lazy power iteration in float64.

    The context chain moves c = (.., t_last) -> (t_last.., t) with probability P(t | c). The
    lazy step pi <- (pi + pi P) / 2 has the same fixed points as pi P = pi and converges for
    periodic chains too; starting from the uniform distribution, it returns a stationary
    distribution even where the chain is reducible.

    Args:
      next_CxK: allowed next tokens of each of the C = vocab**order contexts.
      prob_CxK: their probabilities (rows sum to 1).
      vocab: number of tokens V.
      order: 1 or 2.
      tol: stop when the L1 change of one step falls below tol (or below float64 rounding
        noise, 4 C eps, for large chains).
    Returns:
      pi_C, float64, sums to 1.
    Raises:
      RuntimeError: if the iteration has not converged after 200_000 steps.
    """
    C = vocab**order
    # successor context of (c, j): drop the oldest token, append next_CxK[c, j]
    succ_CxK = (np.arange(C)[:, None] * vocab) % C + next_CxK
    pi_C = np.full(C, 1.0 / C)
    tol = max(tol, 4 * C * np.finfo(np.float64).eps)
    for _ in range(200_000):
        step_C = np.bincount(
            succ_CxK.ravel(), weights=(pi_C[:, None] * prob_CxK).ravel(), minlength=C
        )
        new_C = 0.5 * (pi_C + step_C)
        new_C /= new_C.sum()
        if np.abs(new_C - pi_C).sum() < tol:
            return new_C
        pi_C = new_C
    raise RuntimeError("stationary_distribution: power iteration did not converge")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MarkovLM:
    """A sparse Markov language (hashable on its fields: usable as a static jit argument).

    Attributes (derived, numpy): next_CxK (int32), prob_CxK (float64), pi_C (float64).
    """

    vocab: int  # number of tokens V
    order: int = 1  # tokens of context: 1 or 2
    branching: int = 4  # k: allowed next tokens per context, 1 <= k <= vocab
    seed: int = 0  # seeds the support and the probabilities
    alpha: float = 1.0  # Dirichlet concentration of each row (smaller: peakier rows)

    next_CxK: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)
    prob_CxK: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)
    pi_C: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if not isinstance(self.vocab, int) or self.vocab < 2:
            raise ValueError(f"MarkovLM.vocab={self.vocab!r}; must be an int >= 2")
        if self.order not in (1, 2):
            raise ValueError(f"MarkovLM.order={self.order!r}; allowed: 1, 2")
        if not isinstance(self.branching, int) or not 1 <= self.branching <= self.vocab:
            raise ValueError(
                f"MarkovLM.branching={self.branching!r}; must be an int in [1, vocab={self.vocab}]"
            )
        if not self.alpha > 0:
            raise ValueError(f"MarkovLM.alpha={self.alpha!r}; must be > 0")
        rng = np.random.default_rng(self.seed)
        C, K = self.vocab**self.order, self.branching
        # k distinct tokens per row: the k smallest of V uniform draws (a uniform k-subset),
        # in chunks of rows to bound memory for large order-2 vocabularies
        next_CxK = np.empty((C, K), np.int32)
        for lo in range(0, C, 4096):
            u = rng.random((min(C - lo, 4096), self.vocab))
            next_CxK[lo : lo + 4096] = np.argpartition(u, K - 1, axis=1)[:, :K]
        prob_CxK = rng.dirichlet(np.full(K, float(self.alpha)), size=C)
        prob_CxK /= prob_CxK.sum(axis=1, keepdims=True)
        pi_C = stationary_distribution(next_CxK, prob_CxK, self.vocab, self.order)
        for name, value in (("next_CxK", next_CxK), ("prob_CxK", prob_CxK), ("pi_C", pi_C)):
            value.setflags(write=False)
            object.__setattr__(self, name, value)

    @property
    def n_contexts(self) -> int:
        return self.vocab**self.order

    @property
    def table(self) -> np.ndarray:
        """Dense transition table P[c, t] = P(t | c), float64, shape (vocab**order, vocab)."""
        P_CxV = np.zeros((self.n_contexts, self.vocab))
        np.put_along_axis(P_CxV, self.next_CxK.astype(np.int64), self.prob_CxK, axis=1)
        return P_CxV

    @property
    def entropy_rate(self) -> float:
        """H = -sum_c pi(c) sum_t P(t|c) log P(t|c), nats per token (float64)."""
        p = self.prob_CxK
        h_C = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=1)
        return float(np.dot(self.pi_C, h_C))

    def sample(self, key: jax.Array, batch: int, length: int) -> jax.Array:
        """`batch` independent sequences of `length` tokens, started from the stationary law.

        The first `order` tokens are the context c_0 ~ pi; then t ~ P(. | c) in a lax.scan.
        Pure jax: jit-able (batch and length static) and vmap-able over keys.

        Args:
          key: PRNG key (the data stream).
          batch: number of sequences B.
          length: tokens per sequence T >= order.
        Returns:
          tokens_BxT, int32.
        """
        if length < self.order:
            raise ValueError(f"length={length} must be >= order={self.order}")
        V, C = self.vocab, self.n_contexts
        next_CxK = jnp.asarray(self.next_CxK)
        with np.errstate(divide="ignore"):  # zero probabilities become -inf logits
            logp_CxK = jnp.asarray(np.log(self.prob_CxK), dtype=jnp.float32)
            logpi_C = jnp.asarray(np.log(self.pi_C), dtype=jnp.float32)
        key0, key_steps = jax.random.split(key)
        c_B = jax.random.categorical(key0, logpi_C, shape=(batch,)).astype(jnp.int32)

        def step(c_B, key_t):
            j_B = jax.random.categorical(key_t, logp_CxK[c_B], axis=-1)
            t_B = jnp.take_along_axis(next_CxK[c_B], j_B[:, None], axis=1)[:, 0]
            return (c_B * V) % C + t_B, t_B

        _, tail_TxB = jax.lax.scan(step, c_B, jax.random.split(key_steps, length - self.order))
        if self.order == 1:
            head_BxO = c_B[:, None]
        else:
            head_BxO = jnp.stack([c_B // V, c_B % V], axis=1)
        return jnp.concatenate([head_BxO, tail_TxB.T.astype(jnp.int32)], axis=1)

    def nll(self, tokens_BxT: jax.Array) -> jax.Array:
        """-log P(t | c) of every transition of `tokens_BxT` under the true chain.

        Its mean over sampled sequences estimates `entropy_rate`; against a model's loss at the
        same positions it gives the excess loss. Transitions outside the support give +inf.

        Returns:
          nll_BxS with S = T - order, float32.
        """
        V = self.vocab
        next_CxK = jnp.asarray(self.next_CxK)
        with np.errstate(divide="ignore"):
            logp_CxK = jnp.asarray(np.log(self.prob_CxK), dtype=jnp.float32)
        t = tokens_BxT.astype(jnp.int32)
        c_BxS = t[:, :-1] if self.order == 1 else t[:, :-2] * V + t[:, 1:-1]
        hit_BxSxK = next_CxK[c_BxS] == t[:, self.order :, None]
        return -jnp.max(jnp.where(hit_BxSxK, logp_CxK[c_BxS], -jnp.inf), axis=-1)
