"""`fp4lab export --tensorboard`: every run's metrics as TensorBoard scalars, one folder per run,
read back through the event files' own framing (no TensorBoard needed)."""

import struct
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from fp4lab import cli, sweep
from fp4lab.analysis import export
from fp4lab.sweep import store

EXPERIMENT = """
from fp4lab.train.config import Config

SEEDS = 2

def get_config():
    return Config(task="teacher", din=16, dout=16, teacher_hidden=(16,), hidden=(16,),
                  batch_size=16, steps=4, eval_batches=1, seed_batch=2)

def sweep(add):
    add(recipe="bf16")
    add("recipe=nvfp4,wgrad=bf16", recipe="nvfp4", gemms={"wgrad": "bf16"})
"""

RUN_FOLDERS = [
    "BF16/init0_data0_quant0",
    "BF16/init1_data1_quant1",
    "NVFP4, Wgrad in BF16/init0_data0_quant0",
    "NVFP4, Wgrad in BF16/init1_data1_quant1",
]


def fake_compute(config, seeds):
    """compute_cell's output shape, instantly: loss and grad_norm series (one run's loss turns
    NaN), telemetry at steps 0 and 2 (an infinite gradient-to-noise ratio among it)."""
    out = []
    for s in seeds:
        level = 1.0 + sum(s) + (0.5 if config["recipe"] == "nvfp4" else 0.0)
        loss = level / (1 + np.arange(config["steps"]))
        if config["recipe"] == "nvfp4" and s[0] == 1:
            loss[-1] = np.nan
        summary = {"final_loss": float(loss[-1]), "eval_loss": level / 10, "loss_floor": 0.0}
        summary |= {"loss_gap": float(loss[-1]), "diverged": False, "tokens_per_step": 16}
        telemetry = {
            "quant/layers.0/fprop/x/rel_err": [0.1 * level, 0.12 * level],
            "grad/layers.0.kernel/gnr": [np.inf, 3.0 / level],
            "depth/layers.0": [0.0, 0.0],
        }
        out.append(
            {
                "summary": summary,
                "series": {"loss": loss, "grad_norm": 2 * loss},
                "telemetry": {"steps": [0, 2], "metrics": telemetry},
                "wall_s": 0.0,
            }
        )
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    path = root / "exp.py"
    path.write_text(textwrap.dedent(EXPERIMENT))
    out = root / "results"
    sweep.run_experiment(sweep.load_experiment(path), out, progress=False, compute=fake_compute)
    return out


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C (Castagnoli, reflected 0x82F63B78), rotated and offset."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_scalars(run_folder) -> dict[tuple[str, int], np.float32]:
    """{(tag, step): value} of the one event file in a run's folder, every record's length and
    data checksums checked."""
    from tensorboardX.proto.event_pb2 import Event

    (events,) = run_folder.glob("events.out.tfevents.*")
    data, at, scalars = events.read_bytes(), 0, {}
    while at < len(data):
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8 : at + 12])
        record = data[at + 12 : at + 12 + length]
        (record_crc,) = struct.unpack("<I", data[at + 12 + length : at + 16 + length])
        assert header_crc == masked_crc32c(header) and record_crc == masked_crc32c(record)
        at += 16 + length
        event = Event.FromString(record)
        for value in event.summary.value:
            assert (value.tag, event.step) not in scalars
            scalars[value.tag, event.step] = np.float32(value.simple_value)
    assert at == len(data)
    return scalars


def expected_scalars(metrics: pd.DataFrame, run_id: str) -> dict[tuple[str, int], np.float32]:
    """{(metric, step): value} of one run's rows of the metrics table, as float32."""
    rows = metrics[metrics["run_id"] == run_id]
    keys = zip(rows["metric"], rows["step"].astype(int), strict=True)
    return dict(zip(keys, rows["value"].to_numpy(np.float32), strict=True))


