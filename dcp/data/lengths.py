"""Sample lengths from files and from a dataset: one integer per sample, or one clear error.

    read_lengths("lengths.txt")                   # .txt, .txt.gz, .csv, .parquet, .jsonl
    resolve_lengths("tokens", dataset=rows)       # a column, a function, an array or a file

Never imports torch.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import numbers
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


class WorkloadError(ValueError):
    """A workload spec or lengths file is invalid."""


LengthSource = Sequence[int] | np.ndarray | str | Path | Callable[[int], int]
"""Per-sample counts: an array, a dataset column name, a lengths file, or a function of the index."""



MAX_LENGTH = 2**63 - 1
"""Lengths are int64 everywhere (numpy arrays, the sampler's fingerprint)."""


def _parse_int(value: Any, where: str) -> int:
    """A positive integer length from a file's text (or a parquet/JSON value): "512", 512, and
    whole decimals such as "512.0" (what a float column writes) are accepted."""
    text = value.strip() if isinstance(value, str) else value
    if text is None or text == "":
        raise WorkloadError(f"{where}: empty, not a length")
    if isinstance(text, bool):
        raise WorkloadError(f"{where}: {text!r} is not an integer length")
    if isinstance(text, int):
        number = text
    else:
        try:
            number = int(text) if isinstance(text, str) else None  # int(512.7) would truncate
        except ValueError:
            number = None
        if number is None:
            try:
                real = float(text)
            except (TypeError, ValueError):
                real = math.inf
            if not (math.isfinite(real) and real == int(real)):
                shown = "empty" if real != real else repr(str(text)[:40])
                raise WorkloadError(f"{where}: {shown} is not an integer length")
            number = int(real)
    if number <= 0:
        raise WorkloadError(f"{where}: length {number} must be positive")
    if number > MAX_LENGTH:
        raise WorkloadError(f"{where}: length {number} is too large (more than 2^63 - 1 tokens)")
    return number


def _read_text(path: Path, opener: Any = open) -> str:
    try:
        with opener(path, "rt") as f:
            return f.read()
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise WorkloadError(f"lengths file {path}: cannot read ({e})") from e


def _read_csv(path: Path) -> list[int]:
    """A `tokens` column (or the only column; a first line that is a number is data, not a header)."""
    rows = [(n, row) for n, row in enumerate(csv.reader(io.StringIO(_read_text(path))), 1) if any(c.strip() for c in row)]
    if not rows:
        return []
    header = [c.strip() for c in rows[0][1]]
    if len(header) == 1 and _is_number(header[0]):
        column, data = 0, rows
    elif "tokens" in header:
        column, data = header.index("tokens"), rows[1:]
    elif len(header) == 1:
        column, data = 0, rows[1:]
    else:
        raise WorkloadError(f"lengths file {path}: no 'tokens' column among {header}")
    return [_parse_int(row[column] if column < len(row) else "", f"{path} line {n}") for n, row in data]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_parquet(path: Path) -> list[int]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise WorkloadError(f"lengths file {path}: reading .parquet needs pyarrow: "
                            "install dcp's parquet extra with `scripts/setup_env.sh parquet` "
                            "(or `.venv/bin/pip install -e '.[parquet]'`) in the repository") from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a file that is not parquet
        raise WorkloadError(f"lengths file {path}: cannot read ({e})") from e
    names = table.column_names
    if "tokens" in names:
        column = table.column("tokens")
    elif len(names) == 1:
        column = table.column(0)
    else:
        raise WorkloadError(f"lengths file {path}: no 'tokens' column among {names}")
    return [_parse_int(v, f"{path} row {n}") for n, v in enumerate(column.to_pylist(), 1)]


def read_lengths(path: str | Path) -> np.ndarray:
    """Token counts from a file: .txt/.txt.gz (one integer per line), .csv, .parquet or .jsonl
    (a `tokens` column; a CSV with a single column may omit the header). Blank lines are skipped."""
    if not str(path).strip():
        raise WorkloadError("no lengths file given (an empty path)")
    path = Path(path)
    if path.is_dir():
        raise WorkloadError(f"lengths file {path} is a directory")
    if not path.is_file():
        raise WorkloadError(f"lengths file {path} does not exist")
    name = path.name.lower()
    if name.endswith((".txt", ".txt.gz")):
        text = _read_text(path, gzip.open if name.endswith(".gz") else open)
        values = [_parse_int(line, f"{path} line {n}") for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    elif name.endswith(".jsonl"):
        values = []
        for n, line in enumerate(_read_text(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise WorkloadError(f"{path} line {n}: not valid JSON") from None
            if not isinstance(row, dict) or "tokens" not in row:
                raise WorkloadError(f"{path} line {n}: no 'tokens' field")
            if isinstance(row["tokens"], bool) or not isinstance(row["tokens"], (int, float, str)):
                raise WorkloadError(f"{path} line {n}: tokens {row['tokens']!r} is not an integer length")
            values.append(_parse_int(row["tokens"], f"{path} line {n}"))
    elif name.endswith(".csv"):
        values = _read_csv(path)
    elif name.endswith(".parquet"):
        values = _read_parquet(path)
    else:
        raise WorkloadError(f"lengths file {path}: unknown format (use .txt, .txt.gz, .csv, .parquet or .jsonl)")
    if not values:
        raise WorkloadError(f"lengths file {path} holds no lengths")
    return np.asarray(values, dtype=np.int64)


def resolve_lengths(source: LengthSource, dataset: Any = None, what: str = "lengths") -> np.ndarray:
    """Counts for every sample as an int64 array. A string is a dataset column name (read as
    `dataset[name]` when the dataset has columns, HF datasets, else `dataset[i][name]`) or, with
    no dataset, a lengths file (`dcp.data.read_lengths`); a function is called per index."""
    if isinstance(source, (str, Path)) and dataset is None:
        if not Path(source).is_file():
            raise ValueError(f"{what} {str(source)!r}: no such lengths file (a column name needs dataset=...)")
        values: Any = read_lengths(source)
    elif isinstance(source, str) or callable(source):
        if dataset is None:
            raise ValueError(f"{what} given as a function needs the dataset (dataset=...)")
        n = len(dataset)
        if isinstance(source, str):
            try:
                values = list(dataset[source])
            except (KeyError, TypeError, IndexError, ValueError):
                values = [dataset[i][source] for i in range(n)]
        else:
            values = [source(i) for i in range(n)]
    else:
        values = list(source)
    try:
        raw = np.asarray(values)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must be a 1-D sequence of integers ({e})") from None
    if raw.ndim != 1 or len(raw) == 0:
        raise ValueError(f"{what} must be a non-empty 1-D sequence of integers")
    if raw.dtype.kind not in "iuf" or raw.dtype == bool:
        items = list(values)
        bad = next((i for i, v in enumerate(items) if isinstance(v, bool) or not isinstance(v, numbers.Real)), 0)
        raise ValueError(f"sample {bad}: {what} {items[bad]!r} is not an integer")
    if raw.dtype.kind == "f":
        # A float column (pandas makes one easily) is fine while it holds whole numbers; truncating
        # 100.7 to 100 would plan a sample that is not the one trained.
        fractional = np.flatnonzero(~np.isfinite(raw) | (raw != np.round(raw)))
        if len(fractional):
            raise ValueError(f"sample {fractional[0]}: {what} {raw[fractional[0]]} is not a whole number")
    if raw.dtype.kind != "i" and len(raw) and np.abs(raw).max() >= 2**63:
        raise ValueError(f"{what}: {raw.max()} is too large for a token count")
    out = raw.astype(np.int64)
    if dataset is not None and len(out) != len(dataset):
        raise ValueError(f"{len(out)} {what} for a dataset of {len(dataset)} samples")
    bad = np.flatnonzero(out <= 0)
    if len(bad):
        raise ValueError(f"sample {bad[0]} has non-positive {what} {out[bad[0]]}")
    return out
