"""What a code object says, read from its bytecode once per process (for `_fingerprint`).

The globals a function and the functions nested in it read or write, the attribute names they read, and the
modules they import in their bodies (with the names imported from each): `_fingerprint` follows these to
the helpers and values a step's code uses. Each fact is read once per code object (`of_code`): a code
object is immutable.
"""

from __future__ import annotations

import importlib.util
import types
from typing import Any

_by_code: dict[tuple[str, int, Any], tuple[types.CodeType, Any]] = {}
"""Facts read from a code object, by (what, id of the code object, extra): a code object is immutable, so what
its bytecode says is read once per process; the entry holds the code object, so its id is not reused. A
function's globals, closure and defaults are read afresh every time (they may change while a program runs)."""


def of_code(what: str, code: types.CodeType, extra: Any, compute: Any) -> Any:
    hit = _by_code.get((what, id(code), extra))
    if hit is not None and hit[0] is code:
        return hit[1]
    value = compute()
    _by_code[(what, id(code), extra)] = (code, value)
    return value


_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"})
_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR"})


def code_names(code: types.CodeType) -> tuple[frozenset[str], frozenset[str]]:
    """(the globals `code` and its nested functions read or write, the attribute names they read).

    From the bytecode, not `co_names`, which mixes both: `config.words` must not make a function depend
    on a module-level `words = ...`. Read once per code object (`of_code`)."""
    return of_code("names", code, None, lambda: _read_global_names(code))


def _read_global_names(code: types.CodeType) -> tuple[frozenset[str], frozenset[str]]:
    import dis

    globals_, attrs = set(), set()
    for ins in dis.get_instructions(code):
        if ins.opname in _GLOBAL_OPS:
            globals_.add(ins.argval)
        elif ins.opname in _ATTR_OPS:
            attrs.add(ins.argval)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            g, a = code_names(c)
            globals_ |= g
            attrs |= a
    return frozenset(globals_), frozenset(attrs)


def local_imports(fn: types.FunctionType) -> dict[str, set[str]]:
    """Modules a function (or a function nested in it) imports in its body -> the names it imports from each
    (`from m import a, b`; empty for `import m`). Relative imports are resolved against the function's
    package (its bytecode is read once per code object: `of_code`)."""
    package = fn.__globals__.get("__package__") or ""
    raw = of_code("imports", fn.__code__, None, lambda: _read_imports(fn.__code__))
    found: dict[str, set[str]] = {}
    for level, name, names in raw:
        if level:
            try:
                name = importlib.util.resolve_name("." * level + name, package)
            except (ImportError, ValueError):
                name = ""
        if name:
            found.setdefault(name, set()).update(names)
    return found


def _read_imports(code: types.CodeType) -> tuple[tuple[int, str, frozenset[str]], ...]:
    """(level, module as written, names imported from it) of each import statement in `code` and the code
    nested in it, in order."""
    import dis

    found: list[tuple[int, str, set[str]]] = []

    def visit(code: types.CodeType) -> None:
        consts: list[Any] = []
        current: tuple[int, str, set[str]] | None = None
        for ins in dis.get_instructions(code):
            if ins.opname == "LOAD_CONST":
                consts = [*consts[-1:], ins.argval]
            elif ins.opname == "IMPORT_NAME":
                level = consts[0] if len(consts) == 2 and isinstance(consts[0], int) else 0
                current = (level, ins.argval or "", set())
                found.append(current)
                consts = []
            elif ins.opname == "IMPORT_FROM" and current is not None:
                current[2].add(ins.argval)
            else:
                consts = [] if ins.opname != "LOAD_CONST" else consts
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                visit(c)

    visit(code)
    return tuple((level, name, frozenset(names)) for level, name, names in found)
