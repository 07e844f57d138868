"""schemas/ is generated from the artifact registry and must not drift from it."""

from libarena.artifacts.registry import all_kinds
from libarena.artifacts.schema_docs import render


def test_every_kind_has_an_up_to_date_schema_file(repo_root):
    for kind in all_kinds():
        if kind.name.startswith("test_"):
            continue
        path = repo_root / "schemas" / f"{kind.name}.json"
        assert path.is_file(), f"schemas/{kind.name}.json is missing: run `make schemas`"
        assert path.read_text() == render(kind), f"schemas/{kind.name}.json is stale: run `make schemas`"
