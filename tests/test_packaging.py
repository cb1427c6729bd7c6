"""The install layout: top-level folders mapped into the orchard_gym namespace."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile

from conftest import REPO

NAMESPACED = ["orchard_gym.backends.local", "orchard_gym.envs", "orchard_gym.envs.harbor.env", "orchard_gym.wrappers", "orchard_gym.algos"]


def test_wheel_installs_only_orchard_gym(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
                   check=True, capture_output=True)
    wheel = next(tmp_path.glob("orchard_gym-*.whl"))
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    # orchard_verifiers: verifiers imports a taskset id as a top-level module (integrations/verifiers.py)
    assert tops == {"orchard_gym", "orchard_verifiers", dist_info}
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    installed = {p.name for p in target.iterdir() if not p.name.endswith(".dist-info")}
    assert installed - {"bin"} == {"orchard_gym", "orchard_verifiers"}  # bin/ holds the console script
    # import from the wheel alone (-S: no .pth files, so not the editable install), deps from site-packages
    probe = (
        "import sys, importlib.util;"
        f"sys.path[:0] = [{str(target)!r}, {sysconfig.get_paths()['purelib']!r}];"
        f"import {', '.join(NAMESPACED)};"
        "import orchard_gym; assert orchard_gym.__file__.startswith(sys.path[0]), orchard_gym.__file__;"
        "assert all(importlib.util.find_spec(m) is None for m in ('envs', 'backends', 'wrappers', 'algos'))"
    )
    subprocess.run([sys.executable, "-S", "-c", probe], check=True, cwd=tmp_path)


def test_editable_install_exposes_namespace_and_no_generic_modules(tmp_path):
    probe = (
        f"import importlib, importlib.util; [importlib.import_module(m) for m in {NAMESPACED!r}];"
        "assert all(importlib.util.find_spec(m) is None for m in ('envs', 'backends', 'wrappers', 'algos'))"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=tmp_path)


def test_import_is_light():
    probe = "import sys, orchard_gym; heavy = {'torch', 'docker', 'kubernetes', 'transformers'} & set(sys.modules); " \
            "assert not heavy, heavy"
    subprocess.run([sys.executable, "-c", probe], check=True, env={**os.environ, "PYTHONWARNINGS": "error"})
