"""The README documents what the code defines."""

from pathlib import Path

import pytest

from addon.findings import CODES
from storage.schema import exchange_view, metadata

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_finding_code_is_documented_in_the_readme():
    missing = [code for code in CODES if f"`{code}`" not in README]
    assert missing == []


@pytest.mark.parametrize("table", [*metadata.sorted_tables, exchange_view], ids=lambda t: t.name)
def test_every_table_view_and_column_is_documented_in_the_readme(table):
    missing = [c.name for c in table.columns if f"`{c.name}`" not in README]
    assert f"`{table.name}`" in README and missing == []
