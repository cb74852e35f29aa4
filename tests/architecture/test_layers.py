"""The real package obeys docs/design.md's layer rules: import direction, reserved modules, size, names."""

from pathlib import Path

from tests.architecture.rules import ALLOWED_INTERNAL, PACKAGE, check_tree

ROOT = Path(__file__).resolve().parents[2]


def test_package_obeys_architecture_rules():
    violations = check_tree(ROOT)
    assert not violations, "architecture rules broken:\n" + "\n".join(map(str, violations))


def test_every_layer_package_exists_and_says_what_it_owns():
    for layer in ALLOWED_INTERNAL:
        init = ROOT / PACKAGE / layer / "__init__.py"
        assert init.exists(), f"layer package {layer} is missing"
        doc = init.read_text().strip()
        assert doc.startswith('"""') and len(doc) > 40, f"{init} needs a docstring saying what it owns"


def test_every_module_opens_with_a_docstring():
    missing = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / PACKAGE).rglob("*.py")
        if p.stat().st_size and not p.read_text().lstrip().startswith(('"""', 'r"""'))
    ]
    assert not missing, f"modules without an opening docstring: {missing}"
