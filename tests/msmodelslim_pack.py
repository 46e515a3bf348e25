"""msModelSlim's W4A8 packing functions, loaded from their file without importing the ``msmodelslim`` package.

Importing the package replaces ``pydantic.BaseModel`` process-wide (measured:
``pydantic.BaseModel`` is another class afterwards), which breaks every later
test in the same pytest process that checks settings models or catches
pydantic's errors. Its ascendv1 saver's ``pack`` module imports only torch, so
it is loaded on its own: the tests still use msModelSlim's code as the oracle
of the int4 layout, and the process is left as it was.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

PACK = Path("core") / "quant_service" / "modelslim_v1" / "save" / "utils" / "pack.py"


def load() -> ModuleType | None:
    """The pack module (``w4a8_pack_int4``, ``process_scale``), or None when msModelSlim is not installed."""
    spec = importlib.util.find_spec("msmodelslim")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / PACK
    module_spec = importlib.util.spec_from_file_location("msmodelslim_ascendv1_pack", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module
