"""Plots and the report: figures render to PNG without a warning; the report holds them all."""

import dataclasses
import io
import itertools
import re

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fp4lab import analysis
from fp4lab.analysis import plots, report
from fp4lab.schema import STATS

pytestmark = pytest.mark.filterwarnings("error")  # a warning while drawing is a failure

LAYERS = ("blocks.0.mlp.up", "blocks.1.mlp.up", "blocks.10.mlp.up", "lm_head")
OPERANDS = (("fprop", "x"), ("fprop", "w"), ("dgrad", "dy"), ("dgrad", "w"), ("wgrad", "x"))
OPERANDS += (("wgrad", "dy"),)


@dataclasses.dataclass
class Results:
    """What the results store's loader returns, as far as plots and reports read it."""

    runs: pd.DataFrame
    metrics: pd.DataFrame


def make_results(telemetry: bool = True, seeds: int = 3, steps: int = 12) -> Results:
    """bf16, nvfp4 and mxfp4 cells; one mxfp4 seed diverges (NaN loss, never reaches target).

    Telemetry: quantizer statistics in the mxfp4 cell, shadow gradients in both FP4 cells.
    """
    gen = np.random.default_rng(0)
    runs, metrics = [], []
    for recipe, s in itertools.product(("bf16", "nvfp4", "mxfp4"), range(seeds)):
        rid, eff = f"{recipe}-{s}", {"bf16": 0.0, "nvfp4": 0.05, "mxfp4": 0.2}[recipe]
        div = recipe == "mxfp4" and s == 0
        loss = 2 + 2 * np.exp(-np.arange(steps) / 4) + eff + 0.02 * gen.normal(size=steps)
        loss[steps // 2 :] = np.nan if div else loss[steps // 2 :]
        runs.append(
            dict(run_id=rid, experiment="synthetic", cell=f"recipe={recipe}", status="ok")
            | dict(seed_init=s, seed_data=s, seed_quant=s, recipe=recipe, lr=1e-3, steps=steps)
            | dict(final_loss=loss[-1], loss_floor=2.0, loss_gap=loss[-1] - 2, diverged=div)
            | dict(divergence_step=steps // 2 if div else np.nan, divergence_kind="")
            | dict(tokens_to_target=np.nan if div else 1000 * (1 + eff) + 10 * s)
            | dict(target_loss=2.3, tokens_per_step=64, wall_s=1.0)
        )
        for t in range(steps):
            metrics.append((rid, t, "loss", loss[t]))
            if t % 4 == 0:
                metrics.append((rid, t, "eval_loss", loss[t] + 0.01))
            if not telemetry or recipe == "bf16" or t % 2:
                continue
            for i, layer in enumerate(LAYERS):
                for gemm, op in OPERANDS if recipe == "mxfp4" else ():  # nvfp4: shadow only
                    metrics.append(
                        (rid, t, f"quant/{layer}/{gemm}/{op}/rel_err", 0.1 + eff + i / 50)
                    )
                    metrics.append((rid, t, f"quant/{layer}/{gemm}/{op}/bias", -0.007 + i / 1000))
                gnr = (
                    np.inf if layer == "lm_head" else 5 * np.exp(-t / 6) * (1 + i) / (1 + 10 * eff)
                )
                metrics.append((rid, t, f"grad/{layer}/gnr", gnr))
    return Results(
        pd.DataFrame(runs), pd.DataFrame(metrics, columns=["run_id", "step", "metric", "value"])
    )


@pytest.fixture(scope="module")
def results():
    return make_results()


def _png(fig: Figure) -> bytes:
    assert isinstance(fig, Figure) and isinstance(fig.canvas, FigureCanvasAgg)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=60)
    data = buf.getvalue()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    return data


def _texts(fig: Figure) -> str:
    return " ".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))


