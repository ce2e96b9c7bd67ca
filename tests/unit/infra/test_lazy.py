"""infra.lazy: a module imported on its first attribute read, one object for everyone."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sessiongen.infra.lazy import lazy_module


def test_the_module_loads_on_first_use_and_is_the_one_a_plain_import_gets() -> None:
    code = (
        "import sys; from sessiongen.infra.lazy import lazy_module; "
        "m = lazy_module('fractions'); before = 'decimal' in sys.modules; "
        "half = m.Fraction(1, 2); import fractions; "
        "print(before, 'decimal' in sys.modules, fractions is m, str(half))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # fractions imports decimal when it runs: not before the first read, then once
    assert out.stdout.split() == ["False", "True", "True", "1/2"]


def test_an_imported_module_is_returned_as_it_is() -> None:
    import json

    assert lazy_module("json") is json


def test_a_missing_module_fails_at_once() -> None:
    with pytest.raises(ModuleNotFoundError, match="no_such_module_here"):
        lazy_module("no_such_module_here")


def test_scipy_special_loads_without_numpy_extras_which_still_work_when_read() -> None:
    code = (
        "import sys; from sessiongen.analysis.stats import spc; "
        "t = float(spc.stdtrit(10, 0.975)); "
        "loaded = [n for n in ('numpy.f2py', 'numpy.testing') "
        "if type(sys.modules[n]).__name__ == 'module']; "
        "import numpy.testing; numpy.testing.assert_equal(1, 1); import numpy; "
        "print(round(t, 6), loaded or '-', type(numpy.testing).__name__, "
        "callable(numpy.f2py.run_main))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # scipy.special computed; the extras were not run until read, then work as numpy's
    assert out.stdout.split() == ["2.228139", "-", "module", "True"]
