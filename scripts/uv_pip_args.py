#!/usr/bin/env python3
"""pip's configuration on this machine as `uv pip install` options, one per line.

uv does not read pip.conf or $PIP_*; the installs (scripts/install.sh, install_verifiers.sh) use
uv where they can, and it must see what pip would: the extra index URLs and find-links (a local
CPU build of torch, say) and the constraints file. `pip config list` is pip's own answer (files
and environment); the index strategy is pip's too (the best version over all indexes).

    python3 scripts/uv_pip_args.py     # e.g. --find-links\\n/opt/wheels\\n--index-strategy\\n...
"""

from __future__ import annotations

import shlex
import subprocess
import sys

# pip's option -> uv's; each value may list several, separated by spaces
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint"}


def pip_config(python: str) -> dict[str, list[str]]:
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True).stdout
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if sep and name in OPTIONS:
            for item in shlex.split(value)[0].split() if value.strip() else []:
                if item not in found.setdefault(name, []):
                    found[name].append(item)
    return found


def main() -> None:
    python = sys.argv[1] if len(sys.argv) > 1 else sys.executable
    args = ["--index-strategy", "unsafe-best-match"]  # as pip: the best version over every index
    for name, values in pip_config(python).items():
        for value in values:
            args += [OPTIONS[name], value]
    print("\n".join(args))


if __name__ == "__main__":
    main()
