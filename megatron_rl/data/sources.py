"""Where problem records come from: the files and folders `data.source` may name, read as raw records.

The rule, in order (the first that applies wins):
1. `bundled`: the problem set shipped with the package.
2. An existing file, by suffix: `.jsonl` (one JSON object a line), `.jsonl.gz` (the same, gzipped, as
   HumanEval ships), `.json` (one object or a list of them; `.json.gz` gzipped), `.parquet` (one
   problem a row, read with pyarrow).
3. An existing folder that `datasets` saved (`Dataset.save_to_disk`: it holds `state.json`;
   `DatasetDict.save_to_disk`: `dataset_dict.json`): read with `datasets.load_from_disk`. Of a
   DatasetDict, the `train` split, or the only split; several splits and no `train` are refused.
4. Any other existing folder: the files of those suffixes directly inside it (not in sub-folders;
   hidden files skipped), sorted by name.
5. A glob pattern (`*`, `?` or `[`; `**` recurses): the files it matches, sorted by name.
Folders (4) and globs (5) are read by `datasets.load_dataset("json" | "parquet", data_files=[...])`,
which reads many files (and large ones) as one table; every file must then have one format (`.json`
and `.jsonl`, gzipped or not, are one: `json`), and every file the same columns.

Records come back as (default id, record, where): `where` names the file and line or row, so a bad
record is reported where the user can find it. What a record must hold is `problems.py`'s business.
"""

from __future__ import annotations

import glob
import gzip
import json
from pathlib import Path
from typing import Any

BUNDLED = Path(__file__).parent / "bundled" / "coding_problems.jsonl"
_FORMATS = {".jsonl": "json", ".jsonl.gz": "json", ".json": "json", ".json.gz": "json", ".parquet": "parquet"}
_SUFFIXES = ", ".join(_FORMATS)

Record = tuple[str, Any, str]  # (default id, the decoded record, where it is)


def suffix(path: Path) -> str:
    """The file's format suffix, compound ones (`.jsonl.gz`) included; lower-case."""
    name = path.name.lower()
    return next((s for s in _FORMATS if name.endswith(s)), path.suffix.lower())


def _stem(path: Path) -> str:
    return path.name[: -len(suffix(path))] if suffix(path) else path.stem


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.name.lower().endswith(".gz") else path.open()


def source_problem(source: str) -> str | None:
    """Why `source` names no readable problem records here (None: it does), by the same rule as
    `read_records` but without reading them: `validate` asks this, the driver then reads."""
    if source == "bundled":
        return None
    path = Path(source).expanduser()
    if path.is_file():
        if suffix(path) not in _FORMATS:
            return f"is a {path.suffix or 'suffix-less'} file; problem files are {_SUFFIXES}"
        return None
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return None
        if any(p.is_file() and suffix(p) in _FORMATS for p in path.iterdir() if not p.name.startswith(".")):
            return None
        return (
            f"is a folder with no {_SUFFIXES} files and no saved `datasets` (state.json, dataset_dict.json)"
        )
    if glob.has_magic(source):
        if any(Path(p).is_file() for p in glob.glob(str(path), recursive=True)):
            return None
        return "is a pattern that matches no files"
    return f"does not exist; pass 'bundled', a {_SUFFIXES} file, a folder of them, a glob or a saved `datasets` folder"


def read_records(source: str | Path) -> list[Record]:
    """The raw records `source` names (see the module docstring for the rule)."""
    text = str(source)
    if text == "bundled":
        return _read_file(BUNDLED)
    path = Path(text).expanduser()
    if path.is_file():
        return _read_file(path)
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return _read_saved_dataset(path)
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        files = [p for p in files if suffix(p) in _FORMATS]
        if not files:
            raise FileNotFoundError(
                f"folder {text!r} holds no {_SUFFIXES} files and is not a saved `datasets` folder "
                "(no state.json or dataset_dict.json); point data.source at a file, a folder of such "
                "files, a glob, or a folder written by Dataset.save_to_disk"
            )
        return _read_data_files(text, files)
    if glob.has_magic(text):
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        if not files:
            raise FileNotFoundError(f"the pattern {text!r} matches no files")
        return _read_data_files(text, files)
    raise FileNotFoundError(
        f"problem source {text!r} does not exist; pass 'bundled', a {_SUFFIXES} file, a folder of "
        "them, a glob pattern, or a folder saved with datasets' save_to_disk"
    )


def _read_file(path: Path) -> list[Record]:
    kind = suffix(path)
    if kind in (".jsonl", ".jsonl.gz"):
        return _read_jsonl(path)
    if kind in (".json", ".json.gz"):
        try:
            with _open_text(path) as f:
                data = json.loads(f.read())
        except (json.JSONDecodeError, OSError, EOFError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not valid JSON: {e}") from None
        rows = data if isinstance(data, list) else [data]
        return [(f"{_stem(path)}-{i}", r, f"{path}[{i}]") for i, r in enumerate(rows)]
    if kind == ".parquet":
        import pyarrow.parquet as pq  # a dependency, imported only by those who read Parquet

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow's ArrowInvalid and kin: a damaged or non-Parquet file
            raise ValueError(f"{path}: not a readable Parquet file: {e}") from None
        return [(f"{path.stem}-{i}", row, f"{path} row {i}") for i, row in enumerate(rows)]
    raise ValueError(f"{path}: unsupported problem file type {kind!r}; use {_SUFFIXES}")


def _read_jsonl(path: Path) -> list[Record]:
    records = []
    try:
        with _open_text(path) as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    records.append((f"{_stem(path)}-{line_no}", json.loads(line), f"{path}:{line_no}"))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{line_no}: not valid JSON: {e}") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:  # gzip's BadGzipFile is an OSError
        raise ValueError(f"{path}: not readable as {suffix(path)}: {e}") from None
    return records


def _read_saved_dataset(path: Path) -> list[Record]:
    import datasets  # heavy: imported only for the sources that need it

    loaded = datasets.load_from_disk(str(path))
    split = ""
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded)
        if "train" in loaded:
            split = "train"
        elif len(names) == 1:
            split = names[0]
        else:
            raise ValueError(
                f"{path}: a DatasetDict with splits {names} and no 'train': save the split to train on "
                "alone (dataset_dict[name].save_to_disk(...)) or name it 'train'"
            )
        loaded = loaded[split]
    where = f"{path}[{split}]" if split else str(path)
    return [(f"{path.name}-{i}", row, f"{where} row {i}") for i, row in enumerate(loaded)]


def _read_data_files(source: str, files: list[Path]) -> list[Record]:
    formats = {_FORMATS.get(suffix(p)) for p in files}
    if None in formats or len(formats) != 1:
        kinds = sorted({p.suffix or "(none)" for p in files})
        raise ValueError(
            f"{source!r} matches files of types {kinds}; every file must be {_SUFFIXES}, and all of one "
            "format (JSON Lines and JSON count as one)"
        )
    import datasets  # heavy: imported only for the sources that need it

    try:
        table = datasets.load_dataset(formats.pop(), data_files=[str(p) for p in files], split="train")
    except Exception as e:  # datasets raises many kinds: mixed columns, bad JSON, a cast it cannot make
        names = [p.name for p in files[:5]] + (["..."] if len(files) > 5 else [])
        raise ValueError(
            f"{source!r}: datasets could not read {names} as one table: {type(e).__name__}: {e}. "
            "Every file needs the same columns, each column one type"
        ) from None
    name = Path(source.split("*", 1)[0] or ".").name or "data"
    return [(f"{name}-{i}", row, f"{source} row {i}") for i, row in enumerate(table)]
