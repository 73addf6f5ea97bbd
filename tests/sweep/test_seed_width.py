"""A seed's numbers do not depend on how many seeds share its call (`Config.pad_seeds` False, the
default: the seeds of a call run one after the other, and a call is as wide as its seeds), so a
1-seed run computes one seed, and it is the seed alone, jit(make_train(cfg)); runs of
`pad_seeds=True` (every run recorded before the field) keep their padded calls and their ids."""

import jax
import numpy as np
import pytest

from fp4lab.sweep import compute, store
from fp4lab.train import trainer
from fp4lab.train.config import Config

MLP = dict(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,), batch_size=32)
# every path the telemetry has (operand statistics, the shadow, K = 2 draws of the quantization
# keys, the per-step high-precision loss) and dynamic loss scaling, on SR's quantizers
TEACHER = Config(**MLP, steps=6, warmup=2, eval_batches=2, recipe="nvfp4", telemetry_every=1,
                 shadow=True, noise_keys=2, target_on="hp", loss_scaling="dynamic",
                 seed_batch=4)  # fmt: skip
# the scanned LM with its operand telemetry, a bf16 head (the shadow is the teacher's: the LM's
# would double the test's compile time)
LM = Config(task="markov", vocab=16, d_model=16, n_layers=2, n_heads=2, d_ff=32, seq_len=8,
            batch_size=4, steps=4, warmup=0, eval_batches=1, recipe="nvfp4", scan_layers=True,
            rules=((r"lm_head", "bf16"),), telemetry_every=2, seed_batch=2)  # fmt: skip
SEED = (1, 2, 3)


