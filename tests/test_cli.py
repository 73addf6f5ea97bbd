"""The command line: on bad input one clear line on stderr, exit status 2, nothing run; help
with examples and help text for every option; options never abbreviated; `--set` overrides of
config fields for every cell."""

import os
import re
import textwrap

import pytest

from fp4lab import cli

CONFIG = """
from fp4lab.train.config import Config

def get_config():
    {body}
"""


def write(tmp_path, text: str, name="exp.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_get_config_raising_is_one_line(tmp_path, capsys):
    path = write(tmp_path, CONFIG.format(body="return 1 / 0") + "\ndef sweep(add):\n    add()\n")
    assert cli.main(["run", str(path), "--out", str(tmp_path / "o")]) == 2
    line = one_error_line(capsys)
    assert "exp.py: get_config() raised ZeroDivisionError: division by zero" in line
    assert not (tmp_path / "o").exists()


def test_a_file_without_sweep_is_told_it_needs_sweep(tmp_path, capsys):
    path = write(tmp_path, CONFIG.format(body="return Config()"))
    assert cli.main(["run", str(path)]) == 2
    assert "defines no sweep(); an experiment needs get_config() and sweep(add)" in (
        one_error_line(capsys)
    )


def test_add_line_is_named_for_a_relative_path(tmp_path, capsys, monkeypatch):
    text = CONFIG.format(body="return Config()") + "\ndef sweep(add):\n    add(lr=-1.0)\n"
    write(tmp_path, text)
    monkeypatch.chdir(tmp_path)
    line_no = text.splitlines().index("    add(lr=-1.0)") + 1
    assert cli.main(["run", "exp.py", "--out", "o"]) == 2
    assert f"exp.py:{line_no}: cell lr=-1.0: Config.lr=-1.0" in one_error_line(capsys)


def test_show_of_a_file_and_of_a_missing_folder(tmp_path, capsys):
    (tmp_path / "r.json").write_text("{}")
    assert cli.main(["show", str(tmp_path / "r.json")]) == 2
    assert "r.json is a file" in one_error_line(capsys)
    assert cli.main(["show", str(tmp_path / "nope")]) == 2
    assert "no results folder" in one_error_line(capsys)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_one_line(tmp_path, capsys):
    path = write(tmp_path, CONFIG.format(body="return Config()") + "\ndef sweep(add):\n    add()\n")
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        assert cli.main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    finally:
        out.chmod(0o755)
    assert "cannot write" in one_error_line(capsys)


# ---------------------------------------------------------------------------------------------
# Help, options, folders.

TINY = CONFIG.format(
    body='return Config(task="teacher", din=16, dout=16, teacher_hidden=(16,), hidden=(16,), '
    "batch_size=16, steps=2, eval_batches=1, seed_batch=2)"
)


def experiment(tmp_path, cells='add(recipe="fp32")\n    add(recipe="bf16", lr=1e-2)'):
    return write(tmp_path, TINY + "\nSEEDS = 2\n\ndef sweep(add):\n    " + cells + "\n")


def help_of(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "-h"])
    assert e.value.code == 0
    return capsys.readouterr().out


