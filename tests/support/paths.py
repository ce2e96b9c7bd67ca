"""Where the project's files are, for tests in any folder."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
NOTEBOOKS = ROOT / "notebooks"
FIXTURES = ROOT / "tests" / "fixtures"