def _leaves(result: dict) -> dict[str, np.ndarray]:
    """Every number of one seed's result but the host timings, by path."""
    result = dict(result, summary=dict(result["summary"]))
    for k in ("compile_s", "wall_s"):
        result.pop(k, None)
        result["summary"].pop(k, None)
    result.pop("cpu", None)
    flat = jax.tree_util.tree_flatten_with_path(result)[0]
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in flat}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit (NaN equals NaN), or equal for the non-float fields (labels)."""
    if a.dtype.kind == "f":
        return a.dtype == b.dtype and np.array_equal(
            a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
        )
    return np.array_equal(a, b)


def _compute(cfg: Config, seeds: list, widths: list) -> list[dict]:
    """`compute_cell` on `seeds`, the widths of the calls it compiled appended to `widths` (its
    compile events; `every=0`: the program without step reports, as with no `progress`)."""
    events = []
    out = compute.compute_cell(cfg.to_dict(), seeds, events.append, every=0)
    widths += [e["width"] for e in events if e["event"] == "compiled"]
    return out


# by_hand: also compare with jit(train) on the seed alone (one more compile; the teacher's)
@pytest.mark.parametrize("cfg, by_hand", [(TEACHER, True), (LM, False)], ids=["teacher", "lm"])
def test_a_seed_has_the_same_bits_at_every_call_width(cfg, by_hand):
    compute.clear_cache(cfg)
    widths = []
    alone = _compute(cfg, [SEED], widths)[0]
    assert widths == [1]  # a 1-seed run computes one seed
    mine = _leaves(alone)
    assert any(k.startswith("['telemetry']['metrics']['quant/") for k in mine)
    assert cfg.shadow == any(k.startswith("['telemetry']['metrics']['grad/") for k in mine)
    others = [(4, 5, 6), (7, 7, 7), (0, 0, 0)]
    for width in sorted({2, cfg.seed_batch}):
        shared = _compute(cfg, [*others[: width - 1], SEED], widths)
        theirs = _leaves(shared[-1])
        assert mine.keys() == theirs.keys()
        differ = [k for k in mine if not _same(mine[k], theirs[k])]
        assert not differ, (width, differ)
        # the seeds are not copies of each other: the comparison could have failed
        assert not np.array_equal(shared[0]["series"]["loss"], shared[-1]["series"]["loss"])
    assert widths == sorted({1, 2, cfg.seed_batch})
    if not by_hand:
        return
    # and the seed alone, as a researcher would run it by hand, is the stored run
    by_hand = jax.device_get(jax.jit(trainer.make_train(cfg))(trainer.make_keys(*SEED)))
    for k, v in alone["series"].items():
        assert _same(np.asarray(by_hand[k]), np.asarray(v)), k
    tel = alone["telemetry"]["metrics"]
    assert list(tel) == list(by_hand["telemetry"])  # the same metrics in the same order
    for k, v in tel.items():
        assert _same(np.asarray(by_hand["telemetry"][k]), np.asarray(v)), k


def test_a_cell_compiles_one_program_per_width_it_needs():
    cfg = TEACHER.replace(telemetry_every=0, shadow=False, noise_keys=0, target_on="train",
                          seed_batch=2)  # fmt: skip
    compute.clear_cache(cfg)
    widths = []
    out = _compute(cfg, [(0, 0, 0), (1, 1, 1), (2, 2, 2)], widths)
    assert widths == [2, 1]  # calls of 2 and 1, no padding
    compile_s = [r["summary"]["compile_s"] for r in out]
    assert compile_s[0] == compile_s[1] > 0 and compile_s[2] > 0
    again = _compute(cfg, [(2, 2, 2)], widths)
    assert widths == [2, 1] and again[0]["summary"]["compile_s"] == 0.0  # cached
    assert np.array_equal(again[0]["series"]["loss"], out[2]["series"]["loss"])


def test_padded_runs_keep_their_program_and_their_ids():
    cfg = TEACHER.replace(telemetry_every=0, shadow=False, noise_keys=0, target_on="train",
                          seed_batch=3, pad_seeds=True)  # fmt: skip
    compute.clear_cache(cfg)
    widths = []
    one = _compute(cfg, [SEED], widths)[0]
    assert widths == [3]  # padded with copies of the seed
    three = _compute(cfg, [(0, 0, 0), SEED, (5, 5, 5)], widths)[1]
    assert widths == [3]
    assert np.array_equal(one["series"]["loss"], three["series"]["loss"])
    # a record made before the field reads as pad_seeds=True and keeps its id
    old = {k: v for k, v in cfg.to_dict().items() if k != "pad_seeds"}
    assert Config.from_dict(old).pad_seeds is True
    assert store.run_id(old, SEED) == store.run_id(cfg.to_dict(), SEED)
    assert store.run_id(cfg.replace(pad_seeds=False).to_dict(), SEED) != store.run_id(old, SEED)


def test_the_sequential_and_the_vmapped_program_train_alike():
    # the same seed under the two modes: both train; their last bits may differ (the vmapped
    # program's kernels are others), which is why the field is in the run id
    cfg = TEACHER.replace(telemetry_every=0, shadow=False, noise_keys=0, target_on="train",
                          steps=20)  # fmt: skip
    one = compute.compute_cell(cfg.to_dict(), [SEED])[0]["series"]["loss"]
    padded = compute.compute_cell(cfg.replace(pad_seeds=True).to_dict(), [SEED])[0]
    padded = padded["series"]["loss"]
    assert np.all(np.isfinite(one)) and one[-5:].mean() < 0.8 * one[:5].mean()
    np.testing.assert_allclose(one, padded, rtol=0.05)


def test_the_telemetry_leaves_the_program_as_one_array(tmp_path, monkeypatch):
    # one output per metric would cost XLA a fusion each to compile; the record's telemetry is
    # still {metric: values}, in order and bit for bit jit(make_train(cfg))'s (above). The
    # program is the stored one (`fp4lab.sweep.programs`), whose outputs can be counted
    from jax import export

    from fp4lab.sweep import programs

    monkeypatch.setenv(programs.ENV, str(tmp_path))
    cfg = TEACHER.replace(seed_batch=1, steps=2, noise_keys=0)
    compute.clear_cache(cfg)
    (run,) = _compute(cfg, [SEED], [])
    metrics = run["telemetry"]["metrics"]
    assert len(metrics) > 50 and list(metrics) == sorted(metrics)
    kinds = {(v.shape, v.dtype) for v in metrics.values()}  # the shadow's below_sqrt3: bool
    assert kinds == {((cfg.steps,), np.dtype(np.float32)), ((cfg.steps,), np.dtype(bool))}, kinds
    (stored,) = tmp_path.glob("*.program")
    program = export.deserialize(bytearray(stored.read_bytes().partition(b"\n")[2]))
    assert len(program.out_avals) < 20, len(program.out_avals)
    compute.clear_cache(cfg)  # the same numbers from the stored program, its names too
    (again,) = _compute(cfg, [SEED], [])
    assert list(again["telemetry"]["metrics"]) == list(metrics)
    assert all(_same(again["telemetry"]["metrics"][k], v) for k, v in metrics.items())
