"""The optional extras: which one brings a missing package, and the error that says so.

The distribution ``wids-shards`` installs the core (tar parsing, indexes, the dataset, the
samplers, local files). Everything else is an extra, imported only where it is used; when it is
missing, the error names the extra and how to install it (:func:`install_hint`: wids-shards is
not on the package index, so from a clone, ``pip install -e '.[image]'``)::

    torch    torch       a torch Dataset, ds1 + ds2, DataLoader use, tensor image modes
    image    Pillow      decoding and encoding images
    s3       s3fs        s3:// URLs
    gcs      gcsfs       gs:// URLs
    http     aiohttp     http(s):// URLs
    msgpack  msgpack     .msgpack / .mp fields
    dask     distributed index builds on a Dask cluster (--dask)
    obstore  obstore     the obstore transport (storage option transport="obstore"/"auto")
    compressed indexed_gzip, zstandard   indexing .tar.gz shards, .tar.zst shards
"""

from __future__ import annotations

__all__ = ["install_hint", "missing", "missing_backend"]

_EXTRA_OF_MODULE = {
    "torch": "torch",
    "PIL": "image",
    "s3fs": "s3",
    "gcsfs": "gcs",
    "aiohttp": "http",
    "msgpack": "msgpack",
    "distributed": "dask",
    "obstore": "obstore",
    "indexed_gzip": "compressed",
    "zstandard": "compressed",
}
_PACKAGE_OF_MODULE = {"PIL": "Pillow", "distributed": "dask.distributed"}
_EXTRA_OF_PROTOCOL = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "http": "http",
    "https": "http",
}


def install_hint(extra: str) -> str:
    """How to install ``extra``: from a clone, since wids-shards is not on the package index.

    Example:
        >>> install_hint("http")
        "install the 'http' extra of wids-shards: pip install -e '.[http]' in a clone of its repository (it is not on the package index)"
    """  # noqa: E501
    return (
        f"install the {extra!r} extra of wids-shards: pip install -e '.[{extra}]' in a clone "
        "of its repository (it is not on the package index)"
    )


def missing(module: str, purpose: str, error: ImportError) -> ImportError:
    """The error for an optional ``module`` that failed to import, naming its extra.

    Args:
        module: The package that was imported (``"PIL"``, ``"torch"`` ...).
        purpose: What needed it (``"decoding images"``).
        error: The original error.

    Returns:
        An ``ImportError`` whose message says what to install.
    """
    top = module.split(".")[0]
    extra = _EXTRA_OF_MODULE.get(top)
    hint = install_hint(extra) if extra else f"pip install {top}"
    package = _PACKAGE_OF_MODULE.get(top, top)
    return ImportError(f"{purpose} needs {package} ({error}): {hint}", name=top)


def missing_backend(url: str, error: ImportError) -> ImportError:
    """The error for a URL whose fsspec backend is not installed, naming its extra.

    Args:
        url: The URL that was opened.
        error: What fsspec raised.

    Returns:
        An ``ImportError`` naming the extra, or ``error`` itself for a protocol with no extra.
    """
    protocol = url.split("://", 1)[0].lower() if "://" in url else ""
    extra = _EXTRA_OF_PROTOCOL.get(protocol)
    if extra is None:
        return error
    return ImportError(
        f"{protocol}:// URLs need the {extra} extra ({error}): {install_hint(extra)}"
    )
