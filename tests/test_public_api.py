"""The five public names stay what they are once every module of the package is loaded
(a submodule named like a public function would replace it as the package attribute)."""
from __future__ import annotations

import importlib
import pkgutil
import types

import cuvil


def test_public_names_survive_importing_every_module():
    for info in pkgutil.walk_packages(cuvil.__path__, "cuvil."):
        if ".templates" in info.name:
            continue
        importlib.import_module(info.name)
    assert sorted(cuvil.__all__) == ["CompiledModel", "CuvilError", "capture", "compile", "load_ir"]
    for name in cuvil.__all__:
        value = getattr(cuvil, name)
        assert not isinstance(value, types.ModuleType), f"cuvil.{name} is the module {value.__name__}"
        assert callable(value), name
