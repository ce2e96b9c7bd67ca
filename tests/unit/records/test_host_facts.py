"""The manifest's host facts name the GPUs where nvidia-smi answers, and only there."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sessiongen.records.io import host_facts


def _fake_smi(folder: Path, body: str) -> None:
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)


def test_gpus_are_listed_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_smi(tmp_path, "echo 'NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04'")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert host_facts()["gpus"] == ["NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04"]


def test_no_gpus_key_without_a_working_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi at all
    assert "gpus" not in host_facts()
    _fake_smi(tmp_path, "echo 'No devices were found'; exit 6")
    assert "gpus" not in host_facts()
