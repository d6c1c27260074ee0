"""The Python SDK as a user outside the repository gets it: ``python -m build``
writes a wheel and an sdist named ``casq_sdk`` (the distribution is casq-sdk,
the import name casq) into a temporary folder and leaves the checkout as it
was; the wheel, with the ``[otel]`` extra, installs into a fresh virtualenv
outside the repository (no system site-packages, dependencies from the
index), and the example producer run from there stores its jobs in a real
``casq serve``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from brokers import REPO_ROOT, start_casq_serve

import casq

SDK = REPO_ROOT / "sdk" / "python"
VERSION = (REPO_ROOT / "VERSION").read_text().strip()


def tree(root: Path) -> set[str]:
    """Every file and directory under ``root``, ignored ones included, except caches tests themselves write."""
    skip = {"__pycache__", ".pytest_cache", ".mypy_cache"}
    return {str(p.relative_to(root)) for p in root.rglob("*") if not skip.intersection(p.parts)}


def clean_env() -> dict[str, str]:
    """Our environment without what would let the venv see this checkout's packages."""
    return {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}


def test_wheel_and_sdist_build_outside_and_the_wheel_runs_the_example(tmp_path: Path) -> None:
    before = tree(SDK)
    out = tmp_path / "artifacts"
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--wheel", "--sdist", "--outdir", str(out), str(SDK)],
        check=True,
        capture_output=True,
    )
    assert tree(SDK) == before, "building wrote into sdk/python"
    assert not (SDK / "build").exists()

    wheel = out / f"casq_sdk-{VERSION}-py3-none-any.whl"
    sdist = out / f"casq_sdk-{VERSION}.tar.gz"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"casq_sdk-{VERSION}.dist-info/METADATA").decode()
    assert {"casq/__init__.py", "casq/py.typed", "casq/v1/queue_service_pb2.pyi"} <= names
    assert "Name: casq-sdk" in metadata
    assert "Provides-Extra: otel" in metadata
    with tarfile.open(sdist) as archive:
        members = set(archive.getnames())
    for path in ["pyproject.toml", "src/casq/worker.py", "examples/producer.py", "tests/brokers.py"]:
        assert f"casq_sdk-{VERSION}/{path}" in members, path

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--find-links", str(out),
         f"casq-sdk[otel]=={VERSION}"],
        check=True,
        env=clean_env(),
    )
    app = tmp_path / "app"
    app.mkdir()
    shutil.copy(SDK / "examples" / "producer.py", app / "producer.py")
    where = subprocess.run(
        [str(python), "-c", "import casq; print(casq.__file__)"], cwd=app, env=clean_env(),
        capture_output=True, text=True, check=True,
    )
    assert where.stdout.strip().startswith(str(venv)), where.stdout

    broker = start_casq_serve(f"file:{tmp_path / 'store'}")
    try:
        produced = subprocess.run(
            [str(python), "producer.py", "--brokers", broker.address, "--queue", "emails", "--count", "3"],
            cwd=app, env=clean_env(), capture_output=True, text=True, timeout=120,
        )
        assert produced.returncode == 0, produced.stderr
        lines = produced.stdout.splitlines()
        assert [line.split()[2] for line in lines] == ["job-0", "job-1", "job-2"]
        with casq.Client(brokers=[broker.address], timeout=10.0) as client:
            assert casq.Admin(client).get_queue("emails").totals.ready == 3
    finally:
        broker.terminate(10)
