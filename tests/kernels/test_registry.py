"""The backend registry: built-ins and the zoo, lookups that name what is known, plugins, broken backends."""

from __future__ import annotations

import pytest

from hicache_fuzz.harness.model.platform import Platform
from hicache_fuzz.kernels.registry import BrokenBackend, Registry, UnknownBackend, load_registry

CPU = Platform("cpu")


def test_builtins_include_the_reference_and_the_zoo() -> None:
    registry = load_registry()
    assert "reference" in registry.names() and registry.names() == sorted(registry.names())
    assert registry.get("reference").probe(CPU).available
    zoo = registry.zoo()
    assert zoo and all(b.models_bug for b in zoo) and not registry.get("reference").models_bug


def test_an_unknown_backend_names_the_known_ones() -> None:
    registry = load_registry()
    with pytest.raises(UnknownBackend) as raised:
        registry.get("no-such-backend")
    assert "unknown backend 'no-such-backend'" in str(raised.value) and "reference" in str(raised.value)
    assert registry.unavailable_reason("no-such-backend", CPU) == "backend 'no-such-backend' is not installed here"
    assert registry.unavailable_reason("reference", CPU) == ""


def test_a_plugin_adds_its_backends() -> None:
    registry = load_registry(["tests._cli_plugin:backends"])
    assert registry.get("test-drops-last-page").description.startswith("test plugin")


@pytest.mark.parametrize(("spec", "error"), [
    ("tests._cli_plugin", ValueError),  # no callable named
    ("tests._cli_plugin:nothing_here", ValueError),
    ("no_such_module_anywhere:backends", ImportError),
    ("tests._cli_plugin:Case", TypeError),  # neither a Backend nor something producing backends
])
def test_bad_plugin_specs_raise_what_the_cli_turns_into_exit_2(spec: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        load_registry([spec])


def test_a_broken_backend_is_listed_unavailable_with_its_reason() -> None:
    registry = Registry({"gone": BrokenBackend("gone", "import failed: no module named gone")})
    assert registry.unavailable_reason("gone", CPU) == "backend gone unavailable: import failed: no module named gone"
    with pytest.raises(RuntimeError, match="import failed"):
        registry.get("gone").plan(None, CPU)
