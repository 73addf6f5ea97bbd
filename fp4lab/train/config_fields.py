"""The checks of `fp4lab.train.config.Config`'s fields: each names the field, the bad value
and what is allowed, and returns the value as the config stores it."""

from __future__ import annotations

import re
from typing import Any

from fp4lab import schema
from fp4lab.core import recipes
from fp4lab.core.recipes import GemmRecipe
from fp4lab.core.spec import QuantSpec

__all__ = ["ConfigError", "choice", "recipe_field", "coerce", "gemms_field", "rules_field"]


class ConfigError(ValueError):
    """A bad config field: the message names the field, the value and what is allowed."""


def choice(name: str, value, allowed) -> None:
    schema.check_choice("Config", name, value, allowed, ConfigError)


def recipe_field(name: str, value, *, optional: bool = False) -> str | GemmRecipe | None:
    """A recipe as the config stores it: a built-in name, or a GemmRecipe (a registered name
    and the dict form resolved; a value equal to a built-in recipe becomes its name)."""
    if value is None and optional:
        return None
    if isinstance(value, str):
        choice(name, value, recipes.names())
        if value in recipes.builtin_names():
            return value
        value = recipes.get(value)
    elif isinstance(value, dict):
        try:
            value = GemmRecipe.from_dict(value)
        except ValueError as e:
            raise ConfigError(f"Config.{name}: {e}") from e
    elif not isinstance(value, GemmRecipe):
        allowed = f"a recipe name ({', '.join(recipes.names())}), a GemmRecipe"
        allowed += " or None" if optional else ""
        if isinstance(value, QuantSpec):
            raise ConfigError(
                f"Config.{name}=QuantSpec({value.summary()}): a QuantSpec is one operand (put it "
                f"in a GemmRecipe, or override operands with Config.gemms); allowed: {allowed}"
            )
        raise ConfigError(f"Config.{name}={value!r} ({type(value).__name__}); allowed: {allowed}")
    return recipes.builtin_name(value) or value


def coerce(name: str, value, default):
    """Checks the type of a field against its default's and normalizes lists to tuples."""
    if name == "recipe":  # a name or a value: `_recipe` checks it
        return value
    kind = type(default)
    if default is None:  # optional float
        if value is None:
            return None
        kind = float
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is tuple:
        if isinstance(value, dict):
            return tuple(sorted(value.items()))
        if isinstance(value, list | tuple):
            return tuple(tuple(v) if isinstance(v, list) else v for v in value)
    if kind is int and isinstance(value, bool):
        raise ConfigError(f"Config.{name}={value!r}; must be an int, got bool")
    if not isinstance(value, kind):
        what = "a float or None" if default is None else kind.__name__
        raise ConfigError(f"Config.{name}={value!r} ({type(value).__name__}); must be {what}")
    return value


def gemms_field(name: str, value) -> tuple:
    """Per-GEMM and per-operand overrides as the config stores them, sorted by key: a built-in
    name, a QuantSpec (its dict form read) or None; a GemmRecipe that is not built-in becomes
    the specs it gives the key's operands (an operand key given as well wins)."""
    try:
        given = dict(value) if value else {}
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"Config.{name}={value!r}; allowed: a dict {{GEMM or operand: recipe, spec or None}}"
        ) from e
    out: dict[str, Any] = {}
    from_gemms: dict[str, QuantSpec | None] = {}
    for key, src in given.items():
        choice(f"{name} key", key, (*schema.GEMMS, *schema.OPERAND_NAMES, "norms", "outputs"))
        where = f"{name}[{key!r}]"
        if key in ("norms", "outputs") and isinstance(src, str):  # a spec, not a recipe
            raise ConfigError(
                f"Config.{where}={src!r}: {key} takes a QuantSpec (e.g. fl.mxfp4(), or its dict "
                "form) or None, not a recipe name"
            )
        if isinstance(src, dict):
            try:
                src = QuantSpec.from_dict(src)
            except ValueError as e:
                raise ConfigError(f"Config.{where}: {e}") from e
        elif isinstance(src, str | GemmRecipe):
            src = recipe_field(where, src)
        elif src is not None and not isinstance(src, QuantSpec):
            raise ConfigError(
                f"Config.{where}={src!r} ({type(src).__name__}); allowed: a recipe name, a "
                "GemmRecipe, a QuantSpec or None"
            )
        if isinstance(src, GemmRecipe) and key in schema.GEMMS:  # only its specs here count
            for o in schema.OPERANDS[key]:
                from_gemms[schema.operand_name(key, o)] = src.spec(key, o)
        elif isinstance(src, GemmRecipe):
            out[key] = getattr(src, key)
        else:
            out[key] = src
    out = {k: v for k, v in from_gemms.items() if k not in out} | out  # operand keys win
    return tuple(sorted(out.items()))


def rules_field(name: str, value) -> tuple:
    out = []
    for i, rule in enumerate(value):
        if not isinstance(rule, list | tuple) or len(rule) != 2:
            raise ConfigError(f"Config.{name}[{i}]={rule!r}; allowed: (path regex, recipe or None)")
        path, recipe = rule
        try:
            re.compile(path)
        except (re.error, TypeError) as e:
            raise ConfigError(f"Config.{name}[{i}] path {path!r} is not a regex: {e}") from e
        out.append((path, recipe_field(f"{name}[{i}] recipe", recipe, optional=True)))
    return tuple(out)
