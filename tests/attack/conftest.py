"""Every test in tests/attack carries the `attack` marker."""

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "/attack/" in str(item.fspath):
            item.add_marker(pytest.mark.attack)