def argparse_error(capsys, argv) -> str:
    """The error line of a command line argparse rejects (exit status 2)."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


COMMANDS = ("formats", "demo", "run", "ls", "show", "plot", "report", "export")


def listed_commands(capsys) -> dict[str, str]:
    """{command: its help text} as bare `fp4lab` lists them."""
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    section = out.split("commands:")[1].split("examples:")[0]
    names = re.findall(r"^    (\S+)", section, re.M)
    helps = dict(re.findall(r"^    (\S+) +(\S.*)$", section, re.M))
    assert names == list(helps), f"commands without help: {set(names) - set(helps)}"
    return helps


def test_bare_fp4lab_prints_help_with_examples(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: fp4lab") and "examples:" in out
    assert "fp4lab run experiments/quickstart.py --set lr=1e-3 --set d_model=128" in out
    assert "element formats" in out and "e2m1" not in out  # the format list is `fp4lab formats`
    helps = listed_commands(capsys)
    assert set(COMMANDS) <= set(helps) and helps["formats"] == "list the element formats"
    assert "fp4lab export --tensorboard results/quickstart" in out


def test_formats_lists_the_element_formats(capsys):
    assert cli.main(["formats"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fp4lab ") and "element formats: " in out and "e2m1" in out


def options_without_help(text: str) -> list[str]:
    """Option lines of an argparse help text with no help text after or below them."""
    lines = text.split("options:")[1].splitlines()
    bad = []
    for i, line in enumerate(lines):
        match = re.match(r"^  (-\S+(?: \S+)*)(?: {2,}(\S.*))?$", line)
        if match and not match.group(2):
            below = lines[i + 1] if i + 1 < len(lines) else ""
            if not re.match(r"^ {10,}\S", below):
                bad.append(match.group(1))
    return bad


def test_every_option_of_every_command_has_help_text(capsys):
    top = help_of(capsys)
    assert options_without_help(top) == [] and "--version" in top
    for command in listed_commands(capsys):
        text = help_of(capsys, command)
        assert text.startswith(f"usage: fp4lab {command}")
        assert options_without_help(text) == [], command
        assert re.search(r"^  -h, --help +show this help", text, re.M)


def test_help_of_run_explains_executor_and_set(capsys):
    text = " ".join(help_of(capsys, "run").split())
    assert "--executor {local,ray} where cells compute: local" in text
    assert "--set FIELD=VALUE set a config field in every cell" in text


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "1025", "2147483647"])
@pytest.mark.parametrize("command", ["run", "replicate"])
def test_workers_must_be_a_positive_integer_up_to_1024(tmp_path, capsys, value, command):
    path = experiment(tmp_path)
    argv = [str(path)] if command == "run" else [str(tmp_path), "--seeds-from", "4"]
    line = argparse_error(capsys, [command, *argv, "--workers", value])
    what = "an integer >= 1 and <= 1024"
    assert line == f"fp4lab {command}: error: argument --workers: must be {what}, got '{value}'"
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--seeds", "0", "must be an integer >= 1, got '0'"),
        ("--steps", "-3", "must be an integer >= 1, got '-3'"),
        ("--max-retries", "-1", "must be an integer >= 0, got '-1'"),
        ("--ray-cpus", "nan", "must be a number >= 0, got 'nan'"),
        ("--ray-gpus", "-0.5", "must be a number >= 0, got '-0.5'"),
    ],
)
def test_numeric_options_are_checked(tmp_path, capsys, option, value, message):
    line = argparse_error(capsys, ["run", str(experiment(tmp_path)), option, value])
    assert line == f"fp4lab run: error: argument {option}: {message}"


@pytest.mark.parametrize(
    "argv, word",
    [
        (["run", "{path}", "--seed", "3", "--dry-run"], "--seed"),
        (["run", "{path}", "--dry", "--seeds", "1"], "--dry"),
        (["run", "{path}", "--work", "2", "--dry-run"], "--work"),
        (["show", "{out}", "--stal"], "--stal"),
    ],
)
def test_options_are_never_abbreviated(tmp_path, capsys, argv, word):
    path = experiment(tmp_path)
    argv = [a.format(path=path, out=tmp_path) for a in argv]
    line = argparse_error(capsys, argv)
    assert line.startswith("fp4lab: error: unrecognized arguments: ") and word in line
    assert not (tmp_path / "results").exists()


def test_show_report_plot_export_of_a_folder_that_is_not_a_results_folder(tmp_path, capsys):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    for command, *options in (["show"], ["report"], ["plot"], ["export", "--tensorboard"]):
        assert cli.main([command, *options, str(folder)]) == 2
        line = one_error_line(capsys)
        assert line.startswith(f"fp4lab {command}: error: {folder} is not a results folder")
        assert "(no experiment.json, no runs/)" in line
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt"]  # no report, figures, logs


def test_a_folder_of_results_folders_names_them(tmp_path, capsys):
    (tmp_path / "one" / "runs").mkdir(parents=True)
    (tmp_path / "two" / "runs").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    assert cli.main(["show", str(tmp_path)]) == 2
    line = one_error_line(capsys)
    assert line.endswith(f"the results folders in it: {tmp_path / 'one'}, {tmp_path / 'two'}")


def test_a_results_folder_whose_runs_have_not_finished(tmp_path, capsys):
    from fp4lab import sweep
    from fp4lab.sweep import store

    out = tmp_path / "res"
    store.Store(out).write_experiment(sweep.load_experiment(experiment(tmp_path)).manifest())
    assert cli.main(["show", str(out)]) == 0
    assert "no finished runs" in capsys.readouterr().out
    assert cli.main(["report", str(out)]) == 1
    line = one_error_line(capsys)
    assert line == (
        f"fp4lab report: error: {out} holds no runs of its experiment yet; nothing to report "
        f"(fp4lab ls {out})"
    )
    assert not (out / "report.html").exists()
    assert cli.main(["export", "--tensorboard", str(out)]) == 1
    assert one_error_line(capsys) == (
        f"fp4lab export: error: {out} holds no runs of its experiment yet; nothing to export "
        f"(fp4lab ls {out})"
    )
    assert not (out / "tensorboard").exists()


# ---------------------------------------------------------------------------------------------
# --set: overrides of config fields for every cell.


@pytest.mark.parametrize(
    "item, field, value",
    [
        ("lr=1e-3", "lr", 1e-3),
        ("lr=1", "lr", 1),  # the config makes it 1.0
        ("d_model=128", "d_model", 128),
        ("hidden=64,64", "hidden", (64, 64)),
        ("hidden=(32,)", "hidden", (32,)),
        ("shadow=true", "shadow", True),
        ("shadow=False", "shadow", False),
        ("target_loss=None", "target_loss", None),
        ("target_loss=2.5", "target_loss", 2.5),
        ("recipe=nvfp4", "recipe", "nvfp4"),
        ('recipe="nvfp4"', "recipe", "nvfp4"),
        ("text_path=2024", "text_path", "2024"),  # a string field keeps its text
        ("backward=", "backward", ""),
        ('gemms={"wgrad": "bf16"}', "gemms", {"wgrad": "bf16"}),
        ('rules=((r"lm_head", None),)', "rules", (("lm_head", None),)),
        ("lr=fast", "lr", "fast"),  # not a literal: the text, which the config rejects
    ],
)
def test_set_values_are_parsed_as_the_fields_type(item, field, value):
    from fp4lab import sweep

    parsed = sweep.parse_overrides([item])
    assert parsed == {field: value} and type(parsed[field]) is type(value)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "lrr=1e-3"], "--set lrr=1e-3: Config has no field 'lrr'; did you mean 'lr'?"),
        (["--set", "zzzz=1"], "--set zzzz=1: Config has no field 'zzzz'; the fields: task, "),
        (["--set", "lr"], "--set 'lr': expected FIELD=VALUE, e.g. --set lr=1e-3"),
        (["--set", "=3"], "--set '=3': expected FIELD=VALUE"),
        (["--set", "lr=1", "--set", "lr=2"], "--set lr=2: lr is already set (lr=1)"),
        (
            ["--set", "lr=fast"],
            "exp.py: the overrides for every cell (lr=fast): Config.lr='fast' (str); must be float",
        ),
        (["--set", "lr=-1"], "the overrides for every cell (lr=-1): Config.lr=-1.0"),
        (["--set", "hidden=64"], "Config.hidden=64 (int); must be tuple"),
        (["--set", "recipe=nvfp5"], "Config.recipe='nvfp5'; allowed: 'fp32'"),
        (["--steps", "4", "--set", "steps=5"], "--steps 4 and --set steps=5: give the steps once"),
    ],
)
def test_a_bad_set_is_one_clear_line_and_runs_nothing(tmp_path, capsys, argv, message):
    path = experiment(tmp_path)
    assert cli.main(["run", str(path), "--out", str(tmp_path / "o"), *argv]) == 2
    line = one_error_line(capsys)
    assert line.startswith("fp4lab run: error: ") and message in line
    assert not (tmp_path / "o").exists()


def test_set_changes_every_cell_and_its_run_ids(tmp_path):
    from fp4lab import sweep

    path = experiment(tmp_path)
    plain = sweep.load_experiment(path)
    overrides = sweep.parse_overrides(["lr=1e-3", "hidden=(8, 8)"])
    exp = sweep.load_experiment(path, overrides=overrides)
    assert [c.config.lr for c in plain.cells] == [3e-3, 1e-2]
    assert [c.config.lr for c in exp.cells] == [1e-3, 1e-3]  # the cell's own lr=1e-2 too
    assert all(c.config.hidden == (8, 8) for c in exp.cells)
    assert exp.base.lr == 1e-3 and exp.base.hidden == (8, 8)
    assert [c.label for c in exp.cells] == ["recipe=fp32", "recipe=bf16"]
    assert [c.overrides for c in exp.cells] == [{"recipe": "fp32"}, {"recipe": "bf16"}]
    assert exp.overrides == {"lr": 1e-3, "hidden": [8, 8]}
    assert exp.manifest()["overrides"] == {"lr": 1e-3, "hidden": [8, 8]}
    assert "overrides" not in plain.manifest()
    ids = [r for c in exp.cells for r in c.run_ids()]
    assert len(set(ids)) == 4 and not set(ids) & {r for c in plain.cells for r in c.run_ids()}
    again = sweep.load_experiment(path, overrides=sweep.parse_overrides(["hidden=8,8", "lr=0.001"]))
    assert [r for c in again.cells for r in c.run_ids()] == ids  # the same values, the same ids
    # overrides that make two cells the same are an error that says why
    twins = experiment(tmp_path, "add(lr=1e-3)\n    add(lr=1e-2)")
    with pytest.raises(sweep.ExperimentError, match=r"cells with the same label \['base'\] "):
        sweep.load_experiment(twins, overrides={"lr": 3e-3})


def test_dry_run_shows_the_overrides(tmp_path, capsys):
    path = experiment(tmp_path)
    argv = ["run", str(path), "--out", str(tmp_path / "o"), "--dry-run", "--no-probe"]
    assert cli.main([*argv, "--set", "lr=1e-3", "--set", "hidden=8,8", "--steps", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"exp: 2 cells, 4 runs -> {tmp_path / 'o'}"
    assert out[1] == "  for every cell: lr=0.001, hidden=(8, 8), steps=3"
    assert out[2].startswith("  recipe=fp32  seeds(init/data/quant) 0/0/0 1/1/1  [0/2 done]")
    assert cli.main(argv) == 0
    assert "for every cell" not in capsys.readouterr().out


def test_verbose_says_which_quantizer_runs_and_why(tmp_path, capsys, monkeypatch):
    from fp4lab.core import kernel_route

    monkeypatch.setenv("FP4LAB_QUANTIZER", "reference")
    path = experiment(tmp_path)
    argv = ["run", str(path), "--out", str(tmp_path / "o"), "--dry-run", "--no-probe"]
    assert cli.main([*argv, "--verbose"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "fp4lab: the jnp quantizer: FP4LAB_QUANTIZER=reference"
    assert out[0] == f"fp4lab: {kernel_route.choice()[1]}"
    assert cli.main(argv) == 0
    assert "quantizer" not in capsys.readouterr().out


def test_xla_log_is_a_deprecated_no_op(tmp_path, capsys):
    """XLA's lines are no longer filtered: the old flag parses, says so, and changes nothing."""
    argv = [
        "run",
        str(experiment(tmp_path)),
        "--out",
        str(tmp_path / "o"),
        "--dry-run",
        "--no-probe",
    ]
    assert cli.main([*argv, "--xla-log"]) == 0
    captured = capsys.readouterr()
    assert "--xla-log is no longer needed" in captured.err
    assert cli.main(argv) == 0
    assert captured.out == capsys.readouterr().out
    assert "--xla-log" not in help_of(capsys, "run")


