"""Filter expressions over metadata columns, parsed with :mod:`ast` and never evaluated by Python.

``compile_where("width >= 256 and height >= 256")`` parses the text with ``ast.parse(...,
mode="eval")`` and accepts only a whitelist of nodes; :meth:`Where.evaluate` then computes
the result with numpy over whole columns. Nothing of the text is executed.

The language:

- column names, and constants: numbers, strings, ``True``, ``False``, ``None``;
- comparisons ``== != < <= > >=`` (chains too: ``256 <= width < 1024``), ``in`` / ``not in``
  a tuple or list of constants;
- arithmetic ``+ - * / // %`` and unary ``-``/``+`` on numbers (``width / height > 1.5``;
  a division by zero gives infinity or NaN, integers included; integer arithmetic that
  would overflow int64 is done in float64, and integer constants past int64 are floats);
- ``and``, ``or``, ``not``, parentheses;
- functions ``isnull(col)``, ``notnull(col)``, ``abs(x)``.

Missing values: a comparison with a missing value is false (as NaN compares); ``not`` flips
it, so ``not (width > 5)`` keeps samples without a width; ``isnull``/``notnull`` test for
them. Arithmetic with a missing value is missing. A bool column used as a condition is false
where missing. Bounds: at most :data:`MAX_LENGTH` characters and :data:`MAX_NODES` nodes.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ColumnError

__all__ = ["MAX_LENGTH", "MAX_NODES", "Where", "compile_where"]

MAX_LENGTH = 4096
"""The longest expression (characters)."""
MAX_NODES = 512
"""The most syntax nodes in an expression."""

_COMPARE: dict[type, Any] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_ARITH: dict[type, Any] = {
    ast.Add: np.add,
    ast.Sub: np.subtract,
    ast.Mult: np.multiply,
    ast.Div: np.true_divide,
    ast.FloorDiv: np.floor_divide,
    ast.Mod: np.mod,
}
_FUNCS = ("isnull", "notnull", "abs")
_ALLOWED = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.Not,
    ast.USub,
    ast.UAdd,
    ast.Compare,
    ast.In,
    ast.NotIn,
    ast.BinOp,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.Tuple,
    ast.List,
    ast.Call,
    *_COMPARE,
    *_ARITH,
)


class _Val:
    """A value during evaluation: an array (or a scalar) and where it is missing."""

    __slots__ = ("missing", "value")

    def __init__(self, value: Any, missing: Any) -> None:
        self.value = value
        self.missing = missing


class Where:
    """A parsed filter expression.

    Attributes:
        text: The expression.
        names: The column names it uses.
    """

    def __init__(self, text: str, tree: ast.Expression, names: frozenset[str]) -> None:
        self.text = text
        self._tree = tree
        self.names = names

    def evaluate(self, columns: Mapping[str, Any], n: int) -> np.ndarray:
        """The samples the expression keeps (bool array of ``n``).

        Args:
            columns: Each name in :attr:`names` -> a column (``values``, ``missing``, ``type``
                as :class:`wids.dataset.columns.Column`), ``n`` values each.
            n: The number of samples.

        Raises:
            ColumnError: An operation does not apply to its operands (arithmetic on strings,
                ordering a string and a number).
        """
        with np.errstate(all="ignore"):
            try:
                return _truth(self._bool(self._tree.body, columns), n)
            except OverflowError as e:  # not expected (constants are converted): still typed
                raise ColumnError(f"{self.text!r}: a number out of range ({e})") from None

    def _eval(self, node: ast.AST, cols: Mapping[str, Any]) -> _Val:
        if isinstance(node, ast.Constant):
            return _Val(_constant(node.value), node.value is None)
        if isinstance(node, ast.Name):
            if node.id in ("True", "False", "None"):  # not reached on 3.8+: they are Constants
                raise ColumnError(f"{self.text!r}: unexpected name {node.id}")
            col = cols[node.id]
            return _Val(col.values, col.missing)
        if isinstance(node, ast.BoolOp):
            vals = [self._bool(v, cols) for v in node.values]
            f = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
            out = vals[0]
            for v in vals[1:]:
                out = f(out, v)
            return _Val(out, False)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                return _Val(np.logical_not(self._bool(node.operand, cols)), False)
            v = self._number(node.operand, cols)
            return _Val(-v.value if isinstance(node.op, ast.USub) else v.value, v.missing)
        if isinstance(node, ast.BinOp):
            a, b = self._number(node.left, cols), self._number(node.right, cols)
            value = _arith(_ARITH[type(node.op)], a.value, b.value)
            return _Val(value, np.logical_or(a.missing, b.missing))
        if isinstance(node, ast.Compare):
            return self._compare(node, cols)
        if isinstance(node, ast.Call):
            fname = node.func.id  # type: ignore[attr-defined]  # checked by compile_where
            v = self._eval(node.args[0], cols)
            if fname == "abs":
                v = self._number(node.args[0], cols)
                return _Val(np.abs(v.value), v.missing)
            gaps = np.asarray(v.missing, dtype=bool)
            return _Val(gaps if fname == "isnull" else ~gaps, False)
        raise ColumnError(f"{self.text!r}: {type(node).__name__} is not a value here")

    def _bool(self, node: ast.AST, cols: Mapping[str, Any]) -> Any:
        v = self._eval(node, cols)
        value = v.value
        if isinstance(value, str) or (isinstance(value, np.ndarray) and value.dtype == object):
            raise ColumnError(f"{self.text!r}: a string is not a condition")
        truth = np.asarray(np.nan_to_num(np.asarray(value, dtype=np.float64), nan=0.0) != 0)
        return np.logical_and(truth, np.logical_not(v.missing))

    def _number(self, node: ast.AST, cols: Mapping[str, Any]) -> _Val:
        v = self._eval(node, cols)
        value = v.value
        if isinstance(value, (str, bool)) or (
            isinstance(value, np.ndarray) and value.dtype.kind not in "iuf"
        ):
            raise ColumnError(f"{self.text!r}: arithmetic on a value that is not a number")
        if value is None:
            return _Val(np.nan, True)
        return v

    def _compare(self, node: ast.Compare, cols: Mapping[str, Any]) -> _Val:
        out: Any = True
        left = self._eval(node.left, cols)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            if isinstance(op, (ast.In, ast.NotIn)):
                found = self._member(left, right_node)
                part = (
                    found
                    if isinstance(op, ast.In)
                    else np.logical_and(np.logical_not(found), np.logical_not(left.missing))
                )
                out = np.logical_and(out, part)
                continue
            right = self._eval(right_node, cols)
            out = np.logical_and(out, _compare(_COMPARE[type(op)], left, right, self.text))
            left = right
        return _Val(out, False)

    def _member(self, left: _Val, node: ast.AST) -> Any:
        if not isinstance(node, (ast.Tuple, ast.List)):
            raise ColumnError(f"{self.text!r}: 'in' takes a tuple or list of constants")
        options = [_constant(e.value) for e in node.elts if isinstance(e, ast.Constant)]
        value = left.value
        if isinstance(value, np.ndarray) and value.dtype == object:
            wanted = set(options)
            found = np.fromiter((v in wanted for v in value), dtype=bool, count=len(value))
        elif isinstance(value, np.ndarray) and value.dtype == bool:
            flags = [o for o in options if isinstance(o, bool)]
            found = np.isin(value, np.asarray(flags, dtype=bool))
        elif isinstance(value, np.ndarray):
            nums = [o for o in options if isinstance(o, (int, float)) and not isinstance(o, bool)]
            found = (
                np.isin(value, np.asarray(nums, dtype=np.float64))
                if nums
                else np.zeros(len(value), dtype=bool)
            )
        else:
            found = np.asarray(value in options)
        return np.logical_and(found, np.logical_not(left.missing))


def _constant(value: Any) -> Any:
    """A constant as evaluation uses it: an int past int64 is a float (past float: infinity).

    numpy refuses Python ints it cannot convert (OverflowError from deep inside an
    operation); as floats they compare and compute as the numbers they are.
    """
    if type(value) is int and not -(1 << 63) <= value < (1 << 63):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    return value


def _is_int(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "iu"
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _arith(f: Any, a: Any, b: Any) -> Any:
    """``f(a, b)``; integers that would wrap around int64 (or divide by zero) in float64."""
    if not (_is_int(a) and _is_int(b)) or f is np.true_divide:
        return f(a, b)
    wide = f(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    if f in (np.floor_divide, np.mod):
        return wide if np.any(np.asarray(b) == 0) else f(a, b)  # int // 0 is 0 in numpy
    if np.any(np.abs(wide) >= 2.0**63):  # int64 would wrap: keep the (rounded) magnitude
        return wide
    return f(a, b)


def _compare(f: Any, a: _Val, b: _Val, text: str) -> Any:
    gaps = np.logical_or(a.missing, b.missing)
    av, bv = a.value, b.value
    a_str = isinstance(av, str) or (isinstance(av, np.ndarray) and av.dtype == object)
    b_str = isinstance(bv, str) or (isinstance(bv, np.ndarray) and bv.dtype == object)
    if a_str or b_str:
        if a_str != b_str and f not in (operator.eq, operator.ne):
            raise ColumnError(f"{text!r}: ordering a string and a number")
        if a_str != b_str:
            result = np.broadcast_to(np.asarray(f is operator.ne), np.shape(gaps))
        else:
            n = max(np.size(av), np.size(bv)) if np.ndim(gaps) else 1
            ax = av if isinstance(av, np.ndarray) else [av] * n
            bx = bv if isinstance(bv, np.ndarray) else [bv] * n
            result = np.fromiter(
                (x is not None and y is not None and f(x, y) for x, y in zip(ax, bx, strict=True)),
                dtype=bool,
                count=n,
            )
        return np.logical_and(result, np.logical_not(gaps))
    if av is None or bv is None:
        return np.zeros(np.shape(gaps), dtype=bool) if np.ndim(gaps) else False
    return np.logical_and(f(av, bv), np.logical_not(gaps))


def _truth(value: Any, n: int) -> np.ndarray:
    out = np.asarray(value, dtype=bool)
    if out.ndim == 0:
        return np.full(n, bool(out))
    return out


def compile_where(text: str) -> Where:
    """Parse a filter expression (see the module) without evaluating anything.

    Raises:
        ColumnError: Not a string, too long or too large, a syntax error, or a construct
            outside the whitelist (attributes, subscripts, lambdas, other calls ...).
    """
    from ..index.columns import check_name

    if not isinstance(text, str):
        raise ColumnError(f"a filter expression is a string, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise ColumnError(f"a filter expression of {len(text)} characters, at most {MAX_LENGTH}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ColumnError(f"{text!r}: not an expression ({e})") from None
    names: set[str] = set()
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise ColumnError(f"{text!r}: {len(nodes)} syntax nodes, at most {MAX_NODES}")
    calls = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    for node in nodes:
        if not isinstance(node, _ALLOWED):
            raise ColumnError(f"{text!r}: {type(node).__name__} is not allowed in a filter")
        if isinstance(node, ast.Call):
            if (
                not isinstance(node.func, ast.Name)
                or node.func.id not in _FUNCS
                or len(node.args) != 1
                or node.keywords
            ):
                raise ColumnError(f"{text!r}: the functions are {', '.join(_FUNCS)}, one argument")
        elif isinstance(node, ast.Name) and id(node) not in calls:
            check_name(node.id)
            names.add(node.id)
        elif isinstance(node, ast.Constant) and not isinstance(
            node.value, (int, float, str, type(None))
        ):
            raise ColumnError(f"{text!r}: constant {node.value!r} is not a number or string")
        elif isinstance(node, (ast.Tuple, ast.List)) and not all(
            isinstance(e, ast.Constant) for e in node.elts
        ):
            raise ColumnError(f"{text!r}: 'in' takes a tuple or list of constants")
    return Where(text, tree, frozenset(names))
