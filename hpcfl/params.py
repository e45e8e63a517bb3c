"""Parameter tables into their dataclasses: an algorithm's or a loss term's Params, a model's Options.
Each bad key or value is a ConfigError naming it (the checks of hpcfl.config.coerce)."""
from dataclasses import fields, is_dataclass
from typing import Any, get_type_hints

from hpcfl.config import coerce
from hpcfl.errors import ConfigError


def require_frozen(cls: type, where: str) -> None:
    """A plug-in's Params or Options must be a frozen dataclass, its own fields declared (a subclass
    of one that is not decorated itself would drop its new fields silently)."""
    declared = set(vars(cls).get("__annotations__", {}))
    if not (is_dataclass(cls) and cls.__dataclass_params__.frozen) or declared - set(cls.__dataclass_fields__):
        raise ConfigError(f"[{where}] is read into {cls.__qualname__}, which is not a frozen dataclass: "
                          "decorate it with @dataclass(frozen=True)")


def params_from(cls: type, raw: Any, where: str):
    """Build a Params dataclass (an algorithm's, a term's) from a config table, naming bad keys."""
    if not isinstance(raw, dict):
        raise ConfigError(f"[{where}] must be a table of parameters, got {raw!r}")
    require_frozen(cls, where)
    hints, names = get_type_hints(cls), [f.name for f in fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in [{where}]; valid: {names or 'none'}")
    try:
        return cls(**{k: coerce(f"{where}.{k}", v, hints[k]) for k, v in raw.items()})
    except ValueError as err:
        raise ConfigError(f"[{where}]: {err}") from None


def model_params(raw: dict, options: dict[str, type]) -> dict[str, Any]:
    """Each architecture's options from [model] params ({architecture: its Options dataclass} in
    `options`): a key applies to every architecture and must be an option of each; a table under an
    architecture's name (`params = {preactivation = true, resnet18 = {feature_layer = 512}}`) applies
    to that architecture only and overrides, so a heterogeneous job can give one architecture an
    option the others lack."""
    tables = {name: raw[name] for name in options if isinstance(raw.get(name), dict)}
    common = {k: v for k, v in raw.items() if k not in tables}
    out = {}
    for name, kind in options.items():
        require_frozen(kind, f"model.params of model '{name}'")
        hints, valid, values = get_type_hints(kind), [f.name for f in fields(kind)], {}
        for where, table in (("model.params", common), (f"model.params.{name}", tables.get(name, {}))):
            unknown = sorted(set(table) - set(valid))
            if unknown:
                having = [a for a, k in options.items() if unknown[0] in {f.name for f in fields(k)}]
                hint = (f"; set it in the table of the architectures that have it: model.params.{having[0]} = "
                        f"{{{unknown[0]} = ...}}" if having and where == "model.params" else "")
                raise ConfigError(f"{where}.{unknown[0]} is not an option of model '{name}'; its options: "
                                  f"{valid or 'none'}{hint}")
            values.update({k: coerce(f"{where}.{k}", v, hints[k]) for k, v in table.items()})
        try:
            out[name] = kind(**values)
        except ValueError as err:
            raise ConfigError(f"[model.params] of model '{name}': {err}") from None
    return out
