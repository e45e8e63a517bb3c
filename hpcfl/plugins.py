"""The names a job file gives algorithms, models, data sets, partitions and loss terms, and the
record a result file keeps of the plug-ins among them.

Each kind has one `Registry` (hpcfl.algorithms.ALGORITHMS, hpcfl.models.MODELS,
hpcfl.data.datasets.DATASETS, hpcfl.data.partition.PARTITIONS, hpcfl.terms.TERMS): a name is a
built-in's (`"fedavg"`) or an import path `"package.module:Name"` naming a plug-in outside hpcfl, e.g.

    [algorithm]
    name = "mylab.fl:FedMine"
    terms = { "mylab.terms:Decorrelation" = { weight = 0.1 } }

The built-ins are the objects themselves, registered by the module that defines the registry. A
plug-in is imported when the job is validated (hpcfl.jobs), which every rank does before set-up,
and each name is checked by its registry, built-in or not, on first use: an Algorithm or Term
subclass with a `name` whose hooks take the arguments hpcfl passes (an algorithm defining plan,
downlink and client_update; a feature-matching term with the settings the anchor phase reads), a
callable model constructor, a data-set loader taking (root, train_images), a function with a partition
scheme's signature. A missing
module, a missing name or the wrong kind is a ConfigError naming the key and the path, so the job
exits with status 2 before any rank trains. A result file records each plug-in's path and its
package's version (`plugins` below).
"""
import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from importlib import metadata
from typing import Any

from hpcfl.errors import ConfigError


def is_import_path(name: str) -> bool:
    return ":" in name


class Registry(Mapping):
    """name -> object for one config key; `registry[name]` imports a built-in or a plug-in on first
    use and raises ConfigError (not KeyError) for a name that is neither. Iterates over the built-ins."""

    def __init__(self, key: str, check: Callable[[Any], str | None], builtins: Mapping[str, Any] = ()):
        self.key, self._check, self._builtins, self._loaded = key, check, {}, {}
        for name, found in dict(builtins).items():
            self.register(name, found)

    def register(self, name: str, found: Any) -> None:
        """A built-in: the object, or its import path (imported on first use), checked like a plug-in."""
        self._builtins[name] = found

    def __getitem__(self, name: str) -> Any:
        return self.resolve(name, self.key)

    def resolve(self, name: str, key: str) -> Any:
        """The object `name` stands for; a ConfigError naming `key` if there is none."""
        if name not in self._loaded:
            found = self._builtins.get(name)
            if found is None and not (isinstance(name, str) and is_import_path(name)):
                dotted = isinstance(name, str) and "." in name and ":" not in name
                hint = f" (did you mean {':'.join(name.rsplit('.', 1))!r}?)" if dotted else ""
                raise ConfigError(f"{key} = {name!r} is unknown; valid: {sorted(self._builtins)}, or a plug-in's "
                                  f"import path 'package.module:Name'{hint}")
            if found is None or isinstance(found, str):
                found = self._import(key, name, found or name)
            problem = self._check(found)
            if problem:
                raise ConfigError(f"{key} = {name!r}: {problem}")
            self._loaded[name] = found
        return self._loaded[name]

    def __contains__(self, name) -> bool:
        try:
            self[name]
        except ConfigError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._builtins)

    def __len__(self) -> int:
        return len(self._builtins)

    @staticmethod
    def _import(key: str, name: str, path: str) -> Any:
        module_name, _, attribute = path.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and not (module_name + ".").startswith(err.name + "."):     # found; what it imports is not
                raise ConfigError(f"{key} = {name!r}: module {module_name!r} imports {err.name!r}, which is not "
                                  "installed here; install it on every node") from None
            raise ConfigError(f"{key} = {name!r}: cannot import module {module_name!r} ({err}); install the "
                              "package or put its folder on PYTHONPATH, on every node") from None
        except Exception as err:                # noqa: BLE001 — the plug-in's own code failed as it loaded
            raise ConfigError(f"{key} = {name!r}: importing module {module_name!r} failed: "
                              f"{type(err).__name__}: {err}") from None
        found = module
        for part in attribute.split("."):
            if not part or not hasattr(found, part):
                raise ConfigError(f"{key} = {name!r}: module {module_name!r} has no {attribute!r}")
            found = getattr(found, part)
        return found


def subclass_of(base: type, what: str, required: tuple[str, ...] = ()) -> Callable[[Any], str | None]:
    """A check: a subclass of `base` with its own `name`, defining the `required` hooks, whose
    overrides of `base`'s public methods take the arguments hpcfl passes them (a mistake there would
    otherwise be a TypeError in round 1)."""
    def check(found):
        if not (isinstance(found, type) and issubclass(found, base)):
            return f"{found!r} is not {what} (a subclass of {base.__module__}.{base.__qualname__})"
        if not isinstance(getattr(found, "name", None), str):
            return f"{found.__qualname__} has no `name` (a class attribute, a string)"
        missing = [hook for hook in required if getattr(found, hook) is getattr(base, hook)]
        if missing:
            return f"{found.__qualname__} does not define {', '.join(missing)}, which {what} needs"
        hooks = [n for n, v in vars(base).items()
                 if not n.startswith("_") and (inspect.isfunction(v) or isinstance(v, (classmethod, staticmethod)))]
        for hook in hooks:
            fault = _hook_fault(found, base, hook)
            if fault:
                return f"{found.__qualname__}.{hook}{fault}"
        return None
    return check


def _hook_fault(found: type, base: type, hook: str) -> str | None:
    """Why `found`'s `hook` cannot take the required positional arguments hpcfl passes `base`'s, or None."""
    mine, theirs = inspect.getattr_static(found, hook), inspect.getattr_static(base, hook)
    if mine is theirs:
        return None
    override = getattr(found, hook)
    if not callable(override):
        return f" is a {type(mine).__name__}, not a method"
    try:
        wanted = [p.name for p in inspect.signature(getattr(base, hook)).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
        signature = inspect.signature(override)
    except (TypeError, ValueError):     # no signature to read: its call will tell
        return None
    if isinstance(mine, staticmethod) and inspect.isfunction(theirs):
        wanted = wanted[1:]             # called on an instance: no self
    try:
        signature.bind(*wanted)
    except TypeError as err:
        return f"{signature} does not take the arguments hpcfl passes it ({', '.join(wanted)}): {err}"
    return None


def callable_check(what: str, call: str = "", *args, **kwargs) -> Callable[[Any], str | None]:
    """A registry's check: the plug-in is a class or function and, where `call` says how hpcfl calls
    it (`args` and `kwargs` standing in for the arguments), its signature takes that call."""
    def check(found) -> str | None:
        if not callable(found):
            return f"{found!r} is not {what} (a class or function)"
        try:
            if call:
                inspect.signature(found).bind(*args, **kwargs)
        except ValueError:          # no signature to read (a builtin): its call will tell
            pass
        except TypeError as err:
            return (f"{getattr(found, '__qualname__', found)}{inspect.signature(found)} is not {what}: hpcfl calls "
                    f"{call} ({err})")
        return None
    return check


def plugins(names: Mapping[str, list[str]]) -> dict[str, dict]:
    """For a result file: each plug-in import path among `names` (config key -> names used) with its
    module and its package's version (None where the module is not an installed distribution's)."""
    found = {}
    for key, used in names.items():
        for name in used:
            if is_import_path(name):
                top = name.partition(":")[0].split(".")[0]
                dists = metadata.packages_distributions().get(top, [])
                found[name] = {"key": key, "module": name.partition(":")[0],
                               "version": metadata.version(dists[0]) if dists else None}
    return found
