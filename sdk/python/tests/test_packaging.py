"""`pip install ./sdk/python` gives a complete package: a wheel built from the
source tree holds the hand-written modules, the generated stubs with their
type information, and the runtime dependencies; installed on its own, it
imports and talks to nothing but its dependencies."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

SDK = Path(__file__).resolve().parents[1]


def build_wheel(out: Path) -> Path:
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    source = out / "source"
    shutil.copytree(
        SDK, source, ignore=shutil.ignore_patterns("build", "*.egg-info", ".*cache", "__pycache__", "tests")
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)],
        check=True,
    )
    (wheel,) = out.glob("casq_sdk-*.whl")
    return wheel


def test_wheel_holds_the_whole_sdk(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = next(archive.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    for module in ["client", "producer", "worker", "admin", "job", "errors", "_tracing", "aio/worker", "aio/admin"]:
        assert f"casq/{module}.py" in names, module
    assert "casq/py.typed" in names
    for proto in ["message", "queue_service", "admin_service", "work"]:
        assert f"casq/v1/{proto}_pb2.py" in names
        assert f"casq/v1/{proto}_pb2.pyi" in names
    assert "casq/v1/queue_service_pb2_grpc.py" in names
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert {r.split(">")[0].split("<")[0].split("=")[0] for r in requires} >= {"grpcio", "protobuf", "opentelemetry-api"}


def test_installed_wheel_imports_on_its_own(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
    )
    # PYTHONPATH comes before the editable install of the test environment, so this imports the wheel's copy.
    probe = (
        "import casq, casq.aio, casq.v1.queue_service_pb2_grpc as g; "
        "print(casq.__file__); print(sorted(n for n in casq.__all__ if n in {'Admin', 'Producer', 'Worker'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    location, exported = result.stdout.splitlines()
    assert location.startswith(str(target))
    assert exported == "['Admin', 'Producer', 'Worker']"
