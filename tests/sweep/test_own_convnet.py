"""A user's own conv net on tiny synthetic images, run as a new user runs it: `fp4lab run` with
the streams design gives stream rows with judged words, a layer the recipe cannot take is named
with its fix, a layer without a seam is reported, and an ambiguous `batch` is refused."""

import textwrap

import jax
import jax.numpy as jnp
import pytest

from fp4lab import cli
from fp4lab.sweep import design, experiment
from fp4lab.train import own

CONVNET = """
import jax
import jax.numpy as jnp
from flax import nnx

import fp4lab as fl

CLASSES = 16


class ConvNet(nnx.Module):
    def __init__(self, channels, rngs):
        self.c1 = nnx.Conv(channels, 16, (3, 3), rngs=rngs)
        self.head = nnx.Linear(4 * 4 * 16, CLASSES, rngs=rngs)

    def __call__(self, x):
        h = jax.nn.relu(self.c1(x))
        return self.head(h.reshape(h.shape[0], -1))


def model(config, rngs):
    return ConvNet(CHANNELS, rngs)


def loss(model, batch):
    x, y = batch
    logits = model(x)
    picked = jnp.take_along_axis(logits, y[:, None], -1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, -1) - picked)


def batch(key, step):
    x = jax.random.normal(key, (8, 4, 4, CHANNELS))
    return x, jnp.argmax(x.reshape(8, -1)[:, :CLASSES], -1)


CHANNELS = 16


def get_config():
    return fl.Config(steps=4, lr=1e-2, warmup=0, eval_batches=1, seed_batch=9)


def sweep(add):
    add(recipe="nvfp4")
"""


def write(folder, text=CONVNET):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "convnet.py"
    path.write_text(textwrap.dedent(text))
    return path


def test_crossed_design_crosses_the_quant_stream_with_init_and_data():
    seeds = design.crossed()
    assert len(seeds) == 9 and len(set(seeds)) == 9
    assert {(i, d) for i, d, _ in seeds} == {(i, i) for i in range(3)}  # init and data together
    assert {q for *_, q in seeds} == {0, 1, 2}
    assert len(design.crossed(3, apart=("init", "data", "quant"))) == 27
    assert design.named("streams", 4) == design.crossed(4)
    with pytest.raises(ValueError, match=r"crossed: n=2; need an int >= 3"):
        design.crossed(2)
    with pytest.raises(ValueError, match=r"apart=\('seed',\); allowed"):
        design.crossed(apart="seed")


def test_the_streams_design_gives_judged_stream_rows(tmp_path, capsys):
    path = write(tmp_path)
    out = tmp_path / "res"
    argv = ["run", str(path), "--out", str(out), "--design", "streams", "--quiet", "--no-figures"]
    assert cli.main([*argv[:-2], "--dry-run", "--no-probe"]) == 0
    listed = capsys.readouterr().out
    assert "1 cells, 9 runs" in listed
    assert "seeds by design streams: 9 runs a cell (3 quant seeds x 3 init=data seeds)" in listed
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    rows = text.split("which seed streams matter, per cell")[1].splitlines()[1:3]
    assert rows[0].startswith("  init=data in recipe=nvfp4: ")
    assert rows[1].startswith("  quant in recipe=nvfp4: ")
    for row in rows:  # a word and its own SD, not a reason why there is none
        word = row.split(": ")[1].split(" (own SD ")[0]
        assert word in ("matters", "no evidence"), row
    assert "init=data: confounded, the init, data seeds moved together" in rows[0]
    assert "every stream crossed" in rows[0]
    assert "confounded" not in rows[1]


def test_experiment_seeds_by_design_are_checked(tmp_path, capsys):
    import fp4lab as fl

    path = write(tmp_path)
    assert fl.design.crossed is design.crossed
    exp = experiment.load_experiment(path, seeds=design.crossed())
    assert exp.n_runs == 9
    argv = ["run", str(path), "--design", "streams", "--seeds", "2", "--dry-run"]
    assert cli.main(argv) == 2
    assert "--design streams --seeds 2: crossed: n=2; need an int >= 3" in capsys.readouterr().err


