"""A tour in one command (`fp4lab demo`): formats, a quantized model, telemetry.

1. Quantizes one Gaussian and one heavy-tailed tensor with every named format and prints the
   error table (relative error, bias, flush and saturation fractions).
2. Puts a tiny Llama-style LM under per-layer rules and prints `describe`.
3. Trains it a few steps on a synthetic Markov language with telemetry on and prints the head
   of the tidy telemetry frame and the per-GEMM mean relative error.
"""

from __future__ import annotations

import jax
import optax
import pandas as pd
from flax import nnx

from fp4lab.analysis import to_frame
from fp4lab.core.hadamard import Hadamard
from fp4lab.core.spec import cast_spec, fp8, mxfp4, mxfp8, nvfp4
from fp4lab.core.stats import operand_stats
from fp4lab.data import MarkovLM
from fp4lab.models import Transformer, TransformerConfig
from fp4lab.nnx import telemetry
from fp4lab.nnx.rules import Rule, describe, quantize_model
from fp4lab.schema import STATS

FORMATS = {
    "nvfp4": nvfp4(),
    "nvfp4 16x16": nvfp4(tile=(16, 16)),
    "nvfp4 row": nvfp4(scope="row"),
    "nvfp4 4/6 mae": nvfp4(four_over_six="mae"),
    "nvfp4 jax": nvfp4(convention="jax"),
    "nvfp4 +H16": nvfp4(transform=Hadamard(16)),
    "mxfp4 floor": mxfp4(),
    "mxfp4 ceil": mxfp4(scale_rounding="ceil"),
    "mxfp4 +H32": mxfp4(transform=Hadamard(32)),
    "mxfp8": mxfp8(),
    "fp8 e4m3": fp8("e4m3"),
    "fp8 e5m2": fp8("e5m2"),
    "bf16": cast_spec("bf16"),
}


def format_table(shape=(256, 1024), seed: int = 0) -> pd.DataFrame:
    """Error statistics of every named format on Gaussian and Student-t (df=3) data."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    data = {"gaussian": jax.random.normal(k1, shape), "student-t3": jax.random.t(k2, 3.0, shape)}
    rows = []
    for fmt_name, spec in FORMATS.items():
        for data_name, x in data.items():
            _, s = operand_stats(x, spec)
            rows.append(
                {"format": fmt_name, "data": data_name}
                | {k: float(v) for k, v in zip(STATS, s, strict=True)}
            )
    return pd.DataFrame(rows)


def _lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def model_tour(steps: int = 3, seed: int = 0):
    """(describe table, tidy telemetry frame, losses) of a tiny LM trained a few steps."""
    lang = MarkovLM(vocab=64, order=1, branching=4, seed=seed)
    cfg = TransformerConfig(vocab=64, d_model=64, n_layers=2, n_heads=2, d_ff=128, max_len=32)
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    rules = [Rule(r"lm_head", None), Rule(r"blocks\.1\..*", "bf16"), Rule(r".*", "nvfp4")]
    quantize_model(model, rules, key=jax.random.key(seed), telemetry=True)
    table = describe(model)
    opt = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, tokens):
        loss, grads, metrics = telemetry.value_and_grad(_lm_loss)(model, tokens)
        opt.update(model, grads)
        return loss, metrics

    frames, losses = [], []
    for i in range(steps):
        tokens = lang.sample(jax.random.fold_in(jax.random.key(seed), i), 16, 32)
        loss, metrics = step(model, opt, tokens)
        losses.append(float(loss))
        frames.append(to_frame(metrics, step=i))
    return table, pd.concat(frames, ignore_index=True), losses


def main() -> int:
    pd.set_option("display.width", 120)
    print("== error of every named format (256 x 1024 tensors) ==")
    print(format_table().to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    table, frame, losses = model_tour()
    print("\n== fp4lab.describe(model) ==")
    print(table.to_string(index=False))
    print("\n== 3 training steps with telemetry: losses", [round(v, 4) for v in losses])
    print(frame.head(8).to_string(index=False))
    rel = frame[frame.stat == "rel_err"].groupby(["gemm", "operand"]).value.mean()
    print("\nmean relative error per GEMM operand:\n" + rel.to_string())
    return 0
