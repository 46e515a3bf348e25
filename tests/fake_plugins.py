"""Installing a plugin for a test: module files plus a ``<dist>-<version>.dist-info`` with its entry points.

``importlib.metadata`` finds a distribution by its dist-info folder on
``sys.path``; writing one next to the plugin's module is all an installed
plugin is, as far as the kernel's discovery can tell. Shared by the plugin
manager's, the plugin settings' and the e2e slow-step tests.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator, Mapping

import pytest

GROUP = "ascend_kernel.plugins"
_counter = itertools.count()


def write_dist_info(folder: Path, dist: str, entry_points: Mapping[str, str], version: str = "1.0") -> Path:
    """``folder/<dist>-<version>.dist-info`` declaring ``{entry point name: module}`` in the plugin group."""
    info = folder / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n" + "".join(f"{n} = {m}\n" for n, m in entry_points.items()))
    return info


class PluginInstaller:
    """``install({entry point name: module source}, dist=...)`` -> ``{entry point name: entry point text}``.

    Module names are unique per call, so ``sys.modules`` never serves a stale
    one; :meth:`cleanup` forgets them.
    """

    def __init__(self, folder: Path, monkeypatch: Any) -> None:
        self.folder, self.monkeypatch = folder, monkeypatch
        self.modules: list[str] = []

    def __call__(self, plugins: Mapping[str, str], dist: str = "thirdparty-demo",
                 version: str = "1.0") -> dict[str, str]:
        tag = next(_counter)
        modules = {}
        for ep_name, source in plugins.items():
            module = f"ak_tp_{tag}_{ep_name.replace('-', '_')}"
            (self.folder / f"{module}.py").write_text(textwrap.dedent(source))
            modules[ep_name] = module
            self.modules.append(module)
        write_dist_info(self.folder, dist, modules, version)
        self.monkeypatch.syspath_prepend(str(self.folder))
        importlib.invalidate_caches()
        return {ep_name: f"{GROUP}: {ep_name} = {module}" for ep_name, module in modules.items()}

    def cleanup(self) -> None:
        for module in self.modules:
            sys.modules.pop(module, None)
        importlib.invalidate_caches()


@pytest.fixture
def install(tmp_path: Path, monkeypatch: Any) -> Iterator[PluginInstaller]:
    """A :class:`PluginInstaller` over the test's ``tmp_path`` (the modules forgotten afterwards)."""
    installer = PluginInstaller(tmp_path, monkeypatch)
    yield installer
    installer.cleanup()
