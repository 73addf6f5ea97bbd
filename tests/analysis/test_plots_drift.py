"""Figures of the accumulated drift (acc/ metrics): heatmap facets, drift against depth."""

import io
import itertools

import numpy as np
import pandas as pd
import pytest
from matplotlib import colors as mcolors

from fp4lab.analysis import plots

pytestmark = pytest.mark.filterwarnings("error")

LAYERS = ("blocks.0.mlp.up", "blocks.1.mlp.up", "blocks.2.mlp.up", "blocks.10.mlp.up")


class Results:
    def __init__(self, runs, metrics):
        self.runs, self.metrics = runs, metrics


def make_results(seeds: int = 3, steps: int = 6):
    """An nvfp4 cell whose forward drift grows with depth, and a fixed cell with small drift; a
    high-precision lm_head with tiny quantizer error in both."""
    gen = np.random.default_rng(0)
    runs, rows = [], []
    for cell, s in itertools.product(("nvfp4", "fixed"), range(seeds)):
        rid, local = f"{cell}-{s}", {"nvfp4": 0.1, "fixed": 0.01}[cell]
        runs.append(
            dict(run_id=rid, experiment="synthetic", cell=cell, status="ok", recipe=cell)
            | dict(seed_init=s, seed_data=s, seed_quant=s, loss_gap=0.1, loss_floor=0.0)
            | dict(final_loss=0.1, diverged=False, divergence_step=np.nan, divergence_kind="")
            | dict(target_loss=np.nan, tokens_to_target=np.nan, tokens_per_step=64, wall_s=1.0)
        )
        for t in range(0, steps, 2):
            rows.append((rid, t, "loss", 1.0 / (t + 1)))
            for i, layer in enumerate(LAYERS):
                noise = 1 + 0.05 * gen.normal()
                rows += [
                    (rid, t, f"acc/{layer}/fwd/rel_drift", local * np.sqrt(i + 1) * noise),
                    (rid, t, f"acc/{layer}/fwd/local", local * noise),
                    (rid, t, f"acc/{layer}/bwd/rel_drift", local * np.sqrt(4 - i) * noise),
                    (rid, t, f"acc/{layer}/bwd/cos", 1 - local * (4 - i) / 10),
                    (rid, t, f"quant/{layer}/fprop/x/rel_err", local * noise),
                ]
            rows.append((rid, t, "quant/lm_head/fprop/x/rel_err", 0.0015))
    metrics = pd.DataFrame(rows, columns=["run_id", "step", "metric", "value"])
    return Results(pd.DataFrame(runs), metrics)


@pytest.fixture(scope="module")
def results():
    return make_results()


def _png(fig) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=50)
    assert buf.getvalue()[:4] == b"\x89PNG"


def test_drift_heatmap_has_a_forward_and_a_backward_panel_on_one_scale(results):
    fig = plots.gradient_flow_heatmap(results.metrics, "rel_drift", runs=results.runs, cell="nvfp4")
    _png(fig)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == [
        "forward: output y, accumulated drift",
        "backward: cotangent dy, accumulated drift",
    ]
    assert panels[0].collections[0].norm is panels[1].collections[0].norm
    fwd = panels[0].collections[0].get_array()
    assert fwd.shape == (len(LAYERS), 3)
    # rows in natural (depth) order: the forward drift grows down the rows
    assert (np.diff(np.asarray(fwd)[:, 0]) > 0).all()
    labels = [t.get_text() for t in panels[0].get_yticklabels()]
    assert labels == list(LAYERS)
    # "cos" is a shadow-gradient statistic unless asked for as drift
    fig = plots.gradient_flow_heatmap(results.metrics, "cos", kind="acc")
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == [
        "backward: cotangent dy, cosine"
    ]
    with pytest.raises(ValueError, match="no grad telemetry"):
        plots.gradient_flow_heatmap(results.metrics, "cos")
    with pytest.raises(ValueError, match="acc telemetry has no statistic 'bias'"):
        plots.gradient_flow_heatmap(results.metrics, "bias", kind="acc")
    with pytest.raises(ValueError, match="unknown telemetry statistic 'drift'"):
        plots.gradient_flow_heatmap(results.metrics, "drift")