def test_gradient_flow_heatmap_facets_the_gemms(results):
    fig = plots.gradient_flow_heatmap(
        results.metrics, "rel_err", runs=results.runs, cell="recipe=mxfp4"
    )
    _png(fig)
    titles = {ax.get_title() for ax in fig.axes}
    assert {f"{g} · {o}" for g, o in OPERANDS} <= titles
    panel = next(ax for ax in fig.axes if ax.get_title() == "wgrad · dy")
    values = panel.collections[0].get_array()
    assert values.shape == (len(LAYERS), 6)  # 4 layers x 6 logged steps
    # first row is the first layer; blocks.10 after blocks.1 (natural order)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == list(LAYERS)
    # the grad statistic has no GEMM: one panel (plus the colour bar); inf is masked, not drawn
    fig = plots.gradient_flow_heatmap(results.metrics, "gnr")
    _png(fig)
    assert [ax.get_title() for ax in fig.axes][0] == "shadow gradient"
    with pytest.raises(ValueError, match="underflow"):
        plots.gradient_flow_heatmap(results.metrics, "underflow")


def _hatched_rows(ax) -> set[int]:
    """The rows of a heatmap panel covered by hatched "not quantized" rectangles, each checked
    to span every logged step."""
    rows = set()
    x_lo, x_hi = ax.collections[0].get_coordinates()[0, [0, -1], 0]
    for patch in ax.patches:
        assert patch.get_hatch() == "////" and patch.get_facecolor()[:3] == (0.93, 0.93, 0.93)
        assert (patch.get_x(), patch.get_x() + patch.get_width()) == (x_lo, x_hi)
        rows.add(int(patch.get_y()))
    return rows


def test_operands_without_a_value_are_hatched_never_the_colour_of_0():
    """lm_head ran in high precision (a depth/ row, no telemetry); blocks.1 has no wgrad·dy rows;
    blocks.0's Dgrad GEMM is kept in high precision, which the ops record as zeros in every
    statistic. All three are hatched "not quantized", none drawn as the colour of 0."""
    rows = [("r", 0, f"depth/{layer}", d) for d, layer in enumerate(("b.0", "b.1", "lm_head"))]
    for t, (i, layer), (gemm, op), stat in itertools.product(
        (0, 2), enumerate(("b.0", "b.1")), OPERANDS, STATS
    ):
        if (layer, gemm, op) == ("b.1", "wgrad", "dy"):
            continue
        value = 0.0 if (layer, gemm) == ("b.0", "dgrad") else 0.1 + i / 10 + t / 100
        rows.append(("r", t, f"quant/{layer}/{gemm}/{op}/{stat}", value))
    metrics = pd.DataFrame(rows, columns=["run_id", "step", "metric", "value"])
    fig = plots.gradient_flow_heatmap(metrics, "rel_err")
    _png(fig)
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert [t.get_text() for t in panels["fprop · x"].get_yticklabels()] == [
        "b.0",
        "b.1",
        "lm_head",
    ]
    expected = {"fprop · x": {2}, "fprop · w": {2}, "dgrad · dy": {0, 2}, "dgrad · w": {0, 2}}
    expected |= {"wgrad · x": {2}, "wgrad · dy": {1, 2}}
    for title, hatched in expected.items():
        ax = panels[title]
        assert _hatched_rows(ax) == hatched, title
        values = ax.collections[0].get_array()
        assert set(np.flatnonzero(np.ma.getmaskarray(values).all(axis=1))) == hatched
        assert not np.ma.getmaskarray(values).any(axis=1)[sorted({0, 1} - hatched)].any()
    np.testing.assert_allclose(panels["fprop · x"].collections[0].get_array()[1], [0.2, 0.22])
    norm = panels["fprop · x"].collections[0].norm
    assert (norm.vmin, norm.vmax) == pytest.approx((0.1, 0.22))  # the zeros are not on the scale
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["not quantized"]
    assert legend.legend_handles[0].get_hatch() == "////"
    with pytest.raises(ValueError, match="no quantized operand"):
        plots.gradient_flow_heatmap(metrics[metrics["metric"].str.contains("b.0/dgrad")], "bias")


def test_signed_statistic_gets_a_centred_map(results):
    fig = plots.gradient_flow_heatmap(
        results.metrics, "bias", runs=results.runs, cell="recipe=mxfp4"
    )
    _png(fig)
    norm = fig.axes[0].collections[0].norm
    assert norm.vcenter == 0.0 and norm.vmin == -norm.vmax


