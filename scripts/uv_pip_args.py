#!/usr/bin/env python3
"""pip's configuration on this machine as `uv pip install` options, one per line (for the shell
installers, scripts/install.sh and install_verifiers.sh; orchard_gym/pip_install.py says why).
Runs on any python3: it loads that one module by its path, not the package.

    python3 scripts/uv_pip_args.py [PYTHON]   # e.g. --index-strategy\\nunsafe-best-match\\n--find-links\\n...
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "pip_install", Path(__file__).resolve().parent.parent / "orchard_gym" / "pip_install.py")
assert spec is not None and spec.loader is not None
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print("\n".join(module.uv_options(sys.argv[1] if len(sys.argv) > 1 else sys.executable)))
