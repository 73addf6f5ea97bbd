"""An experiment file imports a module beside it (`from helper import X`), as a script run by
`python FILE` can: from any working folder, in the process that loads it and in a fresh one
that loads its task (as a worker does); the helper's source is in the run ids."""

import os
import subprocess
import sys
import textwrap

from fp4lab import sweep

FILE = """
from fp4lab.train.config import Config
from {helper} import WIDTH


def get_config():
    return Config(steps=2, hidden=(WIDTH,))


def sweep(add):
    add(recipe="bf16")


def model(config, rngs):
    from flax import nnx

    return nnx.Linear(WIDTH, WIDTH, rngs=rngs)


def loss(model, batch):
    return (model(batch) ** 2).mean()


def batch(key, step):
    import jax

    return jax.random.normal(key, (4, WIDTH))
"""

WORKER = """
import sys
from fp4lab.train import own
print(own.namespace(sys.argv[1]).WIDTH)
"""


def test_an_experiment_file_imports_a_module_beside_it(tmp_path, monkeypatch):
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "width_helper_a.py").write_text("WIDTH = 8\n")
    path = folder / "exp.py"
    path.write_text(textwrap.dedent(FILE.format(helper="width_helper_a")))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setattr(sys, "path", list(sys.path))  # the folder leaves with the test
    exp = sweep.load_experiment(path)
    assert exp.cells[0].config.hidden == (8,)
    assert "module:width_helper_a" in exp.cells[0].data  # its source in the run ids
    ids = exp.cells[0].run_ids()
    # a fresh process that loads the task, as a worker does: the helper is found there too
    assert str(folder) not in os.environ.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", WORKER, str(path)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "8", done.stderr
    (folder / "width_helper_a.py").write_text("WIDTH = 16\n")
    monkeypatch.delitem(sys.modules, "width_helper_a")
    assert not set(sweep.load_experiment(path).cells[0].run_ids()) & set(ids)
    monkeypatch.delitem(sys.modules, "width_helper_a")
