"""The Citus not-applicable list names real tests (a renamed test must not stay listed)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.citus.not_applicable import NOT_APPLICABLE

REPO = Path(__file__).resolve().parents[2]


def test_every_entry_names_a_test_function_with_a_reason() -> None:
    missing = []
    for test_id, reason in NOT_APPLICABLE.items():
        path, name = test_id.split("::")
        source = REPO / path
        functions = (
            {
                node.name
                for node in ast.walk(ast.parse(source.read_text()))
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            if source.is_file()
            else set()
        )
        if name not in functions or not reason.strip():
            missing.append(test_id)
    assert not missing, f"not-applicable entries without a test (or a reason): {missing}"
