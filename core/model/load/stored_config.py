"""A GGUF later start's model config without transformers (`StoredConfig`): every value the first start's config held
(core/model/load/gguf_direct.py's `full_config`: transformers' own serialisation, defaults included), read back as
attributes.

Why not transformers' config class: importing transformers at all (its package scans every model's files as it
loads) was ~0.4 s of a later start's time to its first token (issue 37, BENCHMARKS.md: "A later start without
transformers"), and the ggml step, its rope table, its cache and the end ids only read values. What needs
transformers' own config (a cache of transformers' classes: core/model/decode/adapter.py's `config_cache`) makes it
from `to_dict()`. tests/unit/test_gguf_direct.py holds a later start on this config to the first start's run, bit
for bit, and the first start checks the rope table made from it against the model's rotary module
(gguf_direct.rope_agrees).
"""

from __future__ import annotations

import copy

__all__ = ["StoredConfig"]


class StoredConfig:
    """`values` (a config's every value by name, as JSON reads them) as read-only attributes: `config.hidden_size`;
    AttributeError for a name it does not hold, as for transformers' config (so `getattr(config, name, None)` reads
    the same). ValueError for values that are not a name-keyed dict."""

    __slots__ = ("_values",)

    def __init__(self, values: dict):
        if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
            raise ValueError("a stored config is a dict of values by name")
        object.__setattr__(self, "_values", copy.deepcopy(values))

    def __getattr__(self, name: str):
        if name in StoredConfig.__slots__:  # not set (an instance not made by __init__): not a value's name
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"the stored config has no {name!r}") from None

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError("a stored config is read-only")

    def __reduce__(self):  # a copy (copy, deepcopy, pickle) is made from the values, through __init__
        return StoredConfig, (self._values,)

    def to_dict(self) -> dict:
        """Its values (a copy)."""
        return copy.deepcopy(self._values)

    def __repr__(self) -> str:
        return f"StoredConfig({self._values.get('model_type', '?')!r}, {len(self._values)} values)"
