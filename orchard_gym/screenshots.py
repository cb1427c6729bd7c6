"""Image observations as chat content: screenshots -> OpenAI `image_url` content parts.

A GUI env's observation is `{"screenshot": uint8 array (H, W, 3), "text": str}`; a chat
policy gets it as a user message whose content is a list of parts:

    [{"type": "text", "text": "..."},
     {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}]

PNG is encoded with the standard library (zlib) so nothing beyond numpy is needed;
JPEG (smaller, lossy) needs Pillow.
"""

from __future__ import annotations

import base64
import io
import os
import struct
import zlib
from pathlib import Path
from typing import Any

from .errors import InvalidRequest

IMAGE_KEYS = ("screenshot", "image")


def image_array(array: Any) -> Any:
    """An image as an (H, W, C) uint8 array, C in 1/3/4 ((H, W) grey gets C = 1); InvalidRequest
    saying what is wrong otherwise."""
    import numpy as np

    a = np.asarray(array)
    if a.dtype != np.uint8:
        raise InvalidRequest(f"an image must be uint8, not {a.dtype}")
    if a.ndim == 2:
        a = a[..., None]
    if a.ndim != 3 or a.shape[2] not in (1, 3, 4) or 0 in a.shape[:2]:
        raise InvalidRequest(f"an image is (H, W, 3) (or 1/4 channels), not shape {a.shape}")
    return a


def encode_png(array: Any, level: int = 1) -> bytes:
    """An (H, W, 3) or (H, W, 4) uint8 array (or (H, W) grey) -> PNG bytes. zlib level 1: a
    1280×720 screen in ~70 ms here, 10% larger than level 6, which takes 8× as long."""
    import numpy as np

    a = image_array(array)
    h, w, c = a.shape
    colour = {1: 0, 3: 2, 4: 6}[c]
    rows = np.concatenate([np.zeros((h, 1), np.uint8), np.ascontiguousarray(a).reshape(h, w * c)], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), level)) + chunk(b"IEND", b""))


def encode_jpeg(array: Any, quality: int = 85) -> bytes:
    import numpy as np

    try:
        from PIL import Image
    except ImportError as e:
        raise InvalidRequest("JPEG needs Pillow (pip install pillow); PNG needs nothing") from e
    buf = io.BytesIO()
    Image.fromarray(np.asarray(array)).convert("RGB").save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def data_url(array: Any, fmt: str = "png") -> str:
    """An image array -> a `data:image/...;base64,` URL."""
    if fmt == "png":
        data, mime = encode_png(array), "image/png"
    elif fmt in ("jpeg", "jpg"):
        data, mime = encode_jpeg(array), "image/jpeg"
    else:
        raise InvalidRequest(f"image format is png or jpeg, not {fmt!r}")
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def is_image_observation(obs: Any) -> bool:
    return isinstance(obs, dict) and any(obs.get(k) is not None for k in IMAGE_KEYS)


def observation_text(obs: Any) -> str:
    """The text of an observation (a dict's `text`; anything else as a string)."""
    if isinstance(obs, dict):
        return str(obs.get("text") or "")
    return obs if isinstance(obs, str) else str(obs)


def observation_parts(obs: Any, fmt: str = "png") -> str | list[dict]:
    """An observation -> chat content: a string for text, a list of parts (text first, then
    the image) for a dict with a `screenshot`. A screenshot already given as a data URL or
    an http(s) URL is passed on as it is."""
    if not isinstance(obs, dict):
        return observation_text(obs)
    if not is_image_observation(obs):
        raise InvalidRequest("a dict observation needs a 'screenshot' (an image array) next to its 'text'")
    parts: list[dict] = []
    if obs.get("text"):
        parts.append({"type": "text", "text": str(obs["text"])})
    image = next(obs[k] for k in IMAGE_KEYS if obs.get(k) is not None)
    url = image if isinstance(image, str) and image.startswith(("data:image/", "http://", "https://")) \
        else data_url(image, fmt)
    parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def image_arrays(content: Any) -> list[Any]:
    """The images of chat content parts, decoded to arrays (for a local vision model)."""
    import numpy as np

    out = []
    for part in content if isinstance(content, list) else []:
        if isinstance(part, dict) and part.get("type") == "image_url":
            url = (part.get("image_url") or {}).get("url", "")
            head, _, payload = url.partition(",")
            if not head.startswith("data:image/") or ";base64" not in head:
                raise InvalidRequest("only base64 data URLs can be decoded locally")
            from PIL import Image

            out.append(np.asarray(Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB")))
    return out


class ScreenshotFiles:
    """A screenshot sink for `run_episode(screenshots=...)`: writes each image observation as a
    PNG under `folder` (one subfolder per episode) and returns its path relative to `base`
    (the trajectories file's folder), which `orchard view` reads back."""

    def __init__(self, folder: str | Path, base: str | Path):
        self.folder, self.base = Path(folder), Path(base)

    def __call__(self, trajectory: Any, turn: int, image: Any) -> str:
        episode = self.folder / f"{trajectory.task_id}-{trajectory.sandbox_id or id(trajectory)}".replace("/", "_")
        episode.mkdir(parents=True, exist_ok=True)
        path = episode / ("reset.png" if turn < 0 else f"turn-{turn:03d}.png")
        path.write_bytes(encode_png(image))
        return os.path.relpath(path, self.base)
