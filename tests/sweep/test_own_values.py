"""Python-path run ids (`fl.own.task`, `task_hash`) cover every value the functions reach:
sets, dicts, dataclasses, objects of the user's classes, nested containers and the arrays in
them; the same in every process (a set never in set order); an iterator or an open file they
read is refused by name."""

import collections
import datetime
import fractions
import functools
import importlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fp4lab.sweep.own import Unhashable, task_hash

GLOBALS = """
import dataclasses
import functools

import numpy as np


@dataclasses.dataclass
class Setting:
    scale: float
    table: tuple


class Holder:
    def __init__(self):
        self.arrays = {"w": [np.ones(3)]}


def shift(x, by):
    return x + by


SCALES = {1.0, 2.0}
NAMES = frozenset({"alpha", "beta", "gamma", "delta"})
DEEP = {"a": [(np.zeros(2), {"b": np.arange(3.0)})]}
SETTING = Setting(1.0, (np.ones(2), np.ones(3)))
HOLDER = Holder()
SHIFT = functools.partial(shift, by=np.ones(2))


def model(config, rngs):
    return SETTING.scale * sum(SCALES) * len(NAMES) * DEEP["a"][0][1]["b"]


def loss(model, batch):
    return HOLDER.arrays["w"][0].sum() + SHIFT(batch)


def batch(key, step):
    return 0.0
"""


