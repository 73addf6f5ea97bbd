"""The training configuration: one frozen, validated, JSON-able value per run.

A `Config` says everything a run depends on except its seeds: the task, the model, the optimizer,
the precision (recipe, per-GEMM overrides, per-layer rules, phases), loss scaling, divergence
detection and the target loss. It is printable, comparable and hashable; `to_dict` gives plain
JSON, which the store hashes (with the seeds) into the run id.

Precision is written with recipe names or with values:

    recipe="nvfp4"                        every quantizable GEMM under NVFP4
    recipe=fl.GemmRecipe(...)             ... or under a recipe written out (its six specs)
    gemms={"wgrad": "bf16"}               ... except the weight-gradient GEMM, taken from bf16
    gemms={"dgrad_dy": fl.nvfp4(rounding="stochastic")}   ... or one operand, as a QuantSpec
    backward="dequantized"                override the recipe's backward mode
    rules=((r"lm_head", "bf16"),)         per-layer exceptions, first match wins, before ".*"
    phases=((0.9, "bf16"),)               from 90 % of the steps on, everything in bf16
    phases=((0.9, {"gemms": {"fprop": "bf16"}}),)   ... or only the forward GEMM
    phases=((1500, {"lr_scale": 0.5}),)   from step 1500 on, half the learning rate
    gemms={"norms": fl.mxfp4()}           the norm layers' scale and bias in MXFP4 too
    gemms={"outputs": fl.mxfp4()}         every GEMM's output (what GELU, the residual add read) too

A recipe (in `recipe`, `rules`, phases) is a name of `fp4lab.recipes.names()` or a GemmRecipe;
a `gemms` key is a GEMM ("wgrad": both operands) or an operand ("dgrad_dy"), its value a recipe
name or GemmRecipe (take its specs there), a QuantSpec or None (unquantized); operand keys
refine GEMM keys (`fp4lab.recipes.override`). `to_dict` writes recipes and specs as plain JSON
(`GemmRecipe.to_dict`, `QuantSpec.to_dict`), and the constructor reads that form back, so a run
record shows the numerics and its run id hashes them. A built-in recipe is written by its name,
exactly as before values were allowed (its runs keep their ids), and a value equal to a built-in
recipe is stored as that name (`recipes.builtin_name`): `recipe=fl.recipes.get("nvfp4")` is the
same run as `recipe="nvfp4"`. A name added with `fl.recipes.register` is stored as its value,
so the record reads back, and reruns, where the name is not registered.

Errors name the field, the bad value and what is allowed, and are raised when the config is
made (before anything runs).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from fp4lab import schema
from fp4lab.core import recipes
from fp4lab.core.recipes import GemmRecipe
from fp4lab.core.spec import QuantSpec
from fp4lab.core.stats import METHODS as STATS_METHODS
from fp4lab.schema import BACKENDS, RECORDED_BEFORE
from fp4lab.train.config_fields import (
    ConfigError,
    choice,
    coerce,
    gemms_field,
    recipe_field,
    rules_field,
)

__all__ = [
    "Config",
    "ConfigError",
    "TASKS",
    "OPTIMIZERS",
    "SCHEDULES",
    "LOSS_SCALING",
    "TARGET_ON",
    "make",
    "jsonable",
]

TASKS = ("markov", "teacher", "proxy", "text", "own")
ACTIVATIONS = ("gelu", "swiglu")  # proxy: the residual MLP's block
OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("constant", "cosine", "linear")
LOSS_SCALING = ("none", "static", "dynamic")
DTYPES = ("float32", "bfloat16", "float16")
# what tokens to target reads: "train" the training loss (under the run's recipe), "hp" the
# per-step held-out loss under a high-precision forward (the `loss_hp` series)
TARGET_ON = ("train", "hp")
_PHASE_KEYS = ("recipe", "gemms", "backward", "rules", "lr_scale")

_INT_1 = {"integer": True, "low": 1}
_INT_0 = {"integer": True, "low": 0}
_POSITIVE = {"low": 0, "low_open": True}
_UNIT = {"low": 0, "high": 1, "high_open": True}  # [0, 1)
# the range of every numeric field; Config() checks each with schema.check_number
_NUMBERS: dict[str, dict[str, Any]] = {
    "task_seed": _INT_0,
    "vocab": _INT_1,
    "branching": _INT_1,
    "alpha": _POSITIVE,
    "din": _INT_1,
    "dout": _INT_1,
    "outlier_channels": _INT_0,
    "outlier_scale": _POSITIVE,
    "d_model": _INT_1,
    "n_layers": _INT_1,
    "n_heads": _INT_1,
    "d_ff": _INT_1,
    "seq_len": _INT_1,
    "steps": _INT_1,
    "batch_size": _INT_1,
    "lr": _POSITIVE,
    "weight_decay": {"low": 0},
    "b1": _UNIT,
    "b2": _UNIT,
    "eps": _POSITIVE,
    "momentum": _UNIT,
    "warmup": _INT_0,
    "min_lr_ratio": {"low": 0, "high": 1},
    "clip_norm": {"low": 0},
    "loss_scale": _POSITIVE,
    "growth_interval": _INT_1,
    "telemetry_every": _INT_0,
    "noise_keys": _INT_0,
    "eval_batches": _INT_0,
    "z_loss": {"low": 0},
    "spike_factor": {"low": 1, "low_open": True},
    "spike_window": _INT_1,
    "target_loss": {**_POSITIVE, "optional": True},
    "target_gap": {**_POSITIVE, "optional": True},
    "target_window": _INT_1,
    "seed_batch": _INT_1,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """Everything a training run depends on except its seeds."""

    # task (its own seed fixes the task itself, e.g. the Markov chain; streams do not touch it)
    # "markov" | "teacher" | "proxy" (Su et al.'s residual MLP on the teacher) | "text" | "own"
    task: str = "markov"  # (own: your model, fp4lab.train.own)
    task_file: str = ""  # own: the file of model, loss and batch ("python:<hash>": registered)
    task_args: tuple[tuple[str, Any], ...] = ()  # own: your parameters, {name: JSON value}
    task_seed: int = 0  # seeds the Markov chain or the teacher network
    vocab: int = 32  # markov: number of tokens
    order: int = 1  # markov: tokens of context (1 or 2)
    branching: int = 4  # markov: allowed next tokens per context
    alpha: float = 1.0  # markov: Dirichlet concentration of each row
    text_path: str = ""  # text: the file to train on (characters are tokens)
    din: int = 64  # teacher: input width
    dout: int = 16  # teacher: output width
    teacher_hidden: tuple[int, ...] = (64,)  # teacher: hidden widths
    outlier_channels: int = 0  # teacher: this many input channels scaled by outlier_scale
    outlier_scale: float = 10.0  # teacher: the outlier factor
    # model (markov/text: the Llama-style Transformer; teacher: the MLP; proxy: the
    # pre-LayerNorm residual MLP, d_model wide, n_layers blocks of hidden width d_ff)
    d_model: int = 64  # residual width
    n_layers: int = 2  # blocks
    n_heads: int = 4  # attention heads
    d_ff: int = 128  # SwiGLU width
    hidden: tuple[int, ...] = (128, 128)  # MLP hidden widths
    seq_len: int = 32  # tokens per sequence
    dtype: str = "float32"  # model compute dtype (parameters stay float32)
    scan_layers: bool = False  # markov/text: the blocks under nnx.scan (compile once per block)
    qk_norm: bool = False  # markov/text: RMSNorm on each head's queries and keys (qk-layernorm)
    z_loss: float = 0.0  # markov/text: + z_loss * mean(logsumexp(logits)^2) in the training loss
    activation: str = "gelu"  # proxy: "gelu" or "swiglu" blocks
    # optimization
    steps: int = 200  # optimizer steps
    batch_size: int = 16  # sequences (or examples) per step
    optimizer: str = "adamw"  # "adamw" | "sgd" (with momentum)
    lr: float = 3e-3  # peak learning rate
    weight_decay: float = 0.0  # decoupled weight decay (adamw)
    b1: float = 0.9  # adamw beta1
    b2: float = 0.95  # adamw beta2
    eps: float = 1e-8  # adamw epsilon
    momentum: float = 0.9  # sgd momentum
    schedule: str = "cosine"  # "constant" | "cosine" | "linear" decay after warmup
    warmup: int = 10  # linear warmup steps
    min_lr_ratio: float = 0.1  # final lr / peak lr for cosine and linear
    clip_norm: float = 1.0  # global-norm gradient clipping (0: off)
    # precision
    recipe: str | GemmRecipe = "fp32"  # every quantizable GEMM: a recipe name or a GemmRecipe
    gemms: tuple[tuple[str, Any], ...] = ()  # per-GEMM / per-operand overrides: {"wgrad": "bf16"}
    backward: str = ""  # override the recipe's backward mode ("" keeps it)
    pad: bool = False  # every quantized operand zero-padded to whole blocks (QuantSpec.pad)
    rules: tuple[tuple[str, Any], ...] = ()  # (path regex, recipe or None), before ".*"
    phases: tuple[tuple[float, Any], ...] = ()  # (start step or fraction, recipe or overrides)
    backend: str = "simulated"  # forward GEMMs: "simulated" | "native" | "auto"
    loss_scaling: str = "none"  # "none" | "static" | "dynamic" (grow / back off on overflow)
    loss_scale: float = 2.0**15  # static scale, or the initial dynamic one
    growth_interval: int = 100  # dynamic: finite steps before the scale doubles
    # measurement
    telemetry_every: int = 0  # operand statistics every k steps (0: off)
    # cheap per-step signals of instability, every step, no shadow (`fp4lab.train.signals`):
    # the update-to-weight ratio and the norm layers' largest scale (series beside grad_norm)
    signals: bool = False
    shadow: bool = False  # with telemetry: also the high-precision shadow (grad/, acc/ metrics)
    # with the shadow: 0 (off) or K >= 2 more draws of the quantization keys at each logged step
    # (K more quantized backward passes there), whose spread splits the gradient's noise into
    # grad/<layer>/noise_zm = sqrt(sum_k ||g^(k) - gbar||^2 / (K - 1)) (the zero-mean part),
    # noise_bias = sqrt(max(||gbar - g||^2 - noise_zm^2 / K, 0)) and gnr_zm = ||g|| / noise_zm
    # (fp4lab.nnx.noise; the norms in the loss's units, the loss scale divided out)
    noise_keys: int = 0
    # how the operand statistics are computed (fp4lab.core.stats): "fused" (one pass, float64
    # sums) or "reference" (the jnp formulas: what runs recorded before "fused" existed)
    telemetry_stats: str = "fused"
    eval_batches: int = 8  # held-out batches at the end (0: final loss = last 10 % of train)
    spike_factor: float = 5.0  # divergence: loss above this many times the first loss or the
    spike_window: int = 20  # ... median of the last this many steps (fp4lab.train.divergence)
    stop_on_divergence: bool = False  # freeze the run at its first divergence (else carry on)
    target_loss: float | None = None  # tokens-to-target threshold on the smoothed loss ...
    target_gap: float | None = None  # ... or this far above the task's floor
    target_window: int = 10  # steps averaged for the smoothed loss
    # the loss it smooths: "train" the training loss, under the run's recipe; "hp" the loss of
    # the step's weights on the step's batch, before they learn from it, under a high-precision
    # forward (the `loss_hp` series; held out wherever the task draws a fresh batch each step,
    # as the synthetic tasks do): an eval_hp at every step, one batch each, one more forward
    target_on: str = "train"
    # execution
    seed_batch: int = 4  # seeds per compiled call at most (fp4lab.sweep.compute)
    # how a seed's bits are kept independent of the seeds that share its call
    # (fp4lab.sweep.compute). False: on the CPU, the seeds of a call run one after the other
    # (lax.map) in one program, each as jit(make_train(config)) computes it alone, and a call
    # is only as wide as its seeds (a 1-seed run computes one seed). True: every call is vmapped
    # and seed_batch wide, padded with copies of its first seed: how the runs recorded before
    # this field were computed (`RECORDED_BEFORE`). Off the CPU, calls are vmapped and padded
    # either way.
    pad_seeds: bool = False

    def __post_init__(self):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, coerce(f.name, getattr(self, f.name), f.default))
        choice("task", self.task, TASKS)
        choice("optimizer", self.optimizer, OPTIMIZERS)
        choice("schedule", self.schedule, SCHEDULES)
        choice("loss_scaling", self.loss_scaling, LOSS_SCALING)
        choice("dtype", self.dtype, DTYPES)
        choice("backend", self.backend, BACKENDS)
        choice("telemetry_stats", self.telemetry_stats, STATS_METHODS)
        choice("target_on", self.target_on, TARGET_ON)
        choice("activation", self.activation, ACTIVATIONS)
        for name, rule in _NUMBERS.items():
            schema.check_number("Config", name, getattr(self, name), error=ConfigError, **rule)
        for name in ("hidden", "teacher_hidden"):
            widths = getattr(self, name)
            if not widths or any(
                isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths
            ):
                raise ConfigError(f"Config.{name}={widths!r}; allowed: a tuple of ints >= 1")
        if self.order not in (1, 2):
            raise ConfigError(f"Config.order={self.order!r}; allowed: 1, 2")
        if self.task == "text" and not self.text_path:
            raise ConfigError("Config.text_path is empty; the text task needs a file")
        if self.task == "markov" and self.branching > self.vocab:
            raise ConfigError(f"Config.branching={self.branching} > vocab={self.vocab}")
        if self.task == "own" and not self.task_file:
            raise ConfigError("Config.task_file is empty; task='own' needs the file of its model")
        if self.task != "own" and (self.task_file or self.task_args):
            raise ConfigError(f"Config.task={self.task!r} takes no task_file or task_args")
        for name, value in self.task_args:
            if not isinstance(name, str) or not isinstance(value, str | int | float | None):
                raise ConfigError(
                    f"Config.task_args[{name!r}]={value!r}; allowed: str, int, float, bool, None"
                )
        if self.task not in ("markov", "text") and (self.qk_norm or self.z_loss):
            raise ConfigError(
                f"Config.qk_norm / z_loss are options of the language model (task 'markov' or "
                f"'text'), not of task={self.task!r}"
            )
        if self.task in ("markov", "text") and self.d_model % self.n_heads:
            raise ConfigError(
                f"Config.n_heads={self.n_heads}; allowed: a divisor of d_model={self.d_model}"
            )
        if self.outlier_channels > self.din:
            raise ConfigError(f"Config.outlier_channels={self.outlier_channels} > din={self.din}")
        if self.shadow and not self.telemetry_every:
            raise ConfigError("Config.shadow=True needs telemetry_every >= 1")
        if self.noise_keys == 1:
            raise ConfigError(
                "Config.noise_keys=1; allowed: 0 (off) or an int >= 2 (the spread of the draws "
                "needs two)"
            )
        if self.noise_keys and not self.shadow:
            raise ConfigError(
                f"Config.noise_keys={self.noise_keys} needs shadow=True (and telemetry_every >= "
                "1): the draws are compared with the shadow's exact gradient"
            )
        if self.target_loss is not None and self.target_gap is not None:
            raise ConfigError("Config.target_loss and Config.target_gap: set at most one")
        object.__setattr__(self, "recipe", recipe_field("recipe", self.recipe))
        object.__setattr__(self, "gemms", gemms_field("gemms", self.gemms))
        if self.backward:
            choice("backward", self.backward, schema.BACKWARD_MODES)
        object.__setattr__(self, "rules", rules_field("rules", self.rules))
        object.__setattr__(self, "phases", self._check_phases(self.phases))
        for i, (_, state) in enumerate(self.precision()):  # GEMMs with two Hadamards, ...
            try:
                recipes.override(recipes.get(state["recipe"]), state["gemms"])
            except ValueError as e:
                where = "recipe and gemms" if i == 0 else f"phases[{i - 1}]"
                raise ConfigError(f"Config.{where}: {e}") from e

    def _check_phases(self, phases) -> tuple:
        out = []
        for i, item in enumerate(phases):
            if not isinstance(item, list | tuple) or len(item) != 2:
                raise ConfigError(f"Config.phases[{i}]={item!r}; allowed: (start, recipe or dict)")
            start, change = item
            if (
                isinstance(start, bool)
                or not isinstance(start, int | float)
                or not (0 < start < 1 or (start >= 1 and float(start).is_integer()))
            ):
                raise ConfigError(
                    f"Config.phases[{i}] start={start!r}; allowed: a step (a whole number >= 1) "
                    "or a fraction of the steps in (0, 1)"
                )
            if isinstance(change, str | GemmRecipe):
                change = {"recipe": change}
            elif isinstance(change, list | tuple):  # the stored form: (key, value) pairs
                change = dict(change)
            if not isinstance(change, dict):
                raise ConfigError(
                    f"Config.phases[{i}] change={change!r}; allowed: a recipe name, a GemmRecipe "
                    "or a dict of changes"
                )
            bad = sorted(set(change) - set(_PHASE_KEYS))
            if bad:
                raise ConfigError(
                    f"Config.phases[{i}] has unknown keys {bad}; allowed: {', '.join(_PHASE_KEYS)}"
                )
            change = dict(change)
            if "recipe" in change:
                change["recipe"] = recipe_field(f"phases[{i}].recipe", change["recipe"])
            if "backward" in change:
                choice(f"phases[{i}].backward", change["backward"], schema.BACKWARD_MODES)
            if "gemms" in change:
                change["gemms"] = gemms_field(f"phases[{i}].gemms", change["gemms"])
            if "rules" in change:
                change["rules"] = rules_field(f"phases[{i}].rules", change["rules"])
            if "lr_scale" in change:
                lr_scale = change["lr_scale"]
                if isinstance(lr_scale, int) and not isinstance(lr_scale, bool):
                    change["lr_scale"] = lr_scale = float(lr_scale)
                if not isinstance(lr_scale, float) or not 0 < lr_scale < float("inf"):
                    raise ConfigError(
                        f"Config.phases[{i}] lr_scale={lr_scale!r}; allowed: a number > 0 (the "
                        "factor on the learning rate from the phase's start)"
                    )
            out.append((start, tuple(sorted(change.items()))))
        starts = [self.phase_start(s) for s, _ in out]
        if starts != sorted(set(starts)) or any(not 1 <= s < self.steps for s in starts):
            raise ConfigError(
                f"Config.phases starts {starts} (in steps): must increase and be < steps="
                f"{self.steps} (and >= 1)"
            )
        return tuple(out)

    def phase_start(self, start: float) -> int:
        """A phase start in steps (a fraction in (0, 1) is a share of `steps`)."""
        return int(round(start * self.steps)) if start < 1 else int(start)

    def precision(self) -> list[tuple[int, dict[str, Any]]]:
        """[(start step, {"recipe", "gemms", "backward", "rules"})] of every precision phase,
        the first at step 0. A phase given as a bare recipe switches the whole model (its
        overrides and rules dropped); a dict of changes keeps what it does not change."""
        state = {"recipe": self.recipe, "gemms": self.gemms, "backward": self.backward}
        state["rules"] = self.rules
        out = [(0, dict(state))]
        for start, change in self.phases:
            change = {k: v for k, v in change if k != "lr_scale"}
            if set(change) == {"recipe"}:  # a bare recipe: the whole model switches
                state = {"recipe": change["recipe"], "gemms": (), "backward": "", "rules": ()}
            else:
                state = state | change
            out.append((self.phase_start(start), dict(state)))
        return out

    def lr_scales(self) -> list[tuple[int, float]]:
        """[(start step, factor on the learning rate)] from the phases' `lr_scale` (a factor
        holds until a later phase sets another); [] when no phase sets one."""
        out, factor = [], 1.0
        for start, change in self.phases:
            factor = dict(change).get("lr_scale", factor)
            out.append((self.phase_start(start), factor))
        return out if any(dict(c).get("lr_scale") is not None for _, c in self.phases) else []

    def replace(self, **changes) -> Config:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields (`jsonable`: tuples become lists, recipe and spec values their
        dicts, names stay names): what the store hashes into the run id. `from_dict` inverts
        it."""
        return jsonable({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Config:
        """The config `to_dict` wrote (a run record's "config"); a field that a record made
        before the field existed lacks takes the value it was made with
        (`fp4lab.schema.RECORDED_BEFORE`)."""
        return make(RECORDED_BEFORE | d)


def jsonable(value: Any) -> Any:
    """A config value as plain JSON: tuples become lists, a GemmRecipe or QuantSpec its
    `to_dict` (which the config's constructor reads back)."""
    return json.loads(json.dumps(value, default=_jsonable))


def _jsonable(value):
    if isinstance(value, GemmRecipe | QuantSpec):
        return value.to_dict()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON-able: {value!r}")


def fields() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(Config))


def make(overrides: dict[str, Any] | None = None, base: Config | None = None) -> Config:
    """`base` (default Config()) with `overrides`; unknown names raise with the allowed ones."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(fields()))
    if unknown:
        hints = "".join(schema.did_you_mean(u, fields()) for u in unknown)
        raise ConfigError(f"unknown config fields {unknown}; allowed: {', '.join(fields())}{hints}")
    base = base or Config()
    return dataclasses.replace(base, **overrides)
