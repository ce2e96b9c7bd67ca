"""Build of sessiongen's compiled modules (everything else is declared in pyproject.toml).

``sessiongen/sim/_core.pyx``, the planner's engine, is Cython compiled as C++;
``sessiongen/workload/_reuse.pyx``, a trace's prefix-sharing walk, as C. Both are
optional: where they cannot be built (no compiler), the install still succeeds and the
pure-Python code runs, which gives the same results (``tests/unit/sim/test_engines.py``,
``tests/unit/workload/test_reuse.py``). Floating-point contraction is off so that
``a * b + c`` rounds twice, as Python does, on every architecture (aarch64 would
otherwise fuse it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPy(build_py):
    """Also ships the analysis notebook inside the package (``sessiongen notebook``)."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "sessiongen" / "report" / "analysis.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / "notebooks" / "analysis.ipynb", target)


class OptionalBuildExt(build_ext):
    """Builds the compiled modules where a compiler is at hand, and warns where it cannot
    (the install goes on; the Python code runs). ``Extension(optional=True)`` alone
    does not do it: a missing compiler still failed ``pip install -e .``, and an
    editable install then copies every extension's build into the tree."""

    def initialize_options(self) -> None:
        super().initialize_options()
        self.failed: set[str] = set()

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # no compiler, no headers, a compile error
            self.failed.add(ext.name)
            self.warn(
                f"{ext.name} not built ({exc}): its pure-Python counterpart will run "
                "(the same results, slower)"
            )

    def copy_extensions_to_source(self) -> None:
        everything = self.extensions
        self.extensions = [e for e in everything if e.name not in self.failed]
        try:
            super().copy_extensions_to_source()
        finally:
            self.extensions = everything


core = Extension(
    "sessiongen.sim._core",
    ["sessiongen/sim/_core.pyx"],
    language="c++",
    extra_compile_args=["-ffp-contract=off"],
    optional=True,
)

reuse = Extension(
    "sessiongen.workload._reuse",
    ["sessiongen/workload/_reuse.pyx"],
    optional=True,
)

setup(
    ext_modules=cythonize([core, reuse], language_level=3, quiet=True),
    cmdclass={"build_py": BuildPy, "build_ext": OptionalBuildExt},
)
