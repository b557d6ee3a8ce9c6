"""The package as users install it: a wheel built from the checkout, installed into a fresh virtual environment,
runs `rlplace-plan` and a short `rlplace-train` with the config tree it carries (no checkout on its path).

The fresh environment gets rlplace from the wheel alone; its dependencies (torch, Ray, ...) are borrowed from the
project's environment through a path file, since the test machine may not download them again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*command: str | Path, cwd: Path) -> str:
    result = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (command, result.stdout[-2000:], result.stderr[-2000:])
    return result.stdout


@pytest.mark.slow
def test_a_wheel_in_a_fresh_venv_plans_and_trains(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run(
        sys.executable, "-m", "pip", "wheel", ROOT, "--no-deps", "--no-build-isolation", "-q", "-w", dist, cwd=tmp_path
    )
    (wheel,) = dist.glob("rlplace-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel, cwd=tmp_path)
    site_packages = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path).strip()
    )
    (site_packages / "borrowed_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")

    where = _run(python, "-c", "import rlplace; print(rlplace.__file__)", cwd=tmp_path)
    assert where.startswith(str(site_packages)), where  # the wheel's copy, not the checkout
    plan = json.loads(_run(venv / "bin" / "rlplace-plan", "plan.format=json", cwd=tmp_path))
    assert plan["mode"] == "hybrid" and set(plan["components"]) == {"env", "rollout", "actor"}
    run_dir = tmp_path / "run"
    _run(venv / "bin" / "rlplace-train", "debug=fast", "runner.max_steps=2", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0, 1]