def test_run_with_set_stores_the_overridden_config(tmp_path, capsys):
    """End to end: two steps of a tiny MLP, then show and report of the folder."""
    from fp4lab import sweep
    from fp4lab.sweep import store

    path = experiment(tmp_path, 'add(recipe="fp32", lr=1e-2)')
    out = tmp_path / "res"
    argv = ["run", str(path), "--out", str(out), "--quiet", "--no-figures"]
    assert cli.main([*argv, "--set", "lr=1e-3", "--set", "steps=3"]) == 0
    capsys.readouterr()
    results = store.load(out)
    assert len(results.runs) == 2 and (results.runs["status"] == "ok").all()
    assert (results.runs["lr"] == 1e-3).all() and (results.runs["steps"] == 3).all()
    assert results.experiment["overrides"] == {"lr": 1e-3, "steps": 3}
    expected = sweep.load_experiment(path, overrides={"lr": 1e-3, "steps": 3})
    assert sorted(results.runs["run_id"]) == sorted(expected.cells[0].run_ids())
    assert "lr" in results.config_fields and "seed_init" not in results.config_fields
    assert cli.main(["show", str(out)]) == 0
    assert "recipe=fp32" in capsys.readouterr().out
    assert cli.main(["report", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "report.html")
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "<h2>Config and provenance</h2>" in page and "<code>lr=0.001, steps=3</code>" in page


def test_run_with_telemetry_writes_the_drift_and_plot_draws_it(tmp_path, capsys):
    """--telemetry K: operand statistics, shadow gradients and accumulated drift every K steps;
    `fp4lab plot` draws the drift heatmaps and the drift-against-depth figure."""
    from fp4lab.sweep import store

    path = experiment(tmp_path, 'add(recipe="nvfp4")')
    out = tmp_path / "res"
    argv = ["run", str(path), "--out", str(out), "--quiet", "--no-figures", "--seeds", "1"]
    assert cli.main([*argv, "--telemetry", "1", "--set", "steps=2"]) == 0
    results = store.load(out)
    assert (results.runs["telemetry_every"] == 1).all() and results.runs["shadow"].all()
    names = set(results.metrics["metric"])
    for prefix in ("quant/", "grad/", "acc/"):
        assert any(n.startswith(prefix) for n in names), prefix
    assert {"acc/layers.0/fwd/rel_drift", "acc/layers.1/bwd/cos"} <= names
    capsys.readouterr()
    assert cli.main(["plot", str(out)]) == 0
    written = {p.name for p in (out / "figures").glob("*.png")}
    assert {"heatmap_rel_drift_recipe_nvfp4.png", "drift_vs_depth.png"} <= written, written
    assert cli.main([*argv, "--telemetry", "1", "--set", "shadow=False"]) == 2
    assert "give it once" in capsys.readouterr().err


def test_a_sweep_whose_every_run_failed_says_so(tmp_path, capsys):
    # MXFP4's 32-blocks do not divide the 16-wide layers: the run fails with that error
    path = experiment(tmp_path, 'add(recipe="mxfp4")')
    out = tmp_path / "res"
    argv = ["run", str(path), "--out", str(out), "--quiet", "--no-figures", "--seeds", "1"]
    assert cli.main(argv) == 1
    assert "no run finished; 1 failed" in capsys.readouterr().out
    assert cli.main(["show", str(out)]) == 0
    assert "no run finished; 1 failed" in capsys.readouterr().out


def test_run_and_show_say_in_words_which_cells_differ(tmp_path, capsys):
    path = experiment(tmp_path, 'add(recipe="fp32", seeds=3)\n    add(recipe="bf16", seeds=3)')
    out = tmp_path / "res"
    assert cli.main(["run", str(path), "--out", str(out), "--quiet", "--no-figures"]) == 0
    ran = capsys.readouterr().out
    assert cli.main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    for text in (ran, shown):
        # bf16 is the baseline (the first of BASELINE_RECIPES), whatever the cells' order
        words = text.split("which cells differ, against recipe=bf16 (")[1].splitlines()
        assert words[1].startswith("  recipe=fp32: ")  # one line for the other cell, in words
