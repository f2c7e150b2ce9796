"""The catalog of feature maps: every built-in map registered under its name, the maps of
installed packages found through their entry points, and a map built by name.

    phi = build_feature_map("dpfp", d_key=64, nu=2)        # phi.d_dot == 256
    phi = build_feature_map("favor", d_key=64, d_dot=128)  # m resolved from d_dot: m == 128
    name = load_target("cube.Cube")  # a map of the user's own, by import path: "cube"

The maps import ``feature_maps`` (base class, helpers, registry); this module imports them and
registers the built-in ones in the order of the registry's "valid:" lists.
"""

import importlib
import inspect
import sys

import torch

from kernelzoo.maps import zoo
from kernelzoo.maps.dpfp import DPFP
from kernelzoo.maps.base import (ENTRY_POINTS, FEATURE_MAPS, OLD_ENTRY_POINTS, ConfigError, Elu,
                                 FeatureMap, Identity, InfeasibleError, Relu, Softmax, Tanh,
                                 Taylor, is_count, register, require)
from kernelzoo.maps.random_features import Favor, Trig

BUILT_IN = (Softmax, Identity, Relu, Elu, Tanh, DPFP, Favor, Trig, Taylor, zoo.SquaredRelu,
            zoo.Sigmoid, zoo.Hedgehog, zoo.T2R, zoo.ReBased, zoo.PolySketch, zoo.CosFormer)
for _cls in BUILT_IN:
    register(_cls)

__all__ = ["FEATURE_MAPS", "ConfigError", "InfeasibleError", "build_feature_map",
           "check_first_call", "load_target", "map_class", "resolve_params"]
# how a map of the user's own is found, for every "unknown feature map" line
OWN_MAP = ("a map of your own: feature_map._target_=<module>.<Class> (a .py file on the path: the "
           f"working directory or your experiments' folder) or an installed package's entry "
           f"point in {ENTRY_POINTS!r} (docs/own_map.md)")


PLUGIN_FAILURES: dict[str, str] = {}  # entry point -> why it failed to import
_LOADED: set[str] = set()


def _load_entry_points():
    """Import every entry point of ENTRY_POINTS not imported yet (a FeatureMap class is
    registered; a module registers its own maps with @register on import), and of its former
    name OLD_ENTRY_POINTS, with one warning line per package that still uses it. Each on its
    own: one that raises, or calls sys.exit, on import is recorded in PLUGIN_FAILURES and the
    others still load."""
    from importlib.metadata import entry_points

    for ep in [*entry_points(group=ENTRY_POINTS), *entry_points(group=OLD_ENTRY_POINTS)]:
        if ep.name in _LOADED or ep.name in PLUGIN_FAILURES:
            continue
        if ep.group == OLD_ENTRY_POINTS:
            print(f"warning: feature map plugin {ep.name!r} ({ep.value}) is registered under the "
                  f"deprecated entry-point group {OLD_ENTRY_POINTS!r}; valid: {ENTRY_POINTS!r}",
                  file=sys.stderr)
        try:
            loaded = ep.load()
            if isinstance(loaded, type) and issubclass(loaded, FeatureMap):
                register(loaded)
        except (Exception, SystemExit) as err:
            PLUGIN_FAILURES[ep.name] = (f"{ep.name!r} ({ep.value}) failed to import: "
                                        f"{type(err).__name__}: {err}")
            continue
        _LOADED.add(ep.name)


def _lookup(name, params):
    """The class registered as `name`, after checking that it takes every parameter in params."""
    if name not in FEATURE_MAPS:
        _load_entry_points()
    failed = ("; feature map plugins that failed: " + "; ".join(PLUGIN_FAILURES.values())
              if PLUGIN_FAILURES else "")
    require(name in FEATURE_MAPS,
            f"unknown feature map {name!r}; valid: {', '.join(FEATURE_MAPS)}; {OWN_MAP}{failed}")
    cls = FEATURE_MAPS[name]
    valid = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "d_key")]
    for p in params:
        require(p in valid, f"{name}: unknown parameter {p!r}; valid: {', '.join(valid) or '(none)'}")
    return cls