def assert_same(scalars: dict, expected: dict) -> None:
    keys = sorted(expected)
    assert sorted(scalars) == keys
    np.testing.assert_array_equal([scalars[k] for k in keys], [expected[k] for k in keys])


def test_every_run_is_a_folder_of_scalars_equal_to_its_metrics(folder, tmp_path, capsys, caplog):
    logdir = tmp_path / "tb"
    assert cli.main(["export", "--tensorboard", str(folder), "--out", str(logdir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [str(logdir / f) for f in RUN_FOLDERS] + [
        f"view them: tensorboard --logdir {logdir}"
    ]
    results = store.load(folder)
    folders = export.run_folders(results.runs)
    assert sorted(folders.values()) == RUN_FOLDERS
    expected = {f: expected_scalars(results.metrics, run_id) for run_id, f in folders.items()}
    for name in RUN_FOLDERS:
        assert_same(read_scalars(logdir / name), expected[name])
    # what the scalars hold: series, telemetry and the final eval_loss, NaN and inf as they are
    bf16 = read_scalars(logdir / RUN_FOLDERS[1])  # seeds (1, 1, 1): level 4
    assert bf16["loss", 0] == 4.0 and bf16["grad_norm", 3] == 2.0 and bf16["eval_loss", 4] == 0.4
    assert bf16["quant/layers.0/fprop/x/rel_err", 2] == np.float32(0.48)
    assert bf16["grad/layers.0.kernel/gnr", 0] == np.inf and bf16["depth/layers.0", 2] == 0.0
    assert np.isnan(read_scalars(logdir / RUN_FOLDERS[3])["loss", 3])
    assert not caplog.records  # NaN and inf are data here, not worth a warning each
    # again: each folder's earlier event file is replaced (read_scalars wants exactly one)
    assert cli.main(["export", "--tensorboard", str(folder), "--out", str(logdir)]) == 0
    for name in RUN_FOLDERS:
        assert_same(read_scalars(logdir / name), expected[name])


def test_the_default_logdir_is_inside_the_results_folder(folder, capsys):
    assert cli.main(["export", "--tensorboard", str(folder)]) == 0
    logdir = folder / "tensorboard"
    assert capsys.readouterr().out.splitlines()[-1] == f"view them: tensorboard --logdir {logdir}"
    written = sorted(p.parent for p in logdir.glob("*/*/events.out.tfevents.*"))
    assert written == [logdir / f for f in RUN_FOLDERS]


def test_run_folders_are_distinct_and_safe_names():
    runs = pd.DataFrame(
        {
            "run_id": ["a", "b", "c"],
            "cell": ["recipe=bf16", "BF16", "x/y: <z>"],
            "seed_init": [0, 0, 2],
            "seed_data": [0, 0, 0],
            "seed_quant": [0, 0, 1],
        }
    )
    assert export.run_folders(runs) == {
        "a": "BF16/init0_data0_quant0",
        "b": "BF16/init0_data0_quant0_b",  # the same name in words: the run id tells them apart
        "c": "x_y_ _z_/init2_data0_quant1",
    }
    assert export.run_folders(runs.iloc[:1], {"recipe=bf16": "base"}) == {
        "a": "base/init0_data0_quant0"
    }


def test_without_tensorboardx_the_error_says_how_to_install_it(folder, tmp_path, capsys):
    logdir = tmp_path / "tb"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "tensorboardX", None)  # `import tensorboardX` fails
        assert cli.main(["export", "--tensorboard", str(folder), "--out", str(logdir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "fp4lab export: error: the TensorBoard export needs tensorboardX, which is not "
        'installed: pip install "fp4lab[tensorboard]"'
    ]
    assert not logdir.exists()


def test_export_needs_a_format_and_a_results_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["export", str(tmp_path)])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "fp4lab export: error: one of the arguments --tensorboard is required"
    )
    assert cli.main(["export", "--tensorboard", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"fp4lab export: error: {tmp_path} is not a results folder")
    assert list(tmp_path.iterdir()) == []
