"""Sets of GEMMs to keep in high precision, their FLOP cost, and the rules that keep them.

A set is a list of (layer, gemm) pairs of stage 1's table. Its cost is the share of the
model's GEMM FLOPs (Fprop, Dgrad and Wgrad of every quantized layer, one step) it keeps in
high precision. Three ways to choose one, each within a FLOP share:

    top        the ranking's first entries (`scores.rank`), skipping any that would exceed
               the budget (when none fits, the first alone)
    at_random  random entries (seeded) up to the same share: the ranking's control
    last       whole layers from the deepest up ("the last blocks in BF16", the recipes'
               rule of thumb) up to the same share

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

__all__ = ["share", "top", "at_random", "last", "rules", "rules_source"]

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


def at_random(table: pd.DataFrame, budget: float, seed: int = 0) -> list[tuple[str, str]]:
    """Random entries within `budget` (numpy's PCG64 seeded with `seed`)."""
    _check_budget(budget)
    return _fill(table, np.random.default_rng(seed).permutation(len(table)), budget)


def last(table: pd.DataFrame, budget: float) -> list[tuple[str, str]]:
    """Whole layers (all three GEMMs), deepest first, within `budget`."""
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


def rules(chosen, recipe, hp="bf16") -> list[tuple[str, object]]:
    """[(path regex, recipe)] keeping `chosen` in `hp`, then (".*", recipe).

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
    return [*out, (".*", recipe)]


_KEPT = """def kept(base, hp, *gemms):  # recipe `base` with these GEMMs in `hp`
    name = base + "".join(f"+{g}={hp}" for g in gemms)
    return fl.recipes.override(fl.recipes.get(base), dict.fromkeys(gemms, hp)).replace(name=name)


"""


def rules_source(rule_list) -> str:
    """`rules`' list as Python text that evaluates to it (`import fp4lab as fl` first): one rule
    a line, a layer kept in part written as `kept(base, hp, *gemms)` (defined in the text)."""
    lines = ["rules = ["]
    for path, recipe in rule_list:
        lines.append(f"    fl.Rule({_pattern_source(path)}, {_recipe_source(recipe)}),")
    lines.append("]")
    text = "\n".join(lines)
    return (_KEPT + text) if "kept(" in text else text


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
    return f"fl.GemmRecipe.from_dict({recipe.to_dict()!r})"
