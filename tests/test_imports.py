"""The import graph of `src/rlplace` has no cycle: each module can be read, tested and replaced after the modules it
imports, and a new task, reward or backend is added without touching what it builds on. (The layers and the
"no Ray here" rules are import-linter contracts in pyproject.toml, checked by `make lint`.)"""

from __future__ import annotations

import grimp


def test_the_package_has_no_import_cycle() -> None:
    """An import a -> b closes a cycle when b leads back to a. Imports under `if TYPE_CHECKING:` are annotations, not
    imports; function-local imports count."""
    graph = grimp.build_graph("rlplace", exclude_type_checking_imports=True)
    closing = sorted(
        f"{a} -> {b}"
        for a in graph.modules
        for b in graph.find_modules_directly_imported_by(a)
        if b.startswith("rlplace.") and graph.chain_exists(importer=b, imported=a)
    )
    assert closing == []
