"""Sets of GEMMs to keep in high precision, their FLOP cost, and the rules that keep them.

A set is a list of (layer, gemm) pairs of stage 1's table. Its cost is the share of the
model's GEMM FLOPs (Fprop, Dgrad and Wgrad of every quantized layer, one step) it keeps in
high precision. Three ways to choose one, each within a FLOP share:

    top        the ranking's first entries (`scores.rank`), skipping any that would exceed
               the budget (when none fits, the first alone); `skipped` names every entry
               ranked above a chosen one that was left out, and what keeping it would cost
    reaching   the cheapest set (in FLOPs) whose predicted share of the FP4 gap reaches a
               target, the prediction `predicted_share`: a set's score over the whole table's
    at_random  random entries (seeded, independent of the table's row order) at the nearest
               share to the set's: the ranking's control; `random_sets` draws several
    last       whole layers from the deepest up ("the last blocks in BF16", the recipes'
               rule of thumb) at the nearest share to the set's

`rules` turns a set into rules that `fp4lab.quantize_model` (and `Config.rules`) take as they
are: one rule per layer with a kept GEMM, ahead of the catch-all; `rules_source` prints them
as Python.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from fp4lab.core import recipes
from fp4lab.core.gemm_recipe import GemmRecipe
from fp4lab.schema import GEMMS

__all__ = [
    "share",
    "top",
    "skipped",
    "predicted_share",
    "reaching",
    "at_random",
    "random_sets",
    "last",
    "rules",
    "rules_source",
]

_EPS = 1e-12  # shares are sums of floats: equal within this is within budget


def share(table: pd.DataFrame, chosen) -> float:
    """The share of GEMM FLOPs the set `chosen` [(layer, gemm)] keeps in high precision."""
    keys = zip(table["layer"], table["gemm"], strict=True)
    flops = dict(zip(keys, table["flops"], strict=True))
    return float(sum(flops[c] for c in chosen) / sum(flops.values()))


def _fill(table: pd.DataFrame, order, budget: float) -> list[tuple[str, str]]:
    """Entries of `order` (row positions of `table`) in turn, each that fits the budget; when
    none fits, the first alone."""
    order = list(order)
    total = table["flops"].sum()
    chosen, used = [], 0.0
    for i in order:
        row = table.iloc[i]
        cost = row["flops"] / total
        if used + cost <= budget + _EPS:
            chosen.append((row["layer"], row["gemm"]))
            used += cost
    if not chosen and order:
        row = table.iloc[order[0]]
        chosen.append((row["layer"], row["gemm"]))
    return chosen


def top(ranked: pd.DataFrame, budget: float) -> list[tuple[str, str]]:
    """The ranking's first entries within `budget` (a share of GEMM FLOPs, in (0, 1])."""
    _check_budget(budget)
    return _fill(ranked, range(len(ranked)), budget)


def skipped(ranked: pd.DataFrame, chosen) -> pd.DataFrame:
    """The entries of `ranked` above the last chosen one that `chosen` leaves out: rank, layer,
    gemm, flop_share (its own) and with_it (the set's share if it were kept as well)."""
    ranked = ranked.reset_index(drop=True)
    keys = list(zip(ranked["layer"], ranked["gemm"], strict=True))
    picked = set(map(tuple, chosen))
    last_pos = max((i for i, k in enumerate(keys) if k in picked), default=-1)
    total = share(ranked, chosen)
    rows = []
    for i in range(last_pos):
        if keys[i] not in picked:
            cost = float(ranked["flops"].iloc[i] / ranked["flops"].sum())
            rows.append((i + 1, *keys[i], cost, total + cost))
    return pd.DataFrame(rows, columns=["rank", "layer", "gemm", "flop_share", "with_it"])