def test_loss_curves_show_seed_bands_and_divergence(results):
    for band in ("minmax", "iqr"):
        fig = plots.loss_curves(results.runs, results.metrics, band=band)
        _png(fig)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    # cells in words, with their seeds and divergences
    assert labels == [
        "BF16 (n=3)",
        "NVFP4 (n=3)",
        "MXFP4 (n=3, 1 diverged)",
        "loss floor (optimum)",
    ]
    assert ax.get_ylabel() == "loss (nats)"
    assert len(ax.collections) == 3  # one band per cell
    assert any(np.allclose(line.get_ydata(), 2.0) for line in ax.get_lines())  # the floor
    _png(plots.loss_curves(results.runs, results.metrics, metric="eval_loss", gap=True))
    with pytest.raises(ValueError, match="band"):
        plots.loss_curves(results.runs, results.metrics, band="sd")


def test_ladder_draws_intervals_and_never(results):
    table = analysis.tokens_to_target(results.runs, baseline="recipe=bf16")
    fig = plots.ladder(table, "overhead", percent=True)
    _png(fig)
    text = _texts(fig)
    assert "0.0%  [0.0%, 0.0%]" in text and "∞]" in text  # the mxfp4 upper end is open
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["BF16", "NVFP4", "MXFP4"]
    odd = pd.DataFrame({"cell": ["a", "b", "c"], "x": [0.5, np.inf, np.nan]})
    fig = plots.ladder(odd, "x")
    _png(fig)
    assert "never" in _texts(fig) and "n/a" in _texts(fig)


def test_gnr_curves_draw_the_sqrt3_threshold(results):
    fig = plots.gnr_curves(results.metrics, results.runs)
    _png(fig)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["NVFP4", "MXFP4"]
    for ax in panels:
        assert any(np.allclose(line.get_ydata(), np.sqrt(3)) for line in ax.get_lines())
        assert ax.get_yscale() == "log"
        assert len(ax.get_lines()) == 4  # three quantized layers (lm_head: no noise) and sqrt(3)


def test_labels_override_the_cell_names_of_every_figure(results):
    labels = {"recipe=bf16": "baseline", "recipe=mxfp4": "MX (ours)"}
    legend = plots.loss_curves(results.runs, results.metrics, labels=labels).axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()][:3] == [
        "baseline (n=3)",
        "NVFP4 (n=3)",  # not named in `labels`: in words
        "MX (ours) (n=3, 1 diverged)",
    ]
    fig = plots.gnr_curves(results.metrics, results.runs, labels=labels)
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == ["NVFP4", "MX (ours)"]
    fig = plots.gradient_flow_heatmap(
        results.metrics, "rel_err", runs=results.runs, cell="recipe=mxfp4", labels=labels
    )
    assert fig.get_suptitle() == "relative error by layer and step — MX (ours)"
    table = analysis.tokens_to_target(results.runs, baseline="recipe=bf16")
    fig = plots.ladder(table, "tokens", labels=labels)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [
        "baseline",
        "NVFP4",
        "MX (ours)",
    ]
    assert fig.axes[0].get_xlabel() == "tokens"
    figures = dict(plots.iter_figures(results, labels))
    texts = _texts(figures["loss_gap"])
    assert "baseline" in texts and "MX (ours) (1 non-finite)" in texts and "recipe=" not in texts
    assert figures["loss_gap"].axes[0].get_xlabel() == "loss gap to the floor (nats)"


def test_format_staircase_takes_a_precomputed_frame():
    scale = np.logspace(-8, 4, 25)
    frame = pd.DataFrame(
        {"format": np.repeat(["fp8 e4m3", "nvfp4"], 25), "scale": np.tile(scale, 2)}
        | {"rel_err": np.concatenate([np.where(scale < 1e-3, 1.0, 0.03), np.full(25, 0.1)])}
    )
    fig = plots.format_staircase(frame)
    _png(fig)
    assert fig.axes[0].get_xscale() == "log" and len(fig.axes[0].get_lines()) == 2


@pytest.fixture(scope="module")
def written(results, tmp_path_factory):
    return plots.standard_figures(results, tmp_path_factory.mktemp("figures"))


def test_standard_figures_write_the_set(written):
    names = [p.stem for p in written]
    expected = ["loss_curves", "eval_loss_curves", "divergence_rate", "loss_gap"]
    expected += ["tokens_to_target", "overhead", "variance_loss_gap"]
    expected += ["heatmap_rel_err_recipe_mxfp4", "heatmap_bias_recipe_mxfp4"]  # nvfp4: none
    assert names == expected + ["gradient_to_noise"]
    for path in written:
        assert path.read_bytes()[:4] == b"\x89PNG"


