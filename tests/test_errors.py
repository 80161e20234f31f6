"""wids.errors: the tree drawn at the top of the module is the class tree; errors pickle whole."""

from __future__ import annotations

import builtins
import pickle
import re

import pytest

import wids
from wids import errors

_LINE = re.compile(r"^(?P<indent>[ │├└─]*?)(?P<name>[A-Z]\w+)(?:\((?P<builtin>\w+)\))?\s")


def _drawn_tree() -> dict[str, tuple[str | None, str | None]]:
    """``{name: (parent, builtin)}`` from the drawing in the module docstring."""
    doc = errors.__doc__ or ""
    lines = [line[4:] for line in doc.splitlines() if line.startswith("    ") and line.strip()]
    tree: dict[str, tuple[str | None, str | None]] = {}
    stack: list[tuple[int, str]] = []
    for line in lines:
        match = _LINE.match(line + " ")
        assert match, f"not a line of the error tree: {line!r}"
        depth = len(match["indent"]) // 4
        while stack and stack[-1][0] >= depth:
            stack.pop()
        tree[match["name"]] = (stack[-1][1] if stack else None, match["builtin"])
        stack.append((depth, match["name"]))
    return tree


def test_the_drawn_tree_is_the_class_tree():
    tree = _drawn_tree()
    assert set(tree) == set(errors.__all__), "every error class is drawn, and only those"
    for name, (parent, builtin) in tree.items():
        cls = getattr(errors, name)
        wids_bases = [b for b in cls.__bases__ if issubclass(b, errors.WidsError)]
        if parent is None:
            assert cls is errors.WidsError
            continue
        assert [b.__name__ for b in wids_bases] == [parent], name
        if builtin:
            assert getattr(builtins, builtin) in cls.__bases__, name


def test_every_error_is_exported_from_wids():
    assert {n for n in errors.__all__} <= set(wids.__all__)


@pytest.mark.parametrize("name", errors.__all__)
def test_errors_pickle_with_their_shard_and_attributes(name):
    """DataLoader workers send errors to the main process by pickling them."""
    cls = getattr(errors, name)
    if issubclass(cls, errors.TarFormatError):
        err = cls("truncated", shard="s3://b/x.tar", offset=1024)
        assert str(err) == "s3://b/x.tar: truncated at byte 1024"
    else:
        err = cls("went wrong", shard="s3://b/x.tar")
        assert str(err) == "s3://b/x.tar: went wrong"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == str(err)
    assert back.shard == err.shard and back.message == err.message
    assert vars(back) == vars(err)


def test_an_error_without_a_shard_is_its_message():
    err = wids.IndexFormatError("bad field")
    assert str(err) == "bad field" and err.shard is None
    assert str(pickle.loads(pickle.dumps(err))) == "bad field"
