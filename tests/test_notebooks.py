"""The notebooks run top to bottom on the committed results, and `fp4lab report` writes every
figure.

Each notebook is executed headless in a fresh kernel of this interpreter, reading results/
through `fl.load` (compacted folders included); its first output says which data it shows, the
numbers it prints are the committed CSVs' numbers, and without its results it stops with an error
instead of showing something else. Nothing is written back to the notebooks.
"""

import base64
import re
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from nbclient import NotebookClient

import fp4lab as fl
from fp4lab import cli, sweep
from fp4lab.analysis import plots
from fp4lab.sweep import store

pytestmark = pytest.mark.slow  # notebooks run in a kernel

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
RESULTS = ROOT / "results"
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


def execute(name: str, kernel, monkeypatch, folder: Path = NOTEBOOKS) -> nbformat.NotebookNode:
    """Runs notebooks/<name>.ipynb in `folder` (it reads ../results from there)."""
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("MPLBACKEND", raising=False)
    if kernel is not None:
        monkeypatch.setenv("JUPYTER_PATH", str(kernel))
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=120,
        resources={"metadata": {"path": str(folder)}},
    )
    client.execute()
    return nb


def outputs(nb, kind: str) -> list:
    return [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if kind in o.get("data", {})
    ]


def texts(nb) -> str:
    """Everything the notebook printed or displayed as text, in order."""
    parts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.output_type == "stream":
                parts.append(o.text)
            elif "data" in o:
                parts.append(o["data"].get("text/plain", "") + o["data"].get("text/html", ""))
    return "\n".join(parts)


def numbers(text: str) -> list[float]:
    return [float(m) for m in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", text)]


def shown(value: float, text: str, rel: float = 5e-5) -> bool:
    """Whether `value` (a committed CSV's, to 5 significant digits) is displayed in `text`."""
    return any(abs(v - value) <= rel * abs(value) for v in numbers(text))


def first_output(nb) -> str:
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.outputs:
            o = cell.outputs[0]
            return o.text if o.output_type == "stream" else str(o.get("data", {}))
    return ""


def test_notebooks_are_stored_without_outputs():
    for name in NAMES:
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code and all(not c.outputs and c.execution_count is None for c in code), name
        source = "".join(c.source for c in code)
        assert "FP4LAB_TINY" not in source and "tiny_sweep" not in source, f"{name}: a fallback"


def committed_numbers(name: str) -> tuple[str, list[float]]:
    """The results folder a notebook reads and numbers of its committed tables it must show."""
    if name == "randomness_vs_error":
        gaps = pd.read_csv(RESULTS / name / "loss_gap.csv")
        return f"results/{name}: {int(gaps['n'].sum())} runs", list(gaps["gap"])
    if name == "gradient_flow_heatmap":
        runs = fl.load(RESULTS / "drift").runs
        return f"results/drift: {len(runs)} runs", []
    if name == "formats_tour":
        table = pd.read_csv(RESULTS / "formats" / "formats.csv")
        return "results/formats", list(table.loc[table["stat"] == "rel_err", "mean"].iloc[:4])
    table = pd.read_csv(RESULTS / "rl" / "mismatch.csv")
    return "results/rl", list(table["abs_logp"][table["abs_logp"] > 0])


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_on_the_committed_results(name, kernel, monkeypatch):
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
    says, values = committed_numbers(name)
    assert first_output(nb).startswith("Showing") and says in first_output(nb), first_output(nb)
    text = texts(nb)
    missing = [v for v in values if not shown(v, text)]
    assert not missing, f"{name}: committed numbers not shown: {missing}"
    if name == "randomness_vs_error":  # the verdict table names every factor it was given
        html = "".join(o["data"]["text/html"] for o in outputs(nb, "text/html"))
        for factor in ("cell", "seed_init", "seed_quant", "residual"):
            assert factor in html


def test_a_notebook_without_its_results_stops_with_an_error(kernel, monkeypatch, tmp_path):
    """No fallback: with ../results/drift missing the notebook raises, naming the command."""
    folder = tmp_path / "notebooks"  # ../results does not exist here
    folder.mkdir()
    with pytest.raises(Exception, match="experiments/drift.py"):
        execute("gradient_flow_heatmap", kernel, monkeypatch, folder=folder)


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
