"""Rows (``list[dict]``) from a local dataset: JSON lines, JSON, Parquet, a ``datasets`` save_to_disk
directory, or a directory of JSON-lines / Parquet files; and the reverse for JSON lines.

    rows = load_rows("train.jsonl")             # also .json, .parquet, a save_to_disk dir (split="train")
    require_fields(rows, ("question", "answer"), "train.jsonl")   # ValueError naming the first bad row
    write_jsonl(rows, "out/train.jsonl")         # atomic: a reader never sees half a file

Parquet and ``datasets`` directories need the optional extra ``pip install jaxrl_reason[data]``
(pyarrow, datasets), imported only when such a source is read.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import tempfile
from collections.abc import Iterable, Mapping, Sequence

SUFFIXES = (".jsonl", ".json", ".parquet")


class DataError(ValueError):
    """A dataset that cannot be used as given: unreadable, empty, a row without a named field, a prompt
    that does not render. The message names the file and the row."""


def _optional(module: str, what: str):
    """Import an optional dependency, or ImportError telling how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"reading {what} needs the {module.split('.')[0]!r} package: "
                          "pip install 'jaxrl_reason[data]'") from e


def _check_split(split: str | None, path: pathlib.Path) -> None:
    if split is not None:
        raise DataError(f"{path}: split={split!r} only applies to a datasets DatasetDict directory or a "
                         "directory of files named after their split")


def _read_jsonl(path: pathlib.Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {lineno}: invalid JSON ({e.msg}, column {e.colno})") from e
            if not isinstance(row, dict):
                raise DataError(f"{path}: line {lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _read_json(path: pathlib.Path) -> list[dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        hint = " (one object per line? name the file .jsonl)" if e.msg == "Extra data" else ""
        raise DataError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}{hint}") from e
    if isinstance(data, dict):
        key = next((k for k in ("data", "rows") if isinstance(data.get(k), list)), None)
        if key is None:
            raise DataError(f"{path}: a JSON object must hold the rows as a list under 'data' or 'rows' "
                             f"(keys: {list(data)})")
        data = data[key]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a list of objects, got {type(data).__name__}")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise DataError(f"{path}: row {i} (0-based) is a {type(row).__name__}, not an object")
    return data


def _read_parquet(path: pathlib.Path) -> list[dict]:
    pq = _optional("pyarrow.parquet", f"{path}")
    return pq.read_table(path).to_pylist()


def _read_saved_dataset(path: pathlib.Path, split: str | None) -> list[dict]:
    """A directory written by ``datasets.Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    ds = _optional("datasets", f"{path}").load_from_disk(str(path))
    if hasattr(ds, "keys"):  # DatasetDict
        splits = list(ds.keys())
        if split is None and len(splits) != 1:
            raise DataError(f"{path}: a DatasetDict with splits {splits}; pass split=<one of them>")
        split = splits[0] if split is None else split
        if split not in splits:
            raise DataError(f"{path}: no split {split!r}; the splits are {splits}")
        ds = ds[split]
    else:
        _check_split(split, path)
    return ds.to_list()


def _split_files(path: pathlib.Path, split: str | None) -> list[pathlib.Path]:
    """The sorted .jsonl/.parquet files of a directory; with ``split``, those named ``<split>`` or
    ``<split>-*`` / ``<split>_*`` (the Hugging Face hub layout ``train-00000-of-00002.parquet``)."""
    files = sorted(f for f in path.iterdir() if f.is_file() and f.suffix in (".jsonl", ".parquet"))
    if not files:
        raise DataError(f"{path}: a directory without .jsonl or .parquet files (nor a datasets save_to_disk "
                         "directory)")
    if split is None:
        return files
    chosen = [f for f in files if f.stem == split or f.stem.startswith((f"{split}-", f"{split}_"))]
    if not chosen:
        raise DataError(f"{path}: no file of split {split!r} (named {split}.jsonl, {split}-*.parquet, ...) among "
                         f"{[f.name for f in files]}")
    return chosen


def not_found(path) -> str:
    """The one line for a dataset argument that is no local path (nothing is downloaded: how to fetch it)."""
    from jaxrl_reason.models.lm.packaged import download_command

    return (f"{path} is not a local path; nothing is downloaded: fetch the dataset first, e.g. "
            f"`{download_command(path, 'dataset')}`, then point --data (or --eval-data) at a JSONL / Parquet file "
            "(or a folder of them) in DIR")


def load_rows(path: str | os.PathLike, split: str | None = None) -> list[dict]:
    """All rows of a local dataset as dicts (see the module docstring for the formats); a path that does not exist
    is a FileNotFoundError saying how to fetch a dataset (``not_found``).

    ``split`` picks a split of a DatasetDict directory (needed unless it has one split) or the files of
    a directory named after it; it is an error for a single file."""
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(not_found(path))
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            rows = _read_saved_dataset(path, split)
        else:
            rows = [row for f in _split_files(path, split) for row in _read_file(f)]
    else:
        _check_split(split, path)
        rows = _read_file(path)
    if not rows:
        raise DataError(f"{path} has no rows")
    return rows


def _read_file(path: pathlib.Path) -> list[dict]:
    readers = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}
    if path.suffix not in readers:
        raise DataError(f"{path}: unknown dataset format {path.suffix!r}; expected one of {SUFFIXES} or a "
                         "directory")
    return readers[path.suffix](path)


def require_fields(rows: Sequence[Mapping], fields: Iterable[str], source: str) -> None:
    """ValueError naming the first row (0-based) that lacks one of ``fields``, with the keys it has."""
    fields = tuple(fields)
    for i, row in enumerate(rows):
        missing = [f for f in fields if f not in row]
        if missing:
            raise DataError(f"{source}: row {i} (0-based) has no field {missing[0]!r} (required: {list(fields)}; "
                             f"the row's fields: {list(row)})")


def _json_line(row, i: int) -> str:
    if not isinstance(row, Mapping):
        raise DataError(f"row {i} (0-based) is a {type(row).__name__}, not a dict")
    try:
        return json.dumps(row, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        for key, value in row.items():
            try:
                json.dumps({key: value}, allow_nan=False)
            except (TypeError, ValueError):
                raise DataError(f"row {i} (0-based), field {key!r}: a {type(value).__name__} is not "
                                 f"JSON-serialisable ({e})") from e
        raise DataError(f"row {i} (0-based) is not JSON-serialisable: {e}") from e


def write_jsonl(rows: Iterable[Mapping], path: str | os.PathLike) -> pathlib.Path:
    """Write rows as JSON lines, atomically (a temporary file in the same directory, then os.replace);
    NaN/inf or non-JSON values raise ValueError naming the row and field, leaving ``path`` untouched."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would make the dataset private
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for i, row in enumerate(rows):
                f.write(_json_line(row, i) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return path