def load_target(target: str) -> str:
    """Import the FeatureMap class at the import path ``target`` ("module.Class": a module on
    sys.path, e.g. a file of the user's in the working directory; no package needed), register
    it under its ``name`` and return that name. A ConfigError names what is wrong."""
    module, _, attr = str(target).rpartition(".")
    require(bool(module) and attr.isidentifier(),
            f"feature_map._target_={target}: not an import path; valid: <module>.<Class>")
    try:
        found = getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as err:
        raise ConfigError(f"feature_map._target_={target}: no module {err.name!r} on the path "
                          f"(sys.path: the working directory, your experiments' folder, "
                          f"PYTHONPATH); valid: <module>.<Class> of a file there") from None
    except AttributeError:
        raise ConfigError(f"feature_map._target_={target}: module {module!r} has no {attr!r}") \
            from None
    except Exception as err:  # the user's module failed on import: one line, its own words
        raise ConfigError(f"feature_map._target_={target}: importing {module!r} failed: "
                          f"{type(err).__name__}: {err}") from None
    require(isinstance(found, type) and issubclass(found, FeatureMap) and bool(found.name),
            f"feature_map._target_={target}: {found!r} is not a FeatureMap subclass with a name "
            "(docs/own_map.md)")
    if FEATURE_MAPS.get(found.name) is not found:
        register(found)
    return found.name


def map_class(name):
    """The class registered as ``name`` (an installed package's map included), or None where
    no map has that name: what a stored run's map declares about itself (``label_of``,
    ``sizing_param``, ``run_id_shows``) is read from its class."""
    if name not in FEATURE_MAPS:
        _load_entry_points()
    return FEATURE_MAPS.get(name)


def resolve_params(name, d_key, d_dot, **params):
    """Constructor kwargs (including d_key) with which FEATURE_MAPS[name] has this d_dot: nu for
    dpfp, m for favor and trig, d_key itself for the elementwise maps and taylor. A sizing
    parameter given explicitly must agree with d_dot (else ConfigError); None means not given."""
    params = {k: v for k, v in params.items() if v is not None}
    cls = _lookup(name, params)
    require(is_count(d_key), f"{name}: d_key must be an integer >= 1, got {d_key!r}")
    try:
        return cls.params_for_d_dot(d_dot, d_key, **params)
    except InfeasibleError:
        fixed = getattr(cls, "sizing_param", None)
        if fixed not in params:  # no d_key reaches this d_dot: an infeasible point, recorded
            raise
        fits = next((k for k in range(1, D_KEY_SOLVED + 1) if _reaches(cls, d_dot, k, params)),
                    None)
        if fits is None:
            raise
        raise ConfigError(f"{name}: {fixed}={params[fixed]} cannot reach d_dot={d_dot} with "
                          f"d_key={d_key}; valid: d_key={fits}, or leave feature_map.{fixed} "
                          "unset (d_dot then sets it)") from None


D_KEY_SOLVED = 4096  # the largest d_key tried when a fixed sizing parameter misses a d_dot


def _reaches(cls, d_dot, d_key, params) -> bool:
    """True when ``cls`` with ``params`` has d_dot ``d_dot`` at ``d_key``."""
    try:
        cls.params_for_d_dot(d_dot, d_key, **params)
    except (InfeasibleError, ConfigError):
        return False
    return True


def build_feature_map(name, *, d_key, d_dot=None, **params):
    """FEATURE_MAPS[name](d_key=d_key, **params); with d_dot, the sizing parameter is resolved
    from it first (resolve_params). A parameter given as None takes its default."""
    params = {k: v for k, v in params.items() if v is not None}
    if d_dot is None:
        _lookup(name, params)
        return _construct(name, {"d_key": d_key, **params})
    return _construct(name, resolve_params(name, d_key, d_dot, **params))


def _construct(name, kwargs):
    """FEATURE_MAPS[name](**kwargs); ConfigError naming a parameter its constructor requires
    and ``kwargs`` lacks (a map of the user's own without a default for it)."""
    cls = FEATURE_MAPS[name]
    required = [p.name for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
                if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    missing = [p for p in required if p not in kwargs]
    require(not missing, f"{name}: no value for {', '.join(missing)}, which its constructor "
                         f"requires; valid: feature_map.{missing[0] if missing else ''}=<value>")
    return cls(**kwargs)


def check_first_call(phi) -> None:
    """ConfigError when a map of another package than kernelzoo (a plugin) emits features of
    another width than it declares, checked on two random keys before any training (the
    random state is left as it was: the run's draws are unchanged). Non-finite features are
    the run's to record (diverged), not refused here."""
    if phi.is_softmax or type(phi).__module__.split(".")[0] == "kernelzoo":
        return
    with torch.random.fork_rng(), torch.no_grad():
        out = phi(torch.randn(2, phi.d_key))
    width = out.shape[-1] if isinstance(out, torch.Tensor) and out.dim() else None
    require(width == phi.width,
            f"{phi.name}: its features at a first call have width {width}, not the "
            f"{phi.width} it declares (d_dot, FeatureMap.__init__); valid: a forward that "
            "returns d_dot features per key")
