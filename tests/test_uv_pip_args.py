"""scripts/uv_pip_args.py: pip's configuration as uv's options (scripts/install.sh installs with uv
where it can, and uv reads neither pip.conf nor $PIP_*)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "uv_pip_args.py"


def fake_python(tmp_path: Path, config_list: str, code: int = 0) -> Path:
    """An interpreter stand-in whose `-m pip config list` prints `config_list`."""
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{config_list}\nEOF\nexit {code}\n")
    exe.chmod(0o755)
    return exe


def run(python: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(python)], capture_output=True, text=True)


def test_indexes_find_links_and_constraints_become_uv_options(tmp_path):
    listed = ("global.cert='/etc/ssl/certs/ca.crt'\n"
              "global.constraint='/etc/xdg/pip/constraints.txt'\n"
              "global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'\n"
              "global.find-links='/opt/wheels'\n"
              ":env:.find-links='/opt/wheels'\n"          # the same again from $PIP_FIND_LINKS: once
              ":env:.default-timeout='180'")
    r = run(fake_python(tmp_path, listed))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["--index-strategy", "unsafe-best-match"]  # pip's: best over all
    pairs = list(zip(*[iter(r.stdout.split()[2:])] * 2))
    assert pairs == [("--constraint", "/etc/xdg/pip/constraints.txt"),
                     ("--extra-index-url", "file:///opt/pypi/simple"),
                     ("--extra-index-url", "file:///opt/pypi-more/simple"), ("--find-links", "/opt/wheels")]


def test_no_configuration_gives_only_the_strategy_and_a_broken_pip_fails(tmp_path):
    assert run(fake_python(tmp_path, "")).stdout.split() == ["--index-strategy", "unsafe-best-match"]
    garbage = run(fake_python(tmp_path, "no equals sign here\nglobal.find-links=\n=orphan"))
    assert garbage.returncode == 0 and garbage.stdout.split() == ["--index-strategy", "unsafe-best-match"]
    broken = run(fake_python(tmp_path, "", code=3))  # install.sh then falls back to pip
    assert broken.returncode != 0 and broken.stdout == ""


# ---------------------------------------------------------------- orchard_gym/pip_install.py

def tiny_wheel(folder: Path) -> Path:
    """A wheel of one module, `orchard_tiny` (a wheel is a zip with its dist-info)."""
    import zipfile

    path = folder / "orchard_tiny-0.1-py3-none-any.whl"
    files = {"orchard_tiny/__init__.py": "VALUE = 42\n",
             "orchard_tiny-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: orchard-tiny\nVersion: 0.1\n",
             "orchard_tiny-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\n"
                                                 "Tag: py3-none-any\n"}
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("orchard_tiny-0.1.dist-info/RECORD", "".join(f"{n},,\n" for n in files) +
                   "orchard_tiny-0.1.dist-info/RECORD,,\n")
    return path


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_pip_install_installs_and_compiles_with_uv_or_without_it(tmp_path, monkeypatch, installer):
    from orchard_gym import pip_install as module

    if installer == "pip":  # no uv: pip installs it, the same way
        monkeypatch.setattr(module, "_uv", lambda: None)
    else:
        assert module._uv() is not None, "the project's venv installs uv (scripts/venv_install.sh)"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    r = module.pip_install(python, [str(tiny_wheel(tmp_path))], timeout=300)
    assert r.returncode == 0, r.stderr
    out = subprocess.run([python, "-c", "import orchard_tiny, sys; print(orchard_tiny.VALUE, orchard_tiny.__file__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "42"
    # compiled up front: a sandbox that sees the venv read-only could not write the .pyc itself
    assert list((Path(out[1]).parent / "__pycache__").glob("__init__.*.pyc"))


def test_pip_install_of_something_that_does_not_exist_fails_with_pips_words(tmp_path):
    from orchard_gym.pip_install import pip_install

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    r = pip_install(str(tmp_path / "venv" / "bin" / "python"), [str(tmp_path / "no-such-0.1-py3-none-any.whl")],
                    timeout=300)
    assert r.returncode != 0 and "no-such" in r.stderr
