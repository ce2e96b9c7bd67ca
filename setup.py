"""Build of sessiongen's one compiled module, the planner's engine (everything else is
declared in pyproject.toml).

``sessiongen/sim/_core.pyx`` is Cython compiled as C++. The extension is optional: where
it cannot be built (no compiler), the install still succeeds and the planner runs the
pure-Python engine, which gives the same results (``tests/unit/sim/test_engines.py``).
Floating-point contraction is off so that ``a * b + c`` rounds twice, as Python does,
on every architecture (aarch64 would otherwise fuse it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPy(build_py):
    """Also ships the analysis notebook inside the package (``sessiongen notebook``)."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "sessiongen" / "report" / "analysis.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / "notebooks" / "analysis.ipynb", target)


core = Extension(
    "sessiongen.sim._core",
    ["sessiongen/sim/_core.pyx"],
    language="c++",
    extra_compile_args=["-O2", "-ffp-contract=off"],
    optional=True,
)

setup(
    ext_modules=cythonize([core], language_level=3, quiet=True),
    cmdclass={"build_py": BuildPy},
)
