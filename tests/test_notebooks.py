"""The notebooks run top to bottom (tiny mode), and `fp4lab report` writes every figure.

Each notebook is executed in a fresh kernel of this interpreter with FP4LAB_TINY=1: its first
cells run a tiny sweep into a temporary folder instead of reading results/, so the test never
depends on committed results. Nothing is written back to the notebooks.
"""

import base64
import re
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from nbclient import NotebookClient

from fp4lab import cli, sweep
from fp4lab.analysis import plots
from fp4lab.sweep import store

pytestmark = pytest.mark.slow  # notebooks run in a kernel

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAMES = ("gradient_flow_heatmap", "randomness_vs_error", "formats_tour", "rl_mismatch")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A "python3" kernel spec that runs this interpreter (written to a temp dir if missing)."""
    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
        if spec.argv[0] in ("python", "python3", sys.executable):  # jupyter_client: this one
            return None
    except NoSuchKernel:
        pass
    from ipykernel.kernelspec import write_kernel_spec

    root = tmp_path_factory.mktemp("jupyter")
    write_kernel_spec(root / "kernels" / "python3")  # argv[0] = sys.executable
    return root


def execute(name: str, kernel, monkeypatch) -> nbformat.NotebookNode:
    monkeypatch.setenv("FP4LAB_TINY", "1")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("MPLBACKEND", raising=False)
    if kernel is not None:
        monkeypatch.setenv("JUPYTER_PATH", str(kernel))
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=120,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()
    return nb


def outputs(nb, kind: str) -> list:
    return [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if kind in o.get("data", {})
    ]


def test_notebooks_are_stored_without_outputs():
    for name in NAMES:
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code and all(not c.outputs and c.execution_count is None for c in code), name
        assert "FP4LAB_TINY" in code[0].source, f"{name}: the first code cell reads FP4LAB_TINY"


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name, kernel, monkeypatch):
    nb = execute(name, kernel, monkeypatch)
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors
    pngs = outputs(nb, "image/png")
    assert pngs, f"{name}: no figure displayed"
    for o in pngs:
        assert base64.b64decode(o["data"]["image/png"])[:8] == b"\x89PNG\r\n\x1a\n"
    assert outputs(nb, "text/html"), f"{name}: no table displayed"
    if name == "randomness_vs_error":  # the verdict table names every factor it was given
        html = "".join(o["data"]["text/html"] for o in outputs(nb, "text/html"))
        for factor in ("cell", "seed_init", "seed_quant", "residual"):
            assert factor in html


def test_report_cli_writes_every_figure(tmp_path):
    """`fp4lab report RESULTS` on a real (tiny) sweep embeds each standard figure once."""
    path = tmp_path / "tiny.py"
    path.write_text(
        "from fp4lab.train.config import Config\n\n"
        "SEEDS = 2\n\n"
        "def get_config():\n"
        "    return Config(task='teacher', din=32, dout=32, teacher_hidden=(32,), hidden=(32,),\n"
        "                  batch_size=32, steps=12, lr=1e-2, warmup=2, eval_batches=1,\n"
        "                  telemetry_every=4, shadow=True, target_gap=2.0, seed_batch=2)\n\n"
        "def sweep(add):\n"
        "    add(recipe='bf16')\n"
        "    add(recipe='mxfp4')\n"
    )
    out = tmp_path / "results"
    sweep.run_experiment(sweep.load_experiment(path), out, progress=False)
    names = [name for name, _ in plots.iter_figures(store.load(out))]
    for expected in ("loss_curves", "loss_gap", "tokens_to_target", "overhead"):
        assert expected in names
    assert "divergence_rate" not in names  # nothing diverged
    assert "eval_loss_curves" not in names  # one eval point per run
    assert any(n.startswith("heatmap_rel_err") for n in names)
    assert "gradient_to_noise" in names
    assert cli.main(["report", str(out)]) == 0
    page = (out / "report.html").read_text(encoding="utf-8")
    alts = re.findall(r"<img alt='([^']*)' src='data:image/png;base64,", page)
    assert sorted(alts) == sorted(names)
    assert "http://" not in page and "https://" not in page