def test_standard_figures_skip_absent_data(tmp_path):
    plain = make_results(telemetry=False)
    names = [p.stem for p in plots.standard_figures(plain, tmp_path / "plain")]
    assert not any(n.startswith(("heatmap", "gradient")) for n in names) and "loss_curves" in names
    # one recipe, no target, no floor, no metrics at all: still no error
    runs = plain.runs[plain.runs["recipe"] == "nvfp4"].assign(target_loss=np.nan, loss_gap=np.nan)
    empty = Results(runs, plain.metrics.iloc[:0])
    names = [p.stem for p in plots.standard_figures(empty, tmp_path / "bare")]
    assert names == []  # nothing diverged: no divergence figure of zeros
    # one eval point per run is not a curve; nothing diverged: no divergence figure
    one_eval = plain.metrics[
        (plain.metrics["metric"] != "eval_loss") | (plain.metrics["step"] == 0)
    ]
    alive = plain.runs.assign(diverged=False)
    names = [p.stem for p in plots.standard_figures(Results(alive, one_eval), tmp_path / "one")]
    assert "loss_curves" in names and "eval_loss_curves" not in names
    assert "divergence_rate" not in names
    assert plots.standard_figures(Results(runs.iloc[:0], empty.metrics), tmp_path / "none") == []


def test_report_embeds_every_figure_and_needs_nothing_online(results, written, tmp_path):
    path = report.write_report(results, tmp_path)
    assert path == tmp_path / "report.html"
    page = path.read_text(encoding="utf-8")
    images = re.findall(r"<img [^>]*src='data:image/png;base64,[A-Za-z0-9+/=]+'", page)
    assert len(images) == page.count("<img") == len(written)
    assert not re.search(r"(src|href)=['\"]?(https?:|//)|<script|<link", page)
    for heading in ("Cells", "What matters", "Figures", "Methods"):
        assert f"<h2>{heading}</h2>" in page
    assert "recipe=mxfp4" in page and "(1 never)" in page and "baseline" in page


def test_report_of_a_bare_sweep(tmp_path):
    plain = make_results(telemetry=False)
    runs = plain.runs[plain.runs["recipe"] == "nvfp4"].assign(target_loss=np.nan, loss_gap=np.nan)
    path = report.write_report(Results(runs, plain.metrics.iloc[:0]), tmp_path / "bare.html")
    assert path == tmp_path / "bare.html"
    page = path.read_text(encoding="utf-8")
    assert page.count("<img") == 0 and "tokens to target" not in page  # nothing to draw
    # three seed triples (i, i, i): one seed factor with 3 levels, judged
    assert "<td>init=data=quant</td>" in page and "too few seeds" not in page.split("Methods")[0]
    two = report.write_report(Results(runs.iloc[:2], plain.metrics.iloc[:0]), tmp_path / "2.html")
    assert "<td>too few seeds</td>" in two.read_text(encoding="utf-8")  # 2 levels: no interval


def test_standard_loss_curves_show_the_gap_to_the_floor_on_a_log_scale(results):
    ax = dict(plots.iter_figures(results))["loss_curves"].axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylabel() == "loss − floor (nats)"


def test_the_variance_figure_draws_no_negative_share_and_no_residual_above_one():
    """omega^2 of a factor without effect is negative and the residual's then above 1 (the
    quickstart's showed -11.2 %, -7.0 % and 117.5 %); the figure draws them within [0, 1]."""
    from fp4lab.analysis.plots.standard import drawn_shares

    shares = pd.DataFrame(
        dict(factor=["recipe", "lr", "residual"], share=[-0.112, -0.070, 1.175])
        | dict(share_lo=[-0.2, -0.15, 1.05], share_hi=[0.3, 0.1, 1.3])
    )
    drawn = drawn_shares(shares).set_index("factor")
    assert drawn.loc[["recipe", "lr"], "share"].tolist() == [0.0, 0.0]
    assert drawn.loc["residual", "share"] == 1.0 and np.isnan(drawn.loc["residual", "share_lo"])
    assert (drawn[["share", "share_lo", "share_hi"]].fillna(0) >= 0).all().all()
    assert shares.loc[0, "share"] == -0.112  # the table itself is left as it is
