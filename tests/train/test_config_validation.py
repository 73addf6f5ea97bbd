"""Every numeric field of Config is checked for type, finiteness and range; misspelled names get
a "did you mean" hint."""

import math

import pytest

from fp4lab import schema
from fp4lab.train import make_train
from fp4lab.train.config import Config, ConfigError, make


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(b1=2.0), "Config.b1=2.0; allowed: a float >= 0 and < 1"),
        (dict(b2=1.0), "Config.b2=1.0; allowed: a float >= 0 and < 1"),
        (dict(clip_norm=-1.0), "Config.clip_norm=-1.0; allowed: a float >= 0"),
        (dict(weight_decay=-5.0), "Config.weight_decay=-5.0; allowed: a float >= 0"),
        (dict(eps=0.0), "Config.eps=0.0; allowed: a float > 0"),
        (dict(momentum=-0.1), "Config.momentum=-0.1; allowed: a float >= 0 and < 1"),
        (dict(min_lr_ratio=1.5), "Config.min_lr_ratio=1.5; allowed: a float >= 0 and <= 1"),
        (dict(lr=math.nan), "Config.lr=nan; allowed: a float > 0"),
        (dict(lr=math.inf), "Config.lr=inf; allowed: a float > 0"),
        (dict(spike_factor=0.5), "Config.spike_factor=0.5; allowed: a float > 1"),
        (dict(target_loss=-1.0), "Config.target_loss=-1.0; allowed: a float > 0 or None"),
        (dict(target_gap=math.inf), "Config.target_gap=inf; allowed: a float > 0 or None"),
        (dict(task_seed=-1), "Config.task_seed=-1; allowed: an int >= 0"),
        (dict(warmup=-1), "Config.warmup=-1; allowed: an int >= 0"),
        (dict(seed_batch=0), "Config.seed_batch=0; allowed: an int >= 1"),
        (dict(seed_batch=True), "Config.seed_batch=True; must be an int, got bool"),
        (dict(hidden=(0, 8)), "Config.hidden=(0, 8); allowed: a tuple of ints >= 1"),
        (dict(branching=40, vocab=32), "Config.branching=40 > vocab=32"),
        (dict(n_heads=3), "Config.n_heads=3; allowed: a divisor of d_model=64"),
        (dict(recipe="nvfp5"), "allowed: 'fp32'"),
        (dict(recipe="nvfp5"), "did you mean 'nvfp4'?"),
        (dict(optimizer="adam"), "did you mean 'adamw'?"),
        (dict(telemetry_stats="exact"), "Config.telemetry_stats='exact'"),
        (dict(telemetry_stats="refrence"), "did you mean 'reference'?"),
        (dict(stpes=10), "unknown config fields ['stpes']; allowed: task,"),
        (dict(stpes=10), "; did you mean 'steps'?"),
    ],
)
def test_numeric_fields_are_checked_and_names_suggested(bad, message):
    with pytest.raises(ConfigError) as e:
        make(bad)
    assert message in str(e.value)


def test_every_numeric_field_is_range_checked():
    numeric = [
        name
        for name, value in Config().__dict__.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]
    numeric += ["target_loss", "target_gap"]
    for name in numeric:
        if name == "order":  # a choice: 1 or 2
            continue
        with pytest.raises(ConfigError, match=rf"Config\.{name}="):
            make({name: -math.inf if isinstance(getattr(Config(), name), float) else -1})


def test_valid_edges_are_accepted():
    cfg = make(dict(b1=0.0, clip_norm=0.0, weight_decay=0.0, min_lr_ratio=1.0, warmup=0))
    assert cfg.clip_norm == 0.0 and cfg.min_lr_ratio == 1.0


def test_check_number_and_did_you_mean():
    with pytest.raises(ValueError, match=r"X\.n='3' \(str\); allowed: an int >= 1"):
        schema.check_number("X", "n", "3", integer=True, low=1)
    schema.check_number("X", "n", None, optional=True)
    assert schema.did_you_mean("cosin", ("constant", "cosine")) == "; did you mean 'cosine'?"
    assert schema.did_you_mean("zzz", ("constant", "cosine")) == ""


@pytest.mark.parametrize("scan", [False, True])
def test_a_rule_that_quantizes_nothing_is_an_error_before_anything_runs(scan):
    """A rule whose path matches no layer's whole dotted path, or only layers an earlier rule
    takes, would leave its cell mislabelled: make_train refuses it and lists the layers."""
    tiny = dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, seq_len=8, vocab=16, steps=10)
    tiny |= dict(scan_layers=scan)
    part = Config(**tiny, rules=[(r"blocks\.0\.", "bf16")])  # not the whole path
    with pytest.raises(
        ConfigError, match=r"Config.rules: 'blocks.*\.' matches no layer .*: blocks\.0\.attn\.key"
    ):
        make_train(part)
    shadowed = Config(**tiny, rules=[(r".*", "bf16"), ("lm_head", "fp8")])
    with pytest.raises(ConfigError, match="'lm_head' matches no layer .* an earlier rule takes"):
        make_train(shadowed)
    later = Config(**tiny, rules=[("lm_head", "bf16")], phases=[(5, {"rules": [("lm", "bf16")]})])
    with pytest.raises(ConfigError, match=r"phases \(from step 5\) rules: 'lm' matches no layer"):
        make_train(later)
    # whole paths pass, and the recipe's own rule for the rest may match nothing
    make_train(Config(**tiny, rules=[(r"blocks\.\d\..*", "bf16"), ("lm_head", "fp8")]))
