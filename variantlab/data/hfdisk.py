"""``source: hf_disk``: documents from a Hugging Face ``datasets`` dataset on disk.

``path`` is a folder written by ``Dataset.save_to_disk`` (or ``DatasetDict.save_to_disk``:
its ``train`` split is read), or files (a path or glob) of parquet, jsonl/json or csv that
``datasets.load_dataset`` reads. Each row's ``column`` is one document. The corpus's content
hash covers every file under the folder (or every matched file) and the column, so the
token cache (:mod:`variantlab.data.cache`) is hit without loading the dataset at all.
``datasets`` is an optional dependency (``pip install 'variantlab[datasets]'``).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .cache import files_hash
from .errors import DataError

#: file suffix -> the ``datasets`` builder that reads it
BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}


def resolve(path: str, base_dir: Path | str = ".") -> tuple[Path | None, list[Path]]:
    """``(folder, [])`` for a saved dataset folder, ``(None, files)`` for data files."""
    full = Path(os.path.expanduser(path))
    if not full.is_absolute():
        full = Path(base_dir) / full
    if full.is_dir():
        if not any((full / name).is_file() for name in ("state.json", "dataset_dict.json")):
            raise DataError(f"data.path {path!r}: {full} is a folder but not one written by "
                            "datasets' save_to_disk (no state.json or dataset_dict.json)")
        return full, []
    files = sorted(Path(p) for p in glob.glob(str(full), recursive=True) if Path(p).is_file())
    if not files:
        raise DataError(f"data.path {path!r}: nothing matches {str(full)!r} (relative paths "
                        f"start at the experiment's folder {str(base_dir)!r})")
    kinds = {BUILDERS.get(f.suffix) for f in files}
    if None in kinds or len(kinds) > 1:
        raise DataError(f"data.path {path!r}: give files of one kind among "
                        f"{sorted(BUILDERS)} (got {sorted({f.suffix for f in files})})")
    return None, files


def hf_corpus(path: str, column: str, base_dir: Path | str = ".",
              ) -> tuple[str, Callable[[], list[str]], str]:
    """``(content hash, documents, where)`` of an ``hf_disk`` source."""
    folder, files = resolve(path, base_dir)
    listed = sorted(p for p in folder.rglob("*") if p.is_file()) if folder else files
    content = hashlib.sha256(
        f"hf_disk\0{column}\0{files_hash(listed)}".encode()).hexdigest()
    documents = functools.partial(read_column, str(folder) if folder else None,
                                  tuple(str(f) for f in files), column, path)
    return content, documents, f"data.path {path!r} (column {column!r})"


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
            raise DataError("source: hf_disk needs the datasets package: pip install "
                        "'variantlab[datasets]' (or pip install datasets)") from None
    return datasets


def read_column(folder: str | None, files: tuple[str, ...], column: str,
                path: str) -> list[str]:
    """The ``column`` of every row, as strings."""
    datasets = _datasets()
    if folder is not None:
        ds = datasets.load_from_disk(folder)
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds:
                raise DataError(f"data.path {path!r} holds the splits {sorted(ds)}, no "
                                "'train'; save the dataset you want to read on its own")
            ds = ds["train"]
    else:
        builder = BUILDERS[Path(files[0]).suffix]
        ds = datasets.load_dataset(builder, data_files=list(files), split="train")
    if column not in ds.column_names:
        raise DataError(f"data.path {path!r} has no column {column!r}; its columns: "
                        f"{ds.column_names}; set data.column")
    return ["" if v is None else str(v) for v in ds[column]]
