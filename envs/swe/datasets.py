"""Public SWE datasets' instance records, read as published and turned into `SWETask`s.

Sources (`read_records`): a `.json` / `.jsonl` / `.parquet` file, a folder written by
`datasets.Dataset.save_to_disk` (or `DatasetDict.save_to_disk`: pick `split`), a folder
of `<split>.parquet` / `data/<split>-*.parquet` files (a hub snapshot), or a Hugging Face
hub name (`SWE-bench/SWE-bench_Lite`, or an alias below) where a network allows.

Each record is mapped by its dataset's own schema (`normalize`):

| dataset | recognised by | image | how it is graded |
|---|---|---|---|
| SWE-bench Full/Lite/Verified/Multilingual | `instance_id`, `base_commit` | `image`, else `swebench/sweb.eval.x86_64.<id, __ -> _1776_>:latest` | `eval_script` via swebench's `make_test_spec` (SWE-bench 5 records ship it) |
| SWE-Gym | hub name, or `dataset="swe-gym"` | `xingyaoww/sweb.eval.x86_64.<id, __ -> _s_>:latest` | `eval_script` or `test_cmd` if the record has one |
| SWE-rebench | `install_config` or `docker_image` | `docker_image` / `image_name` | `install_config.test_cmd` (+ `log_parser`), in a SWE-bench-shaped eval script |
| R2E-Gym | `expected_output_json` / `repo_name` + `docker_image` | `docker_image` | `bash run_tests.sh` in /testbed, expected statuses as FAIL_TO_PASS/PASS_TO_PASS |
| SWE-smith | `image_name` without `test_patch` | `image_name` | the bug `patch` is applied at set-up; `test_cmd` if given |

All image-based tasks have their repository at `/testbed` in the image (`workdir`).
`image_prefix` replaces the registry/namespace of every derived or shipped image name
(a mirror, or `localhost/...` for images built here).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TESTBED = "/testbed"
HUB_ALIASES = {
    "swe-bench": "SWE-bench/SWE-bench", "swebench": "SWE-bench/SWE-bench",
    "swe-bench-lite": "SWE-bench/SWE-bench_Lite", "lite": "SWE-bench/SWE-bench_Lite",
    "swe-bench-verified": "SWE-bench/SWE-bench_Verified", "verified": "SWE-bench/SWE-bench_Verified",
    "swe-bench-multilingual": "SWE-bench/SWE-bench_Multilingual",
    "swe-gym": "SWE-Gym/SWE-Gym", "swe-gym-lite": "SWE-Gym/SWE-Gym-Lite",
    "swe-rebench": "nebius/SWE-rebench", "r2e-gym": "R2E-Gym/R2E-Gym-Subset",
    "r2e-gym-lite": "R2E-Gym/R2E-Gym-Lite", "swe-smith": "SWE-bench/SWE-smith",
}
KINDS = ("orchard", "swe-bench", "swe-gym", "swe-rebench", "r2e-gym", "swe-smith")
_DIFF_PATH = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)


class TaskFormatError(ValueError):
    """A task record that cannot be used; the message names where it is and what is wrong."""


# ---------------------------------------------------------------------------- reading
def read_records(source: str | Path, split: str | None = None) -> Iterator[tuple[str, dict]]:
    """(where, record) for every record of `source`; `where` is 'file:line' or 'file row N'."""
    path = Path(source)
    if path.is_file():
        yield from _read_file(path)
    elif path.is_dir():
        yield from _read_folder(path, split)
    elif str(source).lower() in HUB_ALIASES or re.fullmatch(r"[\w.-]+/[\w.-]+", str(source)):
        yield from _read_hub(HUB_ALIASES.get(str(source).lower(), str(source)), split or "test")
    else:
        raise FileNotFoundError(f"no SWE tasks at {source} (a .json/.jsonl/.parquet file, a folder, "
                                "or a Hugging Face dataset name)")


def _read_file(path: Path) -> Iterator[tuple[str, dict]]:
    if path.suffix == ".parquet":
        yield from _rows(str(path), _parquet_rows(path))
        return
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                yield f"{path}:{n}", _json(line, f"{path}:{n}")
        return
    data = _json(text, str(path))
    rows = data if isinstance(data, list) else [data]
    for n, row in enumerate(rows):
        yield f"{path} item {n}", row


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TaskFormatError(f"{where}: not valid JSON: {e.msg} at column {e.colno}") from None


def _rows(where: str, rows) -> Iterator[tuple[str, dict]]:
    for n, row in enumerate(rows):
        yield f"{where} row {n}", row


def _parquet_rows(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("reading .parquet task files needs pyarrow: pip install 'orchard-gym[swe]'") from e
    return pq.read_table(path).to_pylist()


def _read_folder(path: Path, split: str | None) -> Iterator[tuple[str, dict]]:
    if (path / "dataset_dict.json").exists():  # DatasetDict.save_to_disk
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        chosen = split or ("test" if "test" in splits else (splits[0] if splits else ""))
        if chosen not in splits:
            raise TaskFormatError(f"{path}: no split {chosen!r} (it has {', '.join(sorted(splits)) or 'none'})")
        path = path / chosen
    if (path / "state.json").exists() or (path / "dataset_info.json").exists():  # Dataset.save_to_disk
        yield from _rows(str(path), _load_from_disk(path))
        return
    name = split or "test"
    files = [path / f"{name}.parquet"] if (path / f"{name}.parquet").exists() else \
        sorted((path / "data").glob(f"{name}-*.parquet"))
    if not files:
        raise FileNotFoundError(f"no SWE tasks in folder {path}: no tasks.jsonl, */task.json, datasets "
                                f"folder (state.json) or {name}.parquet / data/{name}-*.parquet")
    for file in files:
        yield from _rows(str(file), _parquet_rows(file))


def _load_from_disk(path: Path):
    try:
        from datasets import load_from_disk
    except ImportError as e:
        raise ImportError("reading a `datasets` folder needs the datasets package: "
                          "pip install 'orchard-gym[swe]'") from e
    return load_from_disk(str(path))


def _read_hub(name: str, split: str) -> Iterator[tuple[str, dict]]:
    try:
        from datasets import load_dataset
    except ImportError as e:
        raise ImportError(f"loading {name!r} from the Hugging Face hub needs the datasets package: "
                          "pip install 'orchard-gym[swe]'") from e
    try:
        rows = load_dataset(name, split=split)
    except Exception as e:  # offline, unknown name, unknown split: all the user's to fix
        raise FileNotFoundError(f"cannot load {name!r} (split {split!r}) from the Hugging Face hub: "
                                f"{type(e).__name__}: {e}") from None
    yield from _rows(f"{name}[{split}]", rows)


# ---------------------------------------------------------------------------- mapping
def detect_kind(record: dict, hint: str | None = None) -> str:
    if hint:
        return hint
    if "source_archive" in record:
        return "orchard"
    if "expected_output_json" in record or ("repo_name" in record and "instance_id" not in record):
        return "r2e-gym"
    if "install_config" in record or "docker_image" in record:
        return "swe-rebench"
    if "image_name" in record and not record.get("test_patch"):
        return "swe-smith"
    return "swe-bench"


def kind_for_source(source: str | Path) -> str | None:
    """The schema a hub dataset name implies (SWE-Gym's records look like SWE-bench's but
    their images are named differently); None for a local path or an unknown name."""
    if Path(source).exists():
        return None
    name = HUB_ALIASES.get(str(source).lower(), str(source)).lower()
    for owner, kind in (("swe-gym/", "swe-gym"), ("nebius/", "swe-rebench"), ("r2e-gym/", "r2e-gym"),
                        ("swe-bench/swe-smith", "swe-smith")):
        if name.startswith(owner):
            return kind
    return None


def swebench_image(instance_id: str, namespace: str = "swebench") -> str:
    """SWE-bench's published image name (docker hub forbids `__`, so it becomes `_1776_`)."""
    return f"{namespace}/sweb.eval.x86_64.{instance_id}:latest".lower().replace("__", "_1776_")


