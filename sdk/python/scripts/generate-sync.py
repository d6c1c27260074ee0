"""Writes the threaded casq client, producer and admin from their asyncio sources (unasync).

casq/aio/client.py, producer.py and admin.py are the hand-written sources;
unasync drops ``async``/``await`` and renames the asyncio-only names (the
table below), and the relative ``._concurrency`` import picks up the threaded
helpers instead of the asyncio ones. The outputs are committed, each marked as
generated on its first line.

    python sdk/python/scripts/generate-sync.py          # rewrite the generated files
    python sdk/python/scripts/generate-sync.py --check  # exit 1 if they differ (tests/test_generated_sync.py)
"""

from __future__ import annotations

import difflib
import shutil
import sys
import tempfile
from pathlib import Path

import unasync

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "casq"
MODULES = ("client.py", "producer.py", "admin.py")
# Names the generated stubs spell differently for grpc.aio (unasync renames only "Async..." prefixes).
REPLACEMENTS = {
    "QueueServiceAsyncStub": "QueueServiceStub",
    "AdminServiceAsyncStub": "AdminServiceStub",
}


def header(module: str) -> str:
    return (
        f"# Generated from casq/aio/{module} by sdk/python/scripts/generate-sync.py (unasync): do not edit;\n"
        "# edit the asyncio source and run the script again (tests/test_generated_sync.py checks it).\n"
    )


def generate() -> dict[str, str]:
    """The generated text of each module, by file name."""
    with tempfile.TemporaryDirectory() as tmp:
        source_dir = Path(tmp) / "casq" / "aio"
        source_dir.mkdir(parents=True)
        sources = []
        for module in MODULES:
            shutil.copyfile(PACKAGE / "aio" / module, source_dir / module)
            sources.append(str(source_dir / module))
        rule = unasync.Rule(fromdir="/casq/aio/", todir="/casq/", additional_replacements=REPLACEMENTS)
        unasync.unasync_files(sources, rules=[rule])
        return {module: header(module) + (Path(tmp) / "casq" / module).read_text() for module in MODULES}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for module, text in generate().items():
        target = PACKAGE / module
        current = target.read_text() if target.exists() else ""
        if current == text:
            continue
        if not check:
            target.write_text(text)
            print(f"generate-sync: wrote {target}")
            continue
        stale.append(module)
        sys.stdout.writelines(
            difflib.unified_diff(
                current.splitlines(keepends=True), text.splitlines(keepends=True), f"{target} (committed)", "generated"
            )
        )
    if stale:
        print(
            f"generate-sync: {', '.join(stale)} differ from what casq/aio/ generates: "
            "run python sdk/python/scripts/generate-sync.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
