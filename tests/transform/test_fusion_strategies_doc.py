"""docs/fusion.md's table of fusion strategies names exactly the registered ones."""

import re
from pathlib import Path

import opfusion as opf

DOC = Path(__file__).resolve().parents[2] / "docs" / "fusion.md"


def test_the_docs_table_lists_the_registered_strategies():
    table = DOC.read_text().split("| strategy | passes | kernels |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(\w+)`(?: \(default\))? \|", table, re.MULTILINE)
    assert sorted(rows) == sorted(opf.transform.fusion_strategies())
