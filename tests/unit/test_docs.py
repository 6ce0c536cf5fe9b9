"""The README documents what the code defines."""

from pathlib import Path

from addon.findings import CODES
from storage.schema import exchanges

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_finding_code_is_documented_in_the_readme():
    missing = [code for code in CODES if f"`{code}`" not in README]
    assert missing == []


def test_every_exchanges_column_is_documented_in_the_readme():
    missing = [c.name for c in exchanges.columns if f"`{c.name}`" not in README]
    assert missing == []
