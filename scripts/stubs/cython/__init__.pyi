# The part of Cython's pure-Python mode that sessiongen's shared engine sources use
# (sessiongen/sim/timing.py), typed for mypy: Cython ships no stubs. At run time the
# names come from Cython's own module (interpreted) or from the compiler (compiled).
from collections.abc import Callable
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")

compiled: bool

double = float
longlong = int
Py_ssize_t = int
bint = bool

def cclass(cls: type[_T]) -> type[_T]: ...
def cfunc(f: _F) -> _F: ...
def inline(f: _F) -> _F: ...
def exceptval(value: Any = ..., *, check: bool = ...) -> Callable[[_F], _F]: ...
def cast(t: type[_T], value: Any, typecheck: bool = ...) -> _T: ...