def predicted_share(table: pd.DataFrame, chosen, score: str) -> float:
    """The share of the FP4 gap that keeping `chosen` is predicted to close: the sum of its
    `score` over the sum over the table, negative scores counted as 0 (the scores of single
    GEMMs taken as additive, a first-order guess that stage 2 checks)."""
    value = table[score].clip(lower=0).to_numpy(np.float64)
    total = value.sum()
    if not total > 0:
        return float("nan")
    keys = list(zip(table["layer"], table["gemm"], strict=True))
    picked = set(map(tuple, chosen))
    return float(sum(v for k, v in zip(keys, value, strict=True) if k in picked) / total)


def reaching(table: pd.DataFrame, target: float, score: str) -> list[tuple[str, str]]:
    """A cheap set whose `predicted_share` reaches `target` (in (0, 1]): entries by score per
    FLOP (highest first) until the target is reached, then each that is not needed to stay
    at the target dropped, costliest first (greedy: within one entry of the cheapest)."""
    if not 0 < target <= 1:
        raise ValueError(f"target={target!r}; need a share of the predicted gap in (0, 1]")
    value = table[score].clip(lower=0).to_numpy(np.float64)
    if not value.sum() > 0:
        return []
    flops = table["flops"].to_numpy(np.float64)
    keys = list(zip(table["layer"], table["gemm"], strict=True))
    order = sorted(range(len(keys)), key=lambda i: (-value[i] / flops[i], keys[i]))
    need = target * value.sum() * (1 - 1e-9)
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


def _nearest(table: pd.DataFrame, order, target: float) -> list[tuple[str, str]]:
    """The prefix of `order` (row positions) whose FLOP share is nearest `target` (the shorter
    on a tie; at least one entry)."""
    flops = table["flops"].to_numpy(np.float64)
    shares = np.cumsum(flops[list(order)]) / flops.sum()
    n = int(np.argmin(np.abs(shares - target))) + 1
    return [(table["layer"].iloc[i], table["gemm"].iloc[i]) for i in list(order)[:n]]


def at_random(table: pd.DataFrame, budget: float, seed: int = 0) -> list[tuple[str, str]]:
    """Random entries at the FLOP share nearest `budget` (numpy's PCG64 seeded with `seed`,
    over the table in a fixed order, so the draw does not depend on its row order)."""
    _check_budget(budget)
    table = _canonical(table)
    return _nearest(table, np.random.default_rng(seed).permutation(len(table)), budget)


def random_sets(
    table: pd.DataFrame, budget: float, draws: int, avoid=()
) -> list[list[tuple[str, str]]]:
    """`draws` different `at_random` sets: seeds 0, 1, ..., a set equal to an earlier one or
    to one of `avoid` (the other cells' sets) skipped, as equal sets would be one run; fewer
    when the table has fewer (within 100 x draws seeds)."""
    sets, seen = [], {frozenset(map(tuple, a)) for a in avoid}
    for seed in range(100 * draws):
        kept = at_random(table, budget, seed=seed)
        if frozenset(kept) not in seen:
            seen.add(frozenset(kept))
            sets.append(kept)
        if len(sets) == draws:
            break
    return sets


def last(table: pd.DataFrame, budget: float) -> list[tuple[str, str]]:
    """Whole layers (all three GEMMs), deepest first, at the FLOP share nearest `budget`."""
    _check_budget(budget)
    layers = table.groupby("layer", sort=False).agg(
        depth=("depth", "first"), flops=("flops", "sum")
    )
    layers = layers.sort_values("depth", ascending=False, kind="stable").reset_index()
    picked = _nearest(layers.assign(gemm=""), range(len(layers)), budget)
    return [(layer, g) for layer, _ in picked for g in GEMMS]


def _check_budget(budget: float) -> None:
    if not 0 < budget <= 1:
        raise ValueError(f"budget={budget!r}; need a share of GEMM FLOPs in (0, 1]")