def swe_gym_image(instance_id: str) -> str:
    """The name SWE-Gym's (OpenHands') images are published under."""
    return f"xingyaoww/sweb.eval.x86_64.{instance_id}:latest".lower().replace("__", "_s_")


def with_prefix(image: str, prefix: str | None) -> str:
    """`image` under another registry/namespace: everything before its last '/' is replaced."""
    if not prefix:
        return image
    return f"{prefix.rstrip('/')}/{image.rsplit('/', 1)[-1]}"


def diff_paths(patch: str) -> list[str]:
    """Every path a git diff touches (old and new names), in order."""
    seen: dict[str, None] = {}
    for a, b in _DIFF_PATH.findall(patch or ""):
        seen.update({a: None, b: None})
    return list(seen)


def _tests(value) -> list:
    return json.loads(value) if isinstance(value, str) else list(value or [])


def normalize(record: dict, kind: str | None = None, image_prefix: str | None = None) -> dict:
    """The record as `SWETask` fields. Unknown fields are kept (SWETask allows extras)."""
    if not isinstance(record, dict):
        raise TaskFormatError(f"a task record is a JSON object, not {type(record).__name__}")
    kind = detect_kind(record, kind)
    if kind not in KINDS:
        raise TaskFormatError(f"unknown dataset kind {kind!r} (one of {', '.join(KINDS)})")
    if kind == "orchard":
        out = dict(record)
        if image_prefix and out.get("image"):
            out["image"] = with_prefix(out["image"], image_prefix)
        return out
    out = {k: v for k, v in record.items() if v is not None}
    out.update(dataset=kind, workdir=record.get("workdir") or TESTBED)
    if kind == "r2e-gym":
        _r2e_gym(record, out)
    elif kind == "swe-smith":
        out.setdefault("test_patch", "")
        out["image"] = record.get("image_name")
        # the published image holds the clean repository; the instance's patch puts the bug in
        out["bug_patch"], out["patch"] = record.get("patch", ""), ""
    elif kind == "swe-rebench":
        config = record.get("install_config") or {}
        if isinstance(config, str):
            config = json.loads(config)
        out["image"] = record.get("docker_image") or record.get("image_name") or swebench_image(
            str(record.get("instance_id", "")), "swerebench")
        if config.get("test_cmd") and not record.get("test_cmd"):
            out["test_cmd"] = " && ".join(config["test_cmd"]) if isinstance(config["test_cmd"], list) \
                else config["test_cmd"]
        if config.get("log_parser") and not record.get("log_parser"):
            out["log_parser"] = config["log_parser"]
    else:  # swe-bench, swe-gym
        rule = swe_gym_image if kind == "swe-gym" else swebench_image
        out["image"] = record.get("image") or rule(str(record.get("instance_id", "")))
    if out.get("image"):
        out["image"] = with_prefix(out["image"], image_prefix)
    if "test_files" not in record:
        out["test_files"] = diff_paths(out.get("test_patch", ""))
    return out


def _r2e_gym(record: dict, out: dict) -> None:
    image = record.get("docker_image") or ""
    out["image"] = image
    out.setdefault("instance_id", record.get("instance_id") or image.rsplit("/", 1)[-1].replace(":", "-"))
    out.setdefault("repo", record.get("repo_name", ""))
    out.setdefault("base_commit", record.get("commit_hash"))
    expected = record.get("expected_output_json") or "{}"
    expected = json.loads(expected) if isinstance(expected, str) else expected
    # R2E-Gym's reward: every test ends with its expected status; passing ones are what we can check
    out.setdefault("FAIL_TO_PASS", sorted(t for t, s in expected.items() if str(s).upper() == "PASSED"))
    out.setdefault("PASS_TO_PASS", [])
    out.setdefault("test_patch", "")
    out.setdefault("test_cmd", "bash run_tests.sh")
    out.setdefault("patch", "")
