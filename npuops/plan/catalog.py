"""The model catalog, and models by reference (`load_model`): a local directory or a catalog name.

The catalog is one TOML file per model under npuops/data/models, architecture facts only.

Each file holds the published config.json values under [config] (same key names, so the same parser reads a
catalog entry and a downloaded model), a `source` citing where they were copied from, and the parameter count
computed from the architecture next to the published one (tests keep the two within a few percent).
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path

from npuops.errors import BadInputError
from npuops.plan.model import (
    ModelSpec,
    arch_from_config,
    model_from_directory,
    weight_bytes_from_arch,
)
from npuops.plan.quantization import FLAG, normalise_quantization

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    hf_id: str
    aliases: tuple[str, ...]
    source: str
    published_parameters: float
    published_active_parameters: float | None
    parameters: int
    active_parameters: int
    spec: ModelSpec


def _key(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


@lru_cache(maxsize=1)
def model_catalog() -> dict[str, CatalogEntry]:
    """Catalog name -> entry; a broken shipped file is a bug, so parse errors propagate."""
    folder = resources.files("npuops") / "data" / "models"
    entries: dict[str, CatalogEntry] = {}
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if not item.name.endswith(".toml"):
            continue
        data = tomllib.loads(item.read_text(encoding="utf-8"))
        arch = arch_from_config(data["config"], f"npuops/data/models/{item.name}")
        name = str(data["name"])
        spec = ModelSpec(
            arch=arch,
            weight_bytes=weight_bytes_from_arch(arch, arch.torch_dtype),
            weights_present=False,
            quantization=None,
            path=None,
            served_name=name,
            weight_bytes_source="architecture",
            catalog_name=name,
        )
        active = data.get("published_active_parameters")
        entries[name] = CatalogEntry(
            name=name,
            hf_id=str(data["hf_id"]),
            aliases=tuple(str(a) for a in data.get("aliases", [])),
            source=str(data["source"]),
            published_parameters=float(data["published_parameters"]),
            published_active_parameters=float(active) if active is not None else None,
            parameters=int(data["parameters"]),
            active_parameters=int(data["active_parameters"]),
            spec=spec,
        )
    return entries


@lru_cache(maxsize=1)
def _lookup_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for entry in model_catalog().values():
        for label in (entry.name, entry.hf_id, entry.hf_id.split("/")[-1], *entry.aliases):
            table[_key(label)] = entry.name
    return table


def catalog_names() -> list[str]:
    return sorted(model_catalog())


def catalog_summary() -> list[dict[str, object]]:
    """What `npuops models` shows of each catalog model: its names, size and architecture (weights at the
    checkpoint's own dtype, as `plan` counts them without --quantization)."""
    rows: list[dict[str, object]] = []
    for name in catalog_names():
        entry = model_catalog()[name]
        arch = entry.spec.arch
        rows.append({
            "name": name, "hf_id": entry.hf_id, "aliases": list(entry.aliases),
            "parameters": entry.parameters,
            "active_parameters": entry.active_parameters if entry.active_parameters != entry.parameters else None,
            "architecture": arch.architectures[0] if arch.architectures else arch.model_type,
            "layers": arch.num_layers, "experts": arch.num_experts or None, "dtype": arch.torch_dtype,
            "weight_bytes": entry.spec.weight_bytes,
            "max_context": arch.max_position_embeddings,
        })
    return rows


def catalog_entry(ref: str) -> CatalogEntry | None:
    """Find by name, alias or Hugging Face id, case-insensitively; an `org/` prefix is optional."""
    table = _lookup_table()
    for candidate in (ref, ref.split("/")[-1]):
        name = table.get(_key(candidate))
        if name is not None:
            return model_catalog()[name]
    return None


def close_names(ref: str, limit: int = 4) -> list[str]:
    """Catalog names resembling `ref`, for the fix of an unknown-model error."""
    table = _lookup_table()
    wanted = _key(ref.split("/")[-1])
    matches = difflib.get_close_matches(wanted, list(table), n=limit * 3, cutoff=0.5)
    names: list[str] = []
    for match in matches:
        if table[match] not in names:
            names.append(table[match])
    if not names:
        # A family prefix ("qwen", "llama-3") still deserves suggestions.
        stem = wanted.split("-")[0]
        names = [n for n in catalog_names() if n.startswith(stem)]
    return names[:limit]


def _looks_like_path(ref: str) -> bool:
    return ref.startswith((".", "/", "~")) or "\\" in ref or ref.count("/") > 1


def load_model(ref: str, quantization: str | None = None) -> ModelSpec:
    """A model from a local directory or a catalog name (case-insensitive; aliases; an org/ prefix is ignored)."""
    if not ref or not ref.strip():
        raise BadInputError("no model given", "pass a model directory or a catalog name such as qwen3-8b")
    candidate = Path(ref).expanduser()
    if candidate.is_dir():
        return model_from_directory(candidate, quantization)
    if candidate.exists():
        raise BadInputError(f"{ref} is a file, not a model directory", "pass the directory that holds config.json")
    entry = catalog_entry(ref)
    if entry is not None:
        quant = normalise_quantization(quantization) if quantization else None
        return replace(
            entry.spec,
            quantization=quant,
            quantization_source=FLAG if quant else None,
            weight_bytes=weight_bytes_from_arch(entry.spec.arch, entry.spec.arch.torch_dtype, quant),
        )
    suggestions = close_names(ref)
    hint = f" (close catalog names: {', '.join(suggestions)})" if suggestions else ""
    if _looks_like_path(ref):
        raise BadInputError(
            f"model directory {ref} does not exist",
            f"check the path, or use a catalog name{hint}",
        )
    raise BadInputError(
        f"{ref!r} is neither a model directory nor a catalog model{hint}",
        "pass a local Hugging Face model directory, or a catalog name (`npuops models` lists them), e.g. qwen3-8b",
    )
