"""The threaded client, producer and admin are what scripts/generate-sync.py makes of casq/aio/ (no drift)."""

from __future__ import annotations

import importlib.util
import tokenize
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "generate-sync.py"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_sync", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_modules_match_their_asyncio_sources() -> None:
    generator = load_generator()
    for module, text in generator.generate().items():
        committed = (generator.PACKAGE / module).read_text()
        assert committed == text, (
            f"casq/{module} differs from what casq/aio/{module} generates: "
            "run .venv/bin/python sdk/python/scripts/generate-sync.py"
        )


def test_generated_modules_say_so_and_await_nothing() -> None:
    generator = load_generator()
    for module in generator.MODULES:
        path = generator.PACKAGE / module
        assert path.read_text().startswith(f"# Generated from casq/aio/{module}")
        with path.open() as source:
            names = {token.string for token in tokenize.generate_tokens(source.readline) if token.type == tokenize.NAME}
        assert not names & {"async", "await", "aio", "asyncio", "Awaitable"}, module
