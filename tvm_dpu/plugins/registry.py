"""Finding plugins: the `register_plugin` decorator, the `tvm_dpu.plugins` entry-point group of installed packages,
and the plugins this package ships. A plugin is looked up by name; the runtime also checks its version."""
from __future__ import annotations

import re
from importlib.metadata import entry_points

from tvm_dpu.plugins.api import Plugin, PluginError

ENTRY_POINT_GROUP = "tvm_dpu.plugins"
#: Plugins shipped in this package (module path), loaded on first lookup.
SHIPPED = {"softmax_ip": "tvm_dpu.plugins.softmax_ip", "vitis_mylayer": "tvm_dpu.plugins.vitis_mylayer"}

_REGISTRY: dict[str, Plugin] = {}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def register_plugin(cls_or_instance):
    """Class decorator (or call with an instance): make a plugin available by its `name`."""
    plugin = cls_or_instance() if isinstance(cls_or_instance, type) else cls_or_instance
    if not isinstance(plugin, Plugin):
        raise PluginError(f"{cls_or_instance!r} is not a tvm_dpu.plugins.Plugin")
    if not _NAME.match(plugin.name or "") or plugin.name == "dpu":
        raise PluginError(f"plugin name {plugin.name!r}: use lower-case letters, digits and '_' (not 'dpu')")
    if not plugin.device:
        plugin.device = plugin.name
    _REGISTRY[plugin.name] = plugin
    return cls_or_instance


def _load_entry_point(name: str) -> None:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            obj = ep.load()
            if name not in _REGISTRY:  # the module may have registered itself with the decorator
                register_plugin(obj)
            return


def get_plugin(name: str) -> Plugin:
    """The installed plugin called `name` (PluginError naming what is installed otherwise)."""
    if name not in _REGISTRY:
        if name in SHIPPED:
            __import__(SHIPPED[name])
        else:
            _load_entry_point(name)
    plugin = _REGISTRY.get(name)
    if plugin is None:
        raise PluginError(f"plugin {name!r} is not installed (available: {', '.join(available_plugins()) or 'none'}; "
                          f"a plugin registers with @tvm_dpu.plugins.register_plugin or the {ENTRY_POINT_GROUP!r} "
                          "entry-point group)")
    return plugin


def available_plugins() -> list[str]:
    names = set(_REGISTRY) | set(SHIPPED) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names)


def resolve(plugins) -> list[Plugin]:
    """Plugins given as names ("a,b" or a list), Plugin objects or classes, in order."""
    if plugins is None:
        return []
    if isinstance(plugins, str):
        plugins = [p.strip() for p in plugins.split(",") if p.strip()]
    out = []
    for p in plugins:
        if isinstance(p, str):
            out.append(get_plugin(p))
        else:
            register_plugin(p)
            out.append(_REGISTRY[(p() if isinstance(p, type) else p).name])
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise PluginError(f"plugins {names}: each plugin may be given once")
    return out


def plugin_for_cpu_op(op_type: str) -> Plugin | None:
    """The plugin whose `cpu_ops` name the XIR op type `op_type` (registered, shipped or installed by entry
    point; the first registered wins), or None."""
    def find() -> Plugin | None:
        return next((p for p in _REGISTRY.values() if op_type in p.cpu_ops), None)

    found = find()
    if found is None:
        for name in available_plugins():
            if name not in _REGISTRY:
                get_plugin(name)
        found = find()
    return found
