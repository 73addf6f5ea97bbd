"""A run id (and a stored program's key) covers all the user code a run executes, is the same in
every process, and no run is stored under a recipe that quantized nothing."""

import os
import subprocess
import sys
import textwrap

import pytest

import fp4lab as fl
from fp4lab.sweep import compute
from fp4lab.train.config import Config

OWN = """
import jax
import jax.numpy as jnp
from flax import nnx

import fp4lab as fl
import helper


def model(config, rngs):
    return nnx.Linear(8, 8, rngs=rngs)


def loss(model, batch):
    return jnp.mean((model(batch) - helper.target(batch)) ** 2)


def batch(key, step):
    return jax.random.normal(key, (4, 8))


def get_config():
    return fl.Config(batch_size=4, steps=2, warmup=0, eval_batches=1)


def sweep(add):
    add(recipe="nvfp4")
"""
HELPER = """
from pkgx import inner


def target(x):
    return x * inner.SCALE
"""


@pytest.fixture
def own_file(tmp_path, monkeypatch):
    """An own-model experiment file that imports `helper` from PYTHONPATH, which imports
    `pkgx.inner` (a package of the user's): returns the folder holding them."""
    code = tmp_path / "code"
    (code / "pkgx").mkdir(parents=True)
    (code / "pkgx" / "__init__.py").write_text("")
    (code / "pkgx" / "inner.py").write_text("SCALE = 1\n")
    (code / "helper.py").write_text(textwrap.dedent(HELPER))
    (tmp_path / "own.py").write_text(textwrap.dedent(OWN))
    monkeypatch.syspath_prepend(str(code))
    for name in ("helper", "pkgx", "pkgx.inner"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_run_ids_and_the_program_key_cover_the_modules_an_experiment_file_imports(own_file):
    from fp4lab.sweep import programs
    from fp4lab.train import trainer

    def ids_and_key():
        experiment = fl.sweep.load_experiment(own_file / "own.py")
        cell = experiment.cells[0]
        return cell.run_ids(), programs.program_key(cell.config, trainer.make_keys(0, 0, 0))

    ids, key = ids_and_key()
    data = fl.sweep.load_experiment(own_file / "own.py").cells[0].data
    assert set(data) == {"task_file", "module:helper", "module:pkgx", "module:pkgx.inner"}
    (own_file / "code" / "pkgx" / "inner.py").write_text("SCALE = 3\n")  # two imports deep
    edited_ids, edited_key = ids_and_key()
    assert not set(ids) & set(edited_ids) and key != edited_key
    (own_file / "code" / "pkgx" / "inner.py").write_text("SCALE = 1\n")
    assert ids_and_key() == (ids, key)  # the code alone decides, not when it was read


SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
import task_module
from fp4lab.sweep.own import task_hash
print(task_hash({"model": task_module.model, "loss": task_module.loss,
                 "batch": task_module.batch}))
"""
TASK = """
import numpy as np

import helper

ALPHA, BETA, GAMMA, DELTA = 1.0, 2.0, 3.0, 4.0
TABLE = np.arange(6.0)


def scale(x):
    return x * ALPHA + BETA


def model(config, rngs):
    return scale(GAMMA) + DELTA + TABLE.sum()


def loss(model, batch):
    return scale(batch) - helper.target(batch) + ALPHA * BETA * GAMMA * DELTA


def batch(key, step):
    return TABLE[step % 6] * GAMMA
"""


def test_a_python_task_hash_is_the_same_in_every_process_and_covers_its_modules(
    own_file, monkeypatch
):
    from fp4lab.sweep.own import task_hash

    code = own_file / "code"
    (code / "task_module.py").write_text(textwrap.dedent(TASK))
    monkeypatch.delitem(sys.modules, "task_module", raising=False)
    import task_module

    def here():
        fns = {"model": task_module.model, "loss": task_module.loss, "batch": task_module.batch}
        return task_hash(fns)

    def elsewhere(seed):
        env = os.environ | {"PYTHONHASHSEED": str(seed)}
        run = [sys.executable, "-c", SCRIPT, str(code)]
        return subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout

    before = here()
    assert {elsewhere(1).strip(), elsewhere(2).strip()} == {before}  # three processes
    (code / "pkgx" / "inner.py").write_text("SCALE = 3\n")  # a module the helper imports
    assert here() != before


def test_a_model_with_nothing_to_quantize_is_refused_before_anything_runs():
    nnx, jnp = pytest.importorskip("flax.nnx"), pytest.importorskip("jax.numpy")

    class Plain(nnx.Module):  # its matmul is no seam quantize_model can reach
        def __init__(self, rngs):
            self.w = nnx.Param(jnp.eye(8))

        def __call__(self, x):
            return x @ self.w

    def model(config, rngs):
        return Plain(rngs)

    def loss(model, batch):
        return jnp.mean(model(batch) ** 2)

    def batch(key, step):
        return jnp.ones((4, 8)) * step

    name = fl.own.task(model, loss, batch)
    base = Config(task="own", task_file=name, batch_size=4, steps=2, warmup=0, eval_batches=1)
    why = compute.check_cell(base.replace(recipe="nvfp4"))
    assert why is not None and "nothing of the model would be quantized" in why
    assert compute.check_cell(base.replace(recipe="fp32")) is None  # a baseline quantizes nothing
    keep_all = base.replace(recipe="nvfp4", rules=((".*", None),))
    assert "nothing of the model would be quantized" in compute.check_cell(keep_all)


def test_a_model_function_that_returns_no_module_is_one_line():
    nnx, jnp = pytest.importorskip("flax.nnx"), pytest.importorskip("jax.numpy")

    def model(config, rngs):
        layer = nnx.Linear(8, 8, rngs=rngs)
        return lambda x: layer(x)  # a function, not the module

    def loss(model, batch):
        return jnp.mean(model(batch) ** 2)

    def batch(key, step):
        return jnp.ones((4, 8))

    config = Config(task="own", task_file=fl.own.task(model, loss, batch), batch_size=4, steps=2)
    why = compute.check_cell(config.replace(warmup=0, eval_batches=1))
    assert why.startswith("ConfigError: the task's model(config, rngs) returned a function")


def test_runs_computed_without_the_kernels_carry_their_own_ids_and_say_so(tmp_path, monkeypatch):
    from fp4lab.core import cpu_kernels

    (tmp_path / "exp.py").write_text(
        "from fp4lab.train.config import Config\n\n"
        "def get_config():\n"
        "    return Config(task='teacher', din=16, dout=16, teacher_hidden=(16,), hidden=(16,),"
        " steps=2, telemetry_every=1)\n\n"
        "def sweep(add):\n"
        "    add('nvfp4', recipe='nvfp4', seeds=2)\n"
    )
    cell = fl.sweep.load_experiment(tmp_path / "exp.py").cells[0]
    assert "numerics_route" not in cell.data  # the kernels load here: the ids of before
    monkeypatch.setattr(cpu_kernels, "_build", lambda: (None, "cannot load it (a test)"))
    with pytest.warns(RuntimeWarning, match="carry their own run ids"):
        without = fl.sweep.load_experiment(tmp_path / "exp.py").cells[0]
    assert without.data == {"numerics_route": "reference"}
    assert not set(without.run_ids()) & set(cell.run_ids())
