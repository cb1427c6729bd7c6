"""A harness venv shipped into a sandbox that cannot see the host: archived once, unpacked
elsewhere, relinked by run.sh to that machine's own python of the same X.Y (here: this
machine, a different folder; the docker run is in tests/test_harness_docker.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from orchard_gym.wrappers.harness import ShippedVenv
from orchard_gym.wrappers.harness.install import HarnessInstallError, ensure_venv_payload, venv_python_version

X_Y = "{}.{}".format(*sys.version_info[:2])


def _venv(tmp_path):
    venv = tmp_path / "host" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{X_Y}" / "site-packages"
    (site / "shipped_mod.py").write_text("WHERE = 'shipped'\n")
    script = venv / "bin" / "hello"  # what pip writes: a #! naming the venv's own python
    script.write_text(f"#!{venv}/bin/python\nimport sys, shipped_mod\nprint(shipped_mod.WHERE, sys.prefix)\n")
    script.chmod(0o755)
    (venv / ".ready").write_text("")
    return venv


def test_a_shipped_venv_runs_where_it_is_unpacked(tmp_path):
    venv = _venv(tmp_path)
    archive = ensure_venv_payload(venv)
    assert ensure_venv_payload(venv) == archive  # cached
    box = tmp_path / "box"
    box.mkdir()
    (box / "venv.tar.gz").write_bytes(archive.read_bytes())
    shipped = ShippedVenv(path=str(box / "venv"), archive=str(box / "venv.tar.gz"), host_path=str(venv),
                          python=venv_python_version(venv))
    subprocess.run(["rm", "-rf", str(venv)], check=True)  # the host's venv is not there to lean on
    run = subprocess.run(["bash", "-c", shipped.relink_script("demo") + '\n"$ORCHARD_HARNESS_VENV/bin/hello"'],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["shipped", str(box / "venv")]
    assert not (box / "venv.tar.gz").exists()


def test_a_sandbox_without_that_python_gets_a_clear_error(tmp_path):
    venv = _venv(tmp_path)
    (tmp_path / "v.tar.gz").write_bytes(ensure_venv_payload(venv).read_bytes())
    shipped = ShippedVenv(path=str(tmp_path / "v"), archive=str(tmp_path / "v.tar.gz"), host_path=str(venv),
                          python="3.99")
    run = subprocess.run(["bash", "-c", shipped.relink_script("demo") + "\necho RAN"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 95 and "RAN" not in run.stdout
    assert "the sandbox has no python3.99 to run demo's venv" in run.stderr


def test_shipped_venv_refuses_garbage(tmp_path):
    with pytest.raises(ValidationError):
        ShippedVenv(path="/w/venv", archive="/w/v.tar.gz", host_path="/h/venv", python="three")
    with pytest.raises(ValidationError):
        ShippedVenv(path="/w/venv", archive="/w/v.tar.gz", host_path="/h/venv", python="3.11", extra=1)
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\n")
    with pytest.raises(HarnessInstallError, match="names no python version"):
        venv_python_version(tmp_path)
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    assert venv_python_version(tmp_path) == "3.11"
    with pytest.raises(HarnessInstallError, match="is not in"):
        ensure_venv_payload(tmp_path / "no-such-venv")
