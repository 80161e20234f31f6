"""Redirects over HTTP(S): the headers of the storage options stay with their origin.

aiohttp (under fsspec's HTTP filesystem) follows a redirect with the request's headers; it
drops ``Authorization`` and a request's ``auth`` when the redirect leaves the origin, but keeps
every other header (a custom header may be an API key), and a session's ``auth``
(``client_kwargs={"auth": ...}``) is applied again to the request after the hop. The options a
file is opened with are for that file's origin (:mod:`wids.storage.origins`), so on a hop to
another origin :class:`KeepHeadersHome` removes every header the options set (and
``Authorization`` and ``Cookie``) before the request is sent: the redirect is still followed
(aiohttp's bound on hops), and the other origin gets none of them. A hop within the origin
keeps them all.

:func:`confine` adds it to the options of an ``http(s)://`` file whose options set headers,
cookies or a session's auth, through aiohttp's public client middlewares (a session-level
``middlewares=`` of ``client_kwargs``, which fsspec passes to ``aiohttp.ClientSession``). Its
``repr`` names the origin, so each origin gets a filesystem of its own
(:func:`~wids.storage.clients.filesystem` keys them by their options). With an aiohttp older
than 3.12 (no middlewares), such a file is read with ``allow_redirects=False``: a redirect then
fails instead of carrying the headers.

obstore (reqwest) follows redirects with no setting to change: its HTTP transport takes only
headers reqwest itself drops on a hop to another origin (:data:`DROPPED_ACROSS_ORIGINS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .origins import origin

__all__ = ["DROPPED_ACROSS_ORIGINS", "KeepHeadersHome", "confine"]

DROPPED_ACROSS_ORIGINS = frozenset({"authorization", "cookie"})
"""Headers aiohttp and reqwest (obstore) themselves drop on a redirect to another origin."""


@dataclass(frozen=True)
class KeepHeadersHome:
    """An aiohttp client middleware: the headers ``names`` go to ``home`` only.

    Args:
        home: The origin the options were given for (:func:`~wids.storage.origins.origin`).
        names: The lower-case names of the headers to remove from requests to other origins.
    """

    home: str
    names: tuple[str, ...]

    async def __call__(self, request: Any, handler: Any) -> Any:
        """Send ``request`` through ``handler``, without the headers if it leaves ``home``."""
        if origin(str(request.url)) != self.home:
            for name in self.names:
                request.headers.popall(name, None)
        return await handler(request)


def _header_names(options: Mapping[str, Any]) -> set[str]:
    names: set[str] = set()
    for where in (options, options.get("client_kwargs") or {}):
        if not isinstance(where, Mapping):
            continue
        headers = where.get("headers")
        if isinstance(headers, Mapping):
            names.update(str(k).lower() for k in headers)
        if where.get("cookies"):
            names.add("cookie")
        if where.get("auth") is not None:  # a session's auth: aiohttp sends it after any hop
            names.add("authorization")
    return names


def confine(url: str, options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``options`` for ``url``, made to keep their headers at ``url``'s origin (see the module).

    ``options`` unchanged for other URLs and for options that set no header or cookie.
    """
    if "::" in url or not url.lower().startswith(("http://", "https://")):
        return options
    names = _header_names(options)
    if not names:
        return options
    import aiohttp
    import yarl

    try:  # as aiohttp's requests name it (an IDN host in punycode)
        home = origin(str(yarl.URL(url)))
    except ValueError:
        home = origin(url)
    if home is None:
        return options

    client = dict(options.get("client_kwargs") or {})
    if not hasattr(aiohttp, "ClientMiddlewareType"):  # aiohttp < 3.12: no middlewares
        return {**options, "allow_redirects": False}
    keep = KeepHeadersHome(home, tuple(sorted(names | DROPPED_ACROSS_ORIGINS)))
    client["middlewares"] = (keep, *(client.get("middlewares") or ()))
    out = {**options, "client_kwargs": client}
    if out.get("middlewares"):  # a request's own middlewares replace the session's
        out["middlewares"] = (keep, *out["middlewares"])
    return out