@pytest.fixture
def task_module(tmp_path, monkeypatch):
    (tmp_path / "values_task.py").write_text(textwrap.dedent(GLOBALS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "values_task", raising=False)
    return importlib.import_module("values_task")


def _hash(m):
    return task_hash({"model": m.model, "loss": m.loss, "batch": m.batch})


def test_every_value_the_functions_reach_is_in_the_run_id(task_module):
    m = task_module
    before = _hash(m)
    edits = [
        (lambda: setattr(m, "SCALES", {3.0, 2.0}), lambda: setattr(m, "SCALES", {1.0, 2.0})),
        (lambda: setattr(m, "SCALES", {2.0, 1.0}), None),  # the same set: the same id
        (lambda: m.DEEP["a"][0][1]["b"].__setitem__(2, 7.0),
         lambda: m.DEEP["a"][0][1]["b"].__setitem__(2, 2.0)),  # an array two containers deep
        (lambda: m.DEEP["a"][0][0].__setitem__(0, 1.0),
         lambda: m.DEEP["a"][0][0].__setitem__(0, 0.0)),  # an array in a tuple in a list
        (lambda: setattr(m.SETTING, "scale", 2.0), lambda: setattr(m.SETTING, "scale", 1.0)),
        (lambda: m.SETTING.table[1].__setitem__(0, 5.0),
         lambda: m.SETTING.table[1].__setitem__(0, 1.0)),  # a dataclass's tuple of arrays
        (lambda: m.HOLDER.arrays["w"][0].__setitem__(1, 4.0),
         lambda: m.HOLDER.arrays["w"][0].__setitem__(1, 1.0)),  # an object of the user's class
        (lambda: m.SHIFT.keywords["by"].__setitem__(0, 3.0),
         lambda: m.SHIFT.keywords["by"].__setitem__(0, 1.0)),  # a partial's argument
        (lambda: setattr(m, "NAMES", m.NAMES | {"epsilon"}),
         lambda: setattr(m, "NAMES", m.NAMES - {"epsilon"})),
    ]  # fmt: skip
    for i, (edit, undo) in enumerate(edits):
        edit()
        assert (_hash(m) == before) == (undo is None), i
        if undo is not None:
            undo()
            assert _hash(m) == before, i


SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
import values_task as m
from fp4lab.sweep.own import task_hash
print(task_hash({"model": m.model, "loss": m.loss, "batch": m.batch}))
"""


def test_a_set_gives_the_same_id_in_every_process(task_module, tmp_path):
    def elsewhere(seed):  # another string hash seed: another set order
        env = os.environ | {"PYTHONHASHSEED": str(seed)}
        run = [sys.executable, "-c", SCRIPT, str(tmp_path)]
        return subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout

    assert {elsewhere(1).strip(), elsewhere(2).strip(), elsewhere(3).strip()} == {
        _hash(task_module)
    }


def test_an_iterator_or_an_open_file_read_by_the_functions_is_refused_by_name(tmp_path):
    stream = iter(np.arange(10.0))
    handle = open(tmp_path / "f.txt", "w")  # noqa: SIM115

    def batch(key, step):
        return next(stream)

    def loss(model, batch):
        return handle.write("x")

    closure = r"^batch holds 'stream' in its closure \(type iterator, read as it goes\)"
    with pytest.raises(Unhashable, match=closure):
        task_hash({"batch": batch})
    with pytest.raises(Unhashable, match=r"^loss holds 'handle' in its closure \(type TextIOW"):
        task_hash({"loss": loss})
    handle.close()
    globals()["STREAM"] = iter(range(3))
    try:
        said = r"^reads_global reads the global 'STREAM' \(type range_iterator, .* pass what it"
        with pytest.raises(Unhashable, match=said):
            task_hash({"batch": reads_global})
    finally:
        del globals()["STREAM"]


def reads_global(key, step):
    return next(STREAM)  # noqa: F821


MORE = """
import collections
import datetime
import fractions
import functools

import jax
import jax.numpy as jnp
import numpy as np

DTYPE = jnp.float32
ACT = np.sin
SPAN = range(3)
STEP = fractions.Fraction(1, 3)
WAIT = datetime.timedelta(seconds=1)
QUEUE = collections.deque([1.0, 2.0])
RAW = bytearray(b"ab")
KEY = jax.random.key(0)
SCALE = 1.0


def loss_with(model, batch, scale):
    return scale


def model(config, rngs, scale=SCALE):
    return ACT(np.ones(2, DTYPE)) * scale


def batch(key, step):
    return (len(SPAN), STEP, WAIT, QUEUE[0], RAW, KEY)


loss = functools.partial(loss_with, scale=1.0)
"""


def test_partials_defaults_library_names_and_value_types_are_in_the_run_id(tmp_path, monkeypatch):
    """Each edit a new id (these reused the old run before): the loss a partial whose argument
    changes, a default argument's value, a dtype or a library function read as a global, and
    values of the standard library's types and a JAX PRNG key."""
    import jax
    import jax.numpy as jnp

    (tmp_path / "more_task.py").write_text(textwrap.dedent(MORE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "more_task", raising=False)
    m = importlib.import_module("more_task")

    def digest():
        return task_hash({"model": m.model, "loss": m.loss, "batch": m.batch})

    before = digest()
    assert digest() == before  # the same functions, the same id
    edits = [
        ("loss", functools.partial(m.loss_with, scale=3.0)),
        ("DTYPE", jnp.bfloat16),
        ("ACT", np.cos),
        ("SPAN", range(4)),
        ("STEP", fractions.Fraction(1, 4)),
        ("WAIT", datetime.timedelta(seconds=2)),
        ("QUEUE", collections.deque([1.0, 3.0])),
        ("RAW", bytearray(b"ac")),
        ("KEY", jax.random.key(1)),
    ]
    for name, value in edits:
        old = getattr(m, name)
        setattr(m, name, value)
        assert digest() != before, name
        setattr(m, name, old)
        assert digest() == before, name
    m.SPAN = object()  # a sentinel: its repr holds an address, so only its type counts
    first = digest()
    m.SPAN = object()
    assert digest() == first
    m.SPAN = range(3)
    old = m.model.__defaults__
    m.model.__defaults__ = (3.0,)  # def model(config, rngs, scale=3.0)
    assert digest() != before
    m.model.__defaults__ = old
    assert digest() == before
