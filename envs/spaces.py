"""Gymnasium spaces for text environments that tell the truth about Unicode.

`gymnasium.spaces.Text` only contains strings drawn from its charset (alphanumerics by
default), so an LLM's output would not be "in" the action space. These spaces contain
any Python string (and, for actions, tool-call dicts) up to a length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Space

# what sample() draws from: ASCII, Latin-1, Greek, CJK, emoji, controls and JSON-ish noise
_SAMPLE_ALPHABET = (
    [chr(c) for c in range(32, 127)] + list("\n\t{}[]\":,`") + list("éßøΩλ中文字🙂🚀") + ["\x00", "\u200b"]
)


class UnicodeText(Space[str]):
    """Any str of at most `max_length` characters."""

    def __init__(self, max_length: int = 1_000_000, seed: int | np.random.Generator | None = None):
        self.max_length = int(max_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        length = int(self.np_random.integers(0, min(self.max_length, 200) + 1))
        picks = self.np_random.integers(0, len(_SAMPLE_ALPHABET), size=length)
        return "".join(_SAMPLE_ALPHABET[i] for i in picks)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, UnicodeText) and other.max_length == self.max_length

    def to_jsonable(self, sample_n):
        return list(sample_n)

    def from_jsonable(self, sample_n):
        return list(sample_n)


class AgentAction(UnicodeText):
    """An action: any text (a fenced bash block, a JSON tool call...) or a tool-call dict
    `{"name": str, "arguments": dict | str}` as OpenAI-style harnesses emit."""

    def contains(self, x: Any) -> bool:
        if isinstance(x, dict):
            name = x.get("name", (x.get("function") or {}).get("name") if isinstance(x.get("function"), dict) else None)
            return isinstance(name, str)
        return super().contains(x)

    def __repr__(self) -> str:
        return f"AgentAction(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AgentAction) and other.max_length == self.max_length


class SharedStrings(Sequence):
    """A live, read-only view of strings kept in a shared-memory buffer."""

    def __init__(self, rows: np.ndarray):
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        row = self._rows[index]
        return row[1 : 1 + row[0]].astype("<u4").tobytes().decode("utf-32-le")

    def __deepcopy__(self, memo) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, (Sequence, tuple)) else NotImplemented

    def __repr__(self) -> str:
        return repr(tuple(self))


# -- vector-env support: AsyncVectorEnv keeps observations in shared memory, as UTF-32
# code points with the length in the first slot of each env's row.
def _register_vector_handlers() -> None:
    import multiprocessing as mp

    from gymnasium.vector.utils import create_empty_array, create_shared_memory
    from gymnasium.vector.utils.shared_memory import read_from_shared_memory, write_to_shared_memory

    @create_empty_array.register(UnicodeText)
    def _empty(space: UnicodeText, n: int = 1, fn=np.zeros):
        return tuple("" for _ in range(n))

    @create_shared_memory.register(UnicodeText)
    def _create(space: UnicodeText, n: int = 1, ctx=mp):
        return ctx.Array(np.dtype(np.int32).char, n * (space.max_length + 1))

    @read_from_shared_memory.register(UnicodeText)
    def _read(space: UnicodeText, shared_memory, n: int = 1):
        # AsyncVectorEnv reads the buffer once and expects a live view (as numpy gives for
        # arrays), so this returns one: strings are decoded when accessed
        return SharedStrings(np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape((n, space.max_length + 1)))

    @write_to_shared_memory.register(UnicodeText)
    def _write(space: UnicodeText, index: int, value: str, shared_memory):
        size = space.max_length + 1
        codes = np.frombuffer(value[: space.max_length].encode("utf-32-le"), dtype="<u4").astype(np.int32)
        row = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)[index * size : (index + 1) * size]
        row[0] = len(codes)
        row[1 : 1 + len(codes)] = codes


_register_vector_handlers()
