"""One entry of a tar archive, as the walkers report it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Row", "TarMember"]

_REGULAR = frozenset("07")
Row = tuple[str, int, int, str, int]
"""``(name, offset, size, type, header_offset)``: the fields of :class:`TarMember` in order."""


@dataclass(frozen=True, slots=True)
class TarMember:
    r"""One entry of a tar archive.

    Attributes:
        name: Full path, after the ustar prefix, a GNU long name or a pax ``path`` are applied;
            UTF-8 with ``surrogateescape`` for invalid bytes; no trailing slash on directories.
        offset: Byte offset of the member's data in the archive.
        size: Size of the member's data in bytes.
        type: The typeflag as one character: ``"0"`` regular (``"\0"`` is normalised to
            ``"0"``), ``"5"`` directory, ``"2"`` symlink, ``"1"`` hardlink, ...
        header_offset: Where the member's first header block starts, extension headers
            (pax ``x``, GNU ``L``/``K``) included.
    """

    name: str
    offset: int
    size: int
    type: str
    header_offset: int

    @property
    def isreg(self) -> bool:
        r"""Whether this is a regular file (types ``"0"``, ``"7"`` or ``"\0"``)."""
        return self.type in _REGULAR or self.type == "\0"


_set_name, _set_offset, _set_size, _set_type, _set_header_offset = (
    TarMember.__dict__[f].__set__ for f in ("name", "offset", "size", "type", "header_offset")
)


def _member_of(
    name: str, offset: int, size: int, type: str, header_offset: int, _new: Any = object.__new__
) -> TarMember:
    """``TarMember(...)`` at two thirds of the cost.

    The frozen dataclass ``__init__`` goes through ``object.__setattr__`` per field; the slots'
    own setters are quicker. Nothing else differs (the class has no ``__post_init__``).
    """
    m = _new(TarMember)
    _set_name(m, name)
    _set_offset(m, offset)
    _set_size(m, size)
    _set_type(m, type)
    _set_header_offset(m, header_offset)
    return m  # type: ignore[no-any-return]
