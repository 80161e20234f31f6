"""A package's names imported from their modules on first use (a module ``__getattr__``).

``storage/``, ``index/`` and ``dataset/`` keep a table of their public names and the module of
each, so importing the package costs nothing until a name is used (the ``wids`` command starts
without numpy or fsspec for what does not need them).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(
    package: str, table: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: a name of ``table`` from its module, kept.

    Args:
        package: The package's ``__name__``.
        table: Public name -> the package's module that defines it (a module named as the
            name itself is the module).
        namespace: The package's ``globals()``, where a name is kept once imported.

    Returns:
        The function to assign to the package's ``__getattr__``.
    """

    def __getattr__(name: str) -> Any:
        module_name = table.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(f".{module_name}", package)
        value = module if module_name == name else getattr(module, name)
        namespace[name] = value
        return value

    return __getattr__
