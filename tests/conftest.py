"""Shared fixtures: real tars in every format, real storage servers on 127.0.0.1.

Each fixture module is owned by one piece of work; this file only gathers them (and the one
collection hook, which runs each module's part).
"""

from __future__ import annotations

from typing import Any

import pytest
from ordering import slow_files_first
from serverfixtures import *  # noqa: E402, F403
from serverfixtures import pytest_collection_modifyitems as mark_server_tests
from tarfixtures import *  # noqa: F403


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: the markers must be there
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    mark_server_tests(config, items)
    slow_files_first(items)