def test_dry_run_probes_one_run_and_estimates_the_sweep(tmp_path, capsys, monkeypatch):
    from fp4lab.sweep import compute

    def timed(config, seeds, progress=None):  # a compile of 10 s and a run of 2 s
        return [{"summary": {"compile_s": 10.0}, "wall_s": 2.0} for _ in seeds]

    monkeypatch.setattr(compute, "compute_cell", timed)
    path = write(
        tmp_path,
        CONVNET.replace('add(recipe="nvfp4")', 'add(recipe="nvfp4")\n    add(recipe="bf16")'),
    )
    argv = ["run", str(path), "--out", str(tmp_path / "o"), "--design", "streams", "--dry-run"]
    assert cli.main([*argv, "--workers", "2"]) == 0
    text = capsys.readouterr().out
    assert "recipe=nvfp4  seeds(init/data/quant) 0/0/0 0/0/1 0/0/2 1/1/0" in text
    line = next(x for x in text.splitlines() if x.startswith("probe: "))
    assert line.startswith("probe: cell recipe=nvfp4, seeds 0/0/0: compile 10.0s, run ")
    # 2 programs x 10 s + 18 runs x >= 2 s, over 2 workers
    assert "estimate for 18 runs and 2 programs to compile on 2 worker(s): about " in line
    assert float(line.split("about ")[1].split("s ")[0]) >= (2 * 10 + 18 * 2) / 2


def test_a_batch_that_reads_two_ways_is_refused_naming_both(tmp_path):
    text = CONVNET.replace("def batch(key, step):", "def batch(key, step, batch_size=8):")
    with pytest.raises(experiment.ExperimentError) as err:
        experiment.load_experiment(write(tmp_path, text))
    assert str(err.value) == (
        f"{tmp_path / 'convnet.py'}: batch(key, step, batch_size=8) reads two ways: as "
        "batch(key, step) with batch_size at its default, or as batch(config, key, step) with "
        "the config passed as 'key'; fp4lab would call it the second way. Make it one: "
        "batch(key, step) (give batch_size no parameter slot, e.g. a keyword-only "
        "`*, batch_size=8`) or batch(config, key, step)"
    )


def test_a_layer_the_recipe_cannot_block_is_named_with_its_fix(tmp_path, capsys):
    path = write(tmp_path, CONVNET.replace("CHANNELS = 16", "CHANNELS = 3"))  # RGB images
    argv = ["run", str(path), "--out", str(tmp_path / "o"), "--seeds", "1", "--dry-run"]
    assert cli.main([*argv, "--no-probe"]) == 2
    err = capsys.readouterr().err
    assert "cell recipe=nvfp4 would fail: ValueError: layer 'c1': Fprop GEMM, operand x" in err
    assert (
        'the one-line fix: recipe=fl.recipes.get("nvfp4").replace(pad=True) (every operand '
        "zero-padded to whole blocks), or `fp4lab run ... --set pad=true`; or keep the layer "
        "in high precision with the rule ('c1', None)"
    ) in err
    assert cli.main([*argv, "--no-probe", "--set", "pad=true"]) == 0  # the fix, as printed


def test_a_backward_shape_error_names_the_layer_too():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import fp4lab as fl

    x = fl.nvfp4()
    dgrad_only = fl.GemmRecipe(dgrad_dy=x, dgrad_w=x, name="dgrad-fp4")
    head = nnx.Linear(16, 3, rngs=nnx.Rngs(0))  # Dgrad contracts over its 3 outputs
    fl.quantize_model(head, [fl.Rule(".*", dgrad_only)])
    assert head(jnp.ones((4, 16))).shape == (4, 3)  # the forward is not quantized
    with pytest.raises(ValueError, match=r"^layer '': Dgrad GEMM, operand dy") as err:
        nnx.grad(lambda m: m(jnp.ones((4, 16))).sum())(head)
    assert "the one-line fix: recipe=<your GemmRecipe 'dgrad-fp4'>.replace(pad=True)" in str(
        err.value
    )
    padded = dgrad_only.replace(pad=True)
    assert padded.name == "dgrad-fp4" and padded.dgrad_dy.pad and padded.fprop_x is None
    fl.quantize_model(head, [fl.Rule(".*", padded)])
    grads = nnx.grad(lambda m: m(jnp.ones((4, 16))).sum())(head)
    assert jax.tree.leaves(grads)[0].shape in ((3,), (16, 3))


UNSEAMED = CONVNET.replace(
    """        h = jax.nn.relu(self.c1(x))""",
    """        h = jax.nn.relu(self.c1(x + self.pos[...][None]))
        h = h @ self.mix[...]  # a custom GEMM: no seam""",
).replace(
    """        self.head = nnx.Linear(4 * 4 * 16, CLASSES, rngs=rngs)""",
    """        self.head = nnx.Linear(4 * 4 * 16, CLASSES, rngs=rngs)
        self.pos = nnx.Param(jnp.zeros((4, 4, CHANNELS)))  # only added: not a GEMM
        self.mix = nnx.Param(jnp.eye(16))""",
)


