"""infra.collector: the collector's passes skip what existed, or stop, and come back."""

from __future__ import annotations

import gc

import pytest

from sessiongen.infra.collector import frozen_heap, no_collections


def test_a_frozen_heap_leaves_existing_objects_out_until_it_ends() -> None:
    before = gc.get_freeze_count()
    with frozen_heap():
        assert gc.get_freeze_count() > before  # what exists now is frozen
    assert gc.get_freeze_count() == 0  # and given back to the collector


def test_a_frozen_heap_is_given_back_when_the_work_fails() -> None:
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0


def test_no_collections_restores_what_it_found() -> None:
    assert gc.isenabled()
    with no_collections():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with no_collections():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()


def test_a_plan_runs_with_the_imports_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    from sessiongen.capacity import plan as plan_mod

    seen: list[int] = []

    def inner(*args: object, **kwargs: object) -> None:
        seen.append(gc.get_freeze_count())

    monkeypatch.setattr(plan_mod, "_plan", inner)
    plan_mod.plan("any.toml")
    assert seen and seen[0] > 0 and gc.get_freeze_count() == 0


def test_the_command_line_freezes_the_heap_at_exit() -> None:
    import subprocess
    import sys

    # a hook registered before main() runs after main's own (exit hooks run last first)
    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('FROZEN', gc.get_freeze_count() > 0))\n"
        "from sessiongen.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "FROZEN True", out.stdout + out.stderr
