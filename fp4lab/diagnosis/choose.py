"""Sets of GEMMs to keep in high precision, their FLOP cost, and the rules that keep them.

A set is a list of (layer, gemm) pairs of stage 1's table. Its cost is the share of the
model's GEMM FLOPs (Fprop, Dgrad and Wgrad of every quantized layer, one step) it keeps in
high precision. A budget is a ceiling on that share everywhere: a set costs at most the budget
(within the relative tolerance `TOL`), and may cost less, or be empty, when nothing more is
worth keeping or fits. Ways to choose one:

    top        the ranking's entries that are `worth` keeping, in rank order, each that still
               fits the budget; `left_out` names every entry the budget or the rule left out
               and why
    reaching   the cheapest set (in FLOPs) whose predicted share of the FP4 gap reaches a
               target, the prediction `predicted_share`
    at_random  random entries (seeded, independent of the table's row order), each that still
               fits the budget: the ranking's control; `random_sets` draws several
    last       whole layers from the deepest up, each that still fits the budget ("the last
               blocks in BF16", the recipes' rule of thumb)

The rule of `worth` (`top`'s): a GEMM is kept only where its score's interval lies above zero
(the gain of keeping it is resolved) and the lower end of its predicted share of the gap is at
least its share of the FLOPs (it buys more of the gap per FLOP than keeping the whole model in
high precision, which closes all of the gap at all of the FLOPs).

`rules` turns a set into rules that `fp4lab.quantize_model` (and `Config.rules`) take as they
are: one rule per layer with a kept GEMM, ahead of the catch-all; `rules_source` prints the
same set as Python from the same data (the set, the recipe and the high-precision recipe), so a
recipe of any registered name round-trips.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from fp4lab.core import recipes
from fp4lab.core.gemm_recipe import GemmRecipe
from fp4lab.diagnosis import scores
from fp4lab.schema import GEMMS

__all__ = [
    "TOL",
    "share",
    "over_budget",
    "total",
    "worth",
    "top",
    "left_out",
    "predicted_share",
    "reaching",
    "at_random",
    "random_sets",
    "last",
    "kept_recipe",
    "rules",
    "rules_source",
]

TOL = 1e-9  # the one tolerance: a share within this relative margin of a ceiling fits it


def _within(used: float, ceiling: float) -> bool:
    return used <= ceiling * (1 + TOL)


def share(table: pd.DataFrame, chosen) -> float:
    """The share of GEMM FLOPs the set `chosen` [(layer, gemm)] keeps in high precision."""
    keys = zip(table["layer"], table["gemm"], strict=True)
    flops = dict(zip(keys, table["flops"], strict=True))
    return float(sum(flops[c] for c in chosen) / sum(flops.values()))


def _fill(table: pd.DataFrame, order, budget: float) -> list[tuple[str, str]]:
    """Entries of `order` (row positions of `table`) in turn, each that still fits the budget
    (a ceiling: possibly none)."""
    cost = table["flops"].to_numpy(np.float64)
    cost = cost / cost.sum()
    chosen, used = [], 0.0
    for i in order:
        if _within(used + cost[i], budget):
            chosen.append((table["layer"].iloc[i], table["gemm"].iloc[i]))
            used += cost[i]
    return chosen


def over_budget(table: pd.DataFrame, budget: float) -> str:
    """ "" when some GEMM of `table` fits `budget`, else why none does, in words."""
    _check_budget(budget)
    cheapest = float(table["flops"].min() / table["flops"].sum())
    if _within(cheapest, budget):
        return ""
    return (
        f"no GEMM fits the budget of {budget:.2%} of GEMM FLOPs: the cheapest costs "
        f"{cheapest:.2%}; raise the budget to at least that"
    )


def total(table: pd.DataFrame, score: str) -> float:
    """What a score's predicted shares are shares of: the all-FP4 model's own measure where
    the table has it (`fp4_<measure>`, for the shares of a step's loss decrease), else the sum
    of the table's positive scores (the single GEMMs' scores taken as additive)."""
    column = scores.TOTALS.get(score)
    if column in table:
        return float(table[column].iloc[0])
    return float(table[score].clip(lower=0).sum())


def worth(table: pd.DataFrame, score: str) -> pd.DataFrame:
    """Per row of `table`: `gain_lo`, the lower end of its predicted share of the gap (its
    score's lower end over `total`), `worth` (the rule of the module docstring: the score's
    interval above zero and gain_lo >= its share of the FLOPs) and `why` ("" where worth it,
    else "unresolved", the interval reaching zero or missing, or "not worth its FLOPs")."""
    whole = total(table, score)
    lo = table[f"{score}_lo"].to_numpy(np.float64)
    cost = (table["flops"] / table["flops"].sum()).to_numpy(np.float64)
    resolved = np.isfinite(lo) & (lo > 0)
    gain = lo / whole if whole > 0 else np.full(len(lo), np.nan)
    enough = resolved & np.isfinite(gain) & (gain >= cost * (1 - TOL))
    why = np.where(enough, "", np.where(resolved, "not worth its FLOPs", "unresolved"))
    return pd.DataFrame({"gain_lo": gain, "flop_share": cost, "worth": enough, "why": why})


def top(ranked: pd.DataFrame, budget: float, score: str | None = None) -> list[tuple[str, str]]:
    """The ranking's entries in rank order, each that still fits `budget` (a ceiling on the
    share of GEMM FLOPs, in (0, 1]); with `score`, only those `worth` keeping by it. Possibly
    empty (`over_budget` says when nothing can fit)."""
    _check_budget(budget)
    order = range(len(ranked))
    if score is not None:
        order = np.flatnonzero(worth(ranked, score)["worth"].to_numpy())
    return _fill(ranked, order, budget)


def left_out(ranked: pd.DataFrame, chosen, score: str | None = None) -> pd.DataFrame:
    """The entries of `ranked` above the last chosen one, or (with `score`) whose score's lower
    end is above zero, that `chosen` leaves out: rank, layer, gemm, flop_share (its own),
    with_it (the set's share if it were kept as well) and why ("budget", or `worth`'s word)."""
    ranked = ranked.reset_index(drop=True)
    keys = list(zip(ranked["layer"], ranked["gemm"], strict=True))
    picked = set(map(tuple, chosen))
    last_pos = max((i for i, k in enumerate(keys) if k in picked), default=-1)
    rule = worth(ranked, score) if score is not None else None
    have = share(ranked, chosen)
    rows = []
    for i, key in enumerate(keys):
        if key in picked:
            continue
        if rule is None:
            if i > last_pos:
                continue
            why = "budget"
        elif rule["worth"].iloc[i]:
            why = "budget"
        elif rule["why"].iloc[i] == "unresolved":
            continue
        else:
            why = rule["why"].iloc[i]
        cost = float(ranked["flops"].iloc[i] / ranked["flops"].sum())
        rows.append((i + 1, *key, cost, have + cost, why))
    return pd.DataFrame(rows, columns=["rank", "layer", "gemm", "flop_share", "with_it", "why"])


def predicted_share(table: pd.DataFrame, chosen, score: str) -> float:
    """The share of the FP4 gap that keeping `chosen` is predicted to close: the sum of its
    positive `score`s over `total` (the all-FP4 model's own measure where the table has it),
    at most 1; NaN when the total is not positive."""
    whole = total(table, score)
    if not whole > 0:
        return float("nan")
    value = table[score].clip(lower=0).to_numpy(np.float64)
    keys = list(zip(table["layer"], table["gemm"], strict=True))
    picked = set(map(tuple, chosen))
    return min(1.0, float(sum(v for k, v in zip(keys, value, strict=True) if k in picked) / whole))


def reaching(table: pd.DataFrame, target: float, score: str) -> list[tuple[str, str]]:
    """A cheap set whose `predicted_share` reaches `target` (in (0, 1]): entries by score per
    FLOP (highest first) until the target is reached, then each that is not needed to stay
    at the target dropped, costliest first (greedy: within one entry of the cheapest). Empty
    when no set reaches it."""
    if not 0 < target <= 1:
        raise ValueError(f"target={target!r}; need a share of the predicted gap in (0, 1]")
    value = table[score].clip(lower=0).to_numpy(np.float64)
    whole = total(table, score)
    if not whole > 0 or not value.sum() >= target * whole * (1 - TOL):
        return []
    flops = table["flops"].to_numpy(np.float64)
    keys = list(zip(table["layer"], table["gemm"], strict=True))
    order = sorted(range(len(keys)), key=lambda i: (-value[i] / flops[i], keys[i]))
    need = target * whole * (1 - TOL)
    picked, got = [], 0.0
    for i in order:
        if got >= need:
            break
        picked.append(i)
        got += value[i]
    for i in sorted(picked, key=lambda i: (-flops[i], keys[i])):
        if got - value[i] >= need:
            picked.remove(i)
            got -= value[i]
    return [keys[i] for i in sorted(picked, key=lambda i: (-value[i], keys[i]))]


def _canonical(table: pd.DataFrame) -> pd.DataFrame:
    """`table` in one order whatever its row order: by depth, GEMM and layer name."""
    order = table.assign(_g=table["gemm"].map(GEMMS.index))
    return order.sort_values(["depth", "layer", "_g"], kind="stable").reset_index(drop=True)


def at_random(table: pd.DataFrame, budget: float, seed: int = 0) -> list[tuple[str, str]]:
    """Random entries, each that still fits `budget` (a ceiling), in the order of numpy's PCG64
    permutation seeded with `seed` over the table in a fixed order (so the draw does not depend
    on its row order)."""
    _check_budget(budget)
    table = _canonical(table)
    return _fill(table, np.random.default_rng(seed).permutation(len(table)), budget)


def random_sets(
    table: pd.DataFrame, budget: float, draws: int, avoid=()
) -> list[list[tuple[str, str]]]:
    """`draws` different non-empty `at_random` sets: seeds 0, 1, ..., a set equal to an earlier
    one or to one of `avoid` (the other cells' sets) skipped, as equal sets would be one run;
    fewer, possibly none, when the budget leaves fewer (within 100 x draws seeds): at a budget
    of 1 every draw is the whole model."""
    sets, seen = [], {frozenset(map(tuple, a)) for a in avoid}
    for seed in range(100 * draws):
        kept = at_random(table, budget, seed=seed)
        if kept and frozenset(kept) not in seen:
            seen.add(frozenset(kept))
            sets.append(kept)
        if len(sets) == draws:
            break
    return sets


def last(table: pd.DataFrame, budget: float) -> list[tuple[str, str]]:
    """Whole layers (all three GEMMs), deepest first, each that still fits `budget` (a
    ceiling; possibly none)."""
    _check_budget(budget)
    layers = table.groupby("layer", sort=False).agg(
        depth=("depth", "first"), flops=("flops", "sum")
    )
    layers = layers.sort_values("depth", ascending=False, kind="stable").reset_index()
    picked = _fill(layers.assign(gemm=""), range(len(layers)), budget)
    return [(layer, g) for layer, _ in picked for g in GEMMS]


def _check_budget(budget: float) -> None:
    if not 0 < budget <= 1:
        raise ValueError(f"budget={budget!r}; need a share of GEMM FLOPs in (0, 1]")


def _by_layer(chosen) -> dict[str, list[str]]:
    """{layer: its kept GEMMs in `GEMMS` order}, layers in the set's order."""
    kept: dict[str, list[str]] = {}
    for layer, gemm in chosen:
        kept.setdefault(layer, []).append(gemm)
    return {layer: [g for g in GEMMS if g in gemms] for layer, gemms in kept.items()}


def _label(recipe) -> str:
    """A recipe's name for a label: the name given, a value's own name, else "custom"."""
    if recipe is None:
        return "none"
    return recipe if isinstance(recipe, str) else recipe.name or "custom"


def kept_recipe(base, hp, gemms) -> GemmRecipe:
    """`base` (a name or a GemmRecipe) with the GEMMs `gemms` taken from `hp`
    (`fp4lab.recipes.override`), labelled e.g. "nvfp4+wgrad=bf16" (a label only: nothing
    reads it back)."""
    value = recipes.override(recipes.get(base), dict.fromkeys(gemms, hp))
    return value.replace(name=_label(base) + "".join(f"+{g}={_label(hp)}" for g in gemms))


def rules(chosen, recipe, hp="bf16", *, keep=()) -> list[tuple[str, object]]:
    """[(path regex, recipe)]: each pattern of `keep` unquantized (None), then `chosen` in `hp`,
    then (".*", recipe).

    A layer with all three GEMMs kept gets `hp` itself; one with some gets `kept_recipe`.
    """
    recipes.get(recipe)
    out = []
    for layer, gemms in _by_layer(chosen).items():
        full = len(gemms) == len(GEMMS)
        out.append((re.escape(layer), hp if full else kept_recipe(recipe, hp, gemms)))
    return [*((path, None) for path in keep), *out, (".*", recipe)]


_KEPT = """def kept(base, hp, *gemms):  # recipe `base` with these GEMMs taken from `hp`
    def label(r):
        return "none" if r is None else r if isinstance(r, str) else r.name or "custom"

    value = fl.recipes.override(fl.recipes.get(base), dict.fromkeys(gemms, hp))
    return value.replace(name=label(base) + "".join(f"+{g}={label(hp)}" for g in gemms))


"""


def rules_source(chosen, recipe, hp="bf16", *, keep=()) -> str:
    """`rules(chosen, recipe, hp, keep=keep)` as Python text that evaluates to the same rules
    (`import fp4lab as fl` first), written from the set itself, not from the rules' labels: one
    rule a line, a layer kept in part written as `kept(base, hp, *gemms)` (defined in the
    text). A recipe named by a name registered at run time (an experiment file's
    `fl.recipes.register`) is registered again at the top under that name, so the text runs on
    its own and keeps the names, whatever they hold."""
    base, high = _recipe_source(recipe), _recipe_source(hp)
    lines = ["rules = ["]
    lines += [f"    fl.Rule({_pattern_source(path)}, None)," for path in keep]
    for layer, gemms in _by_layer(chosen).items():
        if len(gemms) == len(GEMMS):
            value = high
        else:
            value = f"kept({', '.join((base, high, *map(_string, gemms)))})"
        lines.append(f"    fl.Rule({_pattern_source(re.escape(layer))}, {value}),")
    lines += [f'    fl.Rule(r".*", {base}),', "]"]
    text = "\n".join(lines)
    text = (_KEPT + text) if "kept(" in text else text
    registered = {
        n: recipes.get(n)
        for n in dict.fromkeys((recipe, hp))
        if isinstance(n, str) and n not in recipes.builtin_names()
    }
    if registered:
        text = (
            "".join(
                f"fl.recipes.register({_string(n)}, fl.GemmRecipe.from_dict({r.to_dict()!r}))\n"
                for n, r in registered.items()
            )
            + ("\n\n" if text.startswith("def") else "\n")
            + text
        )
    return text


def _pattern_source(path: str) -> str:
    """A layer pattern as a raw string literal where one can hold it, else its repr."""
    if '"' not in path and "\n" not in path and not path.endswith("\\"):
        return f'r"{path}"'
    return repr(path)


def _string(text: str) -> str:
    """A name as a double-quoted literal (the house style), or its repr where it needs escapes."""
    return f'"{text}"' if text.isprintable() and not set(text) & {'"', "\\"} else repr(text)


def _recipe_source(recipe) -> str:
    """A recipe as Python: None, its name, or a GemmRecipe value with its label."""
    if recipe is None:
        return "None"
    if isinstance(recipe, str):
        return _string(recipe)
    if not isinstance(recipe, GemmRecipe):
        raise TypeError(f"rules_source: a recipe is a name, a GemmRecipe or None, not {recipe!r}")
    value = f"fl.GemmRecipe.from_dict({recipe.to_dict()!r})"
    return f"{value}.replace(name={_string(recipe.name)})" if recipe.name else value