def test_error_scales_are_logarithmic_when_they_span_decades():
    # a BF16 layer at 0.0015 next to FP4 layers at 0.08-0.14 must not squeeze the FP4 range
    norm = plots.heatmap_norm([0.0015, 0.08, 0.14, np.inf, np.nan], "rel_err")
    assert isinstance(norm, mcolors.LogNorm) and (norm.vmin, norm.vmax) == (0.0015, 0.14)
    norm = plots.heatmap_norm([0.08, 0.14], "rel_err")
    assert type(norm) is mcolors.Normalize and (norm.vmin, norm.vmax) == (0.08, 0.14)
    assert isinstance(plots.heatmap_norm([-0.01, 0.02], "bias"), mcolors.CenteredNorm)


def test_drift_vs_depth_draws_each_cell_with_its_local_error(results):
    fig = plots.drift_vs_depth(results.metrics, results.runs)
    _png(fig)
    fwd, bwd = (ax for ax in fig.axes if ax.get_title())
    assert fwd.get_title() == "forward: output y" and bwd.get_title() == "backward: cotangent dy"
    assert fwd.get_yscale() == "log"
    # forward: drift and local error per cell; backward: drift per cell
    assert len(fwd.get_lines()) == 4 and len(bwd.get_lines()) == 2
    nvfp4 = fwd.get_lines()[0].get_ydata()
    assert (np.diff(nvfp4) > 0).all()  # the synthetic drift grows with depth
    assert [t.get_text() for t in fwd.get_xticklabels()] == list(LAYERS)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["nvfp4", "nvfp4, the op's own error", "fixed", "fixed, the op's own error"]
    fig = plots.drift_vs_depth(results.metrics, results.runs, steps=[0, 4], local=False)
    assert len(fig.axes[0].get_lines()) == 4  # two cells x two steps
    with pytest.raises(ValueError, match=r"steps \[3\] were not logged"):
        plots.drift_vs_depth(results.metrics, steps=[3])
    with pytest.raises(ValueError, match="no drift telemetry"):
        plots.drift_vs_depth(results.metrics[~results.metrics["metric"].str.startswith("acc/")])


def test_standard_figures_draw_the_drift_and_share_one_scale_across_cells(results):
    figures = dict(plots.iter_figures(results))
    assert {"heatmap_rel_drift_nvfp4", "heatmap_rel_drift_fixed", "drift_vs_depth"} <= set(figures)
    norms = [
        next(ax for ax in figures[f"heatmap_rel_err_{c}"].axes if ax.get_title())
        .collections[0]
        .norm
        for c in ("nvfp4", "fixed")
    ]
    assert (norms[0].vmin, norms[0].vmax) == (norms[1].vmin, norms[1].vmax)
    assert isinstance(norms[0], mcolors.LogNorm) and norms[0].vmin == pytest.approx(0.0015)


def test_layers_are_ordered_by_depth_where_it_is_known():
    from fp4lab import analysis

    depth = {"b.0.attn.query": 0, "b.0.attn.key": 1, "b.0.attn.out": 2, "b.1.attn.query": 3}
    layers = ["b.1.attn.query", "b.0.attn.out", "b.0.attn.key", "zz", "b.0.attn.query.kernel", "a"]
    assert analysis.layer_order(layers, depth) == [
        "b.0.attn.query.kernel",  # a parameter at its op's depth
        "b.0.attn.key",
        "b.0.attn.out",
        "b.1.attn.query",
        "a",  # unknown: after, in natural order
        "zz",
    ]
    metrics = pd.DataFrame(
        [("r", 0, "depth/b.0.attn.key", 1.0), ("r", 2, "depth/b.0.attn.key", 1.0)],
        columns=["run_id", "step", "metric", "value"],
    )
    assert analysis.depths(metrics) == {"b.0.attn.key": 1.0}
    assert analysis.depths(metrics.iloc[:0]) == {}
