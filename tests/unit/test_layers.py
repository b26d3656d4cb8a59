"""The layer contracts in setup.cfg hold (import-linter): the agent never imports the control plane, wire
contracts are standard-library only, pure decision modules import no I/O, the executor sits on the runtimes
and the runtimes on the lifecycle seam, and the lifecycle imports no runtime."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_import_layers_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.fail("import-linter is not installed: `pip install -e '.[test]'` installs it")
    result = subprocess.run([lint, "--config", str(ROOT / "setup.cfg")], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 broken" in result.stdout
