"""Backend configs: one pydantic model per backend, told apart by `type`.

Each config builds its backend with `get_backend()`; the backend modules are imported
only then, so `import orchard_gym` never pulls in docker or kubernetes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class LocalBackendConfig(BaseModel):
    """Sandboxes as local processes, in bubblewrap namespaces where available."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["local"] = "local"
    root: Path | None = Field(None, description="where sandbox folders live (default: $ORCHARD_LOCAL_ROOT or /tmp/orchard-gym-UID)")
    isolation: Literal["auto", "bwrap", "none"] = Field(
        "auto", description="bwrap: PID/mount/network namespaces; none: a plain process; auto: bwrap when present"
    )
    die_with_client: bool = Field(True, description="kill sandboxes when the creating process dies")
    max_output: int = Field(4 * 1024 * 1024, gt=0, description="bytes of stdout/stderr kept per command")

    def get_backend(self):
        from orchard_gym.backends.local import LocalBackend

        return LocalBackend(self)


BackendConfig = Annotated[Union[LocalBackendConfig], Field(discriminator="type")]
_adapter: TypeAdapter = TypeAdapter(BackendConfig)


def parse_backend_config(data: dict | BaseModel) -> BaseModel:
    """A config object from a dict like {"type": "local", ...}."""
    from orchard_gym.errors import InvalidRequest

    if isinstance(data, BaseModel):
        return data
    try:
        return _adapter.validate_python(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'config'}: {err['msg']}" for err in e.errors())
        raise InvalidRequest(f"bad backend config {data!r}: {problems}") from None