def rules(chosen, recipe, hp="bf16", *, keep=()) -> list[tuple[str, object]]:
    """[(path regex, recipe)]: each pattern of `keep` unquantized (None), then `chosen` in `hp`,
    then (".*", recipe).

    A layer with all three GEMMs kept gets `hp` itself; one with some gets `recipe` with those
    GEMMs taken from `hp` (`fp4lab.recipes.override`), named e.g. "nvfp4+wgrad=bf16".
    """
    base = recipes.get(recipe)
    name = recipe if isinstance(recipe, str) else base.name or "custom"
    hp_name = hp if isinstance(hp, str) or hp is None else hp.name or "custom"
    kept: dict[str, list[str]] = {}
    for layer, gemm in chosen:
        kept.setdefault(layer, []).append(gemm)
    out = []
    for layer, gemms in kept.items():
        gemms = [g for g in GEMMS if g in gemms]
        if len(gemms) == len(GEMMS):
            out.append((re.escape(layer), hp))
            continue
        value = recipes.override(base, {g: hp for g in gemms})
        label = name + "".join(f"+{g}={hp_name}" for g in gemms)
        out.append((re.escape(layer), value.replace(name=label)))
    return [*((path, None) for path in keep), *out, (".*", recipe)]


_KEPT = """def kept(base, hp, *gemms):  # recipe `base` with these GEMMs in `hp`
    name = base + "".join(f"+{g}={hp}" for g in gemms)
    return fl.recipes.override(fl.recipes.get(base), dict.fromkeys(gemms, hp)).replace(name=name)


"""


def rules_source(rule_list) -> str:
    """`rules`' list as Python text that evaluates to it (`import fp4lab as fl` first): one rule
    a line, a layer kept in part written as `kept(base, hp, *gemms)` (defined in the text).
    A recipe registered at run time (an experiment file's `fl.recipes.register`) is registered
    again at the top under its name, so the text runs on its own and keeps the names."""
    lines = ["rules = ["]
    for path, recipe in rule_list:
        lines.append(f"    fl.Rule({_pattern_source(path)}, {_recipe_source(recipe)}),")
    lines.append("]")
    text = "\n".join(lines)
    text = (_KEPT + text) if "kept(" in text else text
    registered = _registered(rule_list)
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


def _registered(rule_list) -> dict:
    """{name: recipe} of the run-time registered recipes the rules name (not built-ins)."""
    out = {}
    for _, recipe in rule_list:
        if recipe is None:
            continue
        name = recipe if isinstance(recipe, str) else (recipe.name or "").partition("+")[0]
        for n in (name, *(c.split("=", 1)[1] for c in _changes(recipe))):
            if n in recipes.names() and recipes.builtin_name(recipes.get(n)) != n:
                out[n] = recipes.get(n)
    return out


def _changes(recipe) -> list[str]:
    """The "+gemm=hp" parts of a kept recipe's name."""
    if isinstance(recipe, str) or not recipe.name:
        return []
    return [c for c in recipe.name.split("+")[1:] if "=" in c]


def _pattern_source(path: str) -> str:
    """A layer pattern as a raw string literal where one can hold it, else its repr."""
    if '"' not in path and "\n" not in path and not path.endswith("\\"):
        return f'r"{path}"'
    return repr(path)


def _string(text: str) -> str:
    """A name as a double-quoted literal (the house style), or its repr where it needs escapes."""
    return f'"{text}"' if text.isprintable() and not set(text) & {'"', "\\"} else repr(text)


def _recipe_source(recipe) -> str:
    if recipe is None:
        return "None"
    if isinstance(recipe, str):
        return _string(recipe)
    if not isinstance(recipe, GemmRecipe):
        raise TypeError(f"rules_source: a recipe is a name, a GemmRecipe or None, not {recipe!r}")
    base, _, changes = recipe.name.partition("+")
    parts = dict(c.split("=", 1) for c in changes.split("+")) if changes else {}
    hp = set(parts.values())
    if base in recipes.names() and len(hp) == 1 and hp <= set(recipes.names()):
        value = hp.pop()
        expected = recipes.override(recipes.get(base), dict.fromkeys(parts, value))
        if expected == recipe:
            return f"kept({', '.join(map(_string, (base, value, *parts)))})"
    value = f"fl.GemmRecipe.from_dict({recipe.to_dict()!r})"
    return f"{value}.replace(name={_string(recipe.name)})" if recipe.name else value
