"""Shared fixtures: real tars in every format, real storage servers on 127.0.0.1.

Each fixture module is owned by one piece of work; this file only gathers them.
"""

from __future__ import annotations

from serverfixtures import *  # noqa: E402, F403
from tarfixtures import *  # noqa: F403