def test_a_layer_without_a_seam_is_listed_and_warned_about_once(tmp_path):
    import warnings

    from flax import nnx

    import fp4lab as fl
    from fp4lab.sweep import compute

    exp = experiment.load_experiment(write(tmp_path, UNSEAMED), seeds=1)
    cfg = exp.cells[0].config
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert compute.check_cell(cfg) is None
    said = [str(w.message) for w in caught if "without a seam" in str(w.message)]
    assert said == [
        "1 module(s) multiply their own parameters without a seam fp4lab can quantize and stay "
        "in high precision: 'mix' (a custom jnp.dot or @); build them from nnx.Linear, Einsum or "
        "Conv to quantize them (fl.describe lists them as 'not quantized (no seam)')"
    ]
    cfg = cfg.replace(recipe="fp32")  # nothing quantized: nothing to warn about
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compute.check_cell(cfg)
    assert not [w for w in caught if "without a seam" in str(w.message)]
    ns = own.namespace(cfg.task_file)
    model = ns.model(cfg, nnx.Rngs(0))
    fl.quantize_model(model, [fl.Rule(".*", "nvfp4")], key=jax.random.key(0))
    table = fl.describe(model).set_index("path")["recipe"].to_dict()
    no_seam = "not quantized (no seam)"  # describe traces nothing: pos (only added) too
    assert table == {"c1": "nvfp4", "head": "nvfp4", "pos": no_seam, "mix": no_seam}
    added_only = UNSEAMED.replace("h = h @ self.mix[...]", "h = h + self.mix[0, 0]")
    exp = experiment.load_experiment(write(tmp_path / "b", added_only), seeds=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compute.check_cell(exp.cells[0].config)
    assert not [w for w in caught if "without a seam" in str(w.message)]


def test_own_sweep_shows_each_seeds_steps_as_the_cli_does(tmp_path, monkeypatch):
    import io
    import re

    from flax import nnx

    import fp4lab as fl
    from fp4lab.sweep import runner

    log, bar = io.StringIO(), runner.Progress
    monkeypatch.setattr(
        runner, "Progress", lambda *a, **k: bar(*a, **(k | {"stream": log, "interval": 0}))
    )

    def model(config, rngs):
        return nnx.Linear(16, 16, rngs=rngs)

    def loss(model, batch):
        return jax.numpy.mean((model(batch) - batch) ** 2)

    def batch(key, step):
        return jax.random.normal(key, (8, 16))

    cfg = fl.Config(steps=2, lr=1e-2, warmup=0, eval_batches=1, seed_batch=3)
    fl.own.sweep(model, loss, batch, {"a": {"recipe": "bf16"}}, cfg, seeds=3, out=tmp_path / "o")
    text = log.getvalue()
    shown = re.findall(r"a \(seeds 0-2\): seed (\d)/3, step (\d)/2", text)
    assert shown == [(s, t) for s in "123" for t in "12"], text


def test_show_flags_a_cell_that_did_not_learn(tmp_path, capsys):
    from fakes import fake_compute  # tests/fakes.py

    from fp4lab import sweep

    def stuck(config, seeds):  # every run's loss flat at its first value
        return [
            r | {"summary": r["summary"] | {"learned": False}} for r in fake_compute(config, seeds)
        ]

    path = write(tmp_path)
    exp = sweep.load_experiment(path, seeds=3)
    sweep.run_experiment(exp, tmp_path / "o", progress=False, compute=stuck)
    assert cli.main(["show", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert (
        "recipe=nvfp4: did not learn: 3 of 3 runs: the training loss did not fall by more than "
        "its batch-to-batch noise"
    ) in text
    assert "init=data=quant in recipe=nvfp4: " not in text  # no verdict words for it
    assert "no evidence" not in text and "matters" not in text


def test_a_parameter_without_a_seam_is_recorded_with_the_runs_and_shown(tmp_path, capsys):
    import warnings

    from flax import nnx

    import fp4lab as fl

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(16, 16, rngs=rngs)
            self.raw_w = nnx.Param(jnp.eye(16))  # at the model's top level, multiplied by @

        def __call__(self, x):
            return self.up(x) @ self.raw_w[...]

    def model(config, rngs):
        return Net(rngs)

    def loss(model, batch):
        return jnp.mean((model(batch) - batch) ** 2)

    def batch(key, step):
        return jax.random.normal(key, (8, 16))

    cfg = fl.Config(steps=2, lr=1e-2, warmup=0, eval_batches=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = fl.own.sweep(model, loss, batch, {"nvfp4": {"recipe": "nvfp4"}}, cfg, seeds=1,
                           out=tmp_path / "o", progress=False)  # fmt: skip
    assert res.runs["no_seam"].tolist() == ["raw_w"]  # named by its attribute, not ''
    assert cli.main(["show", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "nvfp4: not quantized, no seam (a custom jnp.dot or @, in high precision): raw_w" in out
