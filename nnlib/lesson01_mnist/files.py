"""Writing files so that nothing is ever left half-written."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import tempfile
from pathlib import Path

LESSON = 1


@contextlib.contextmanager
def atomic_write(destination):
    """Yield an open binary file; on success it becomes ``destination``, on any error it is removed. The bytes go to a
    temporary file in the destination's folder, renamed over ``destination`` only after the block finished (a rename
    within one folder is atomic), so a crash or an interrupted download never leaves a file that looks complete. The
    file gets the usual permissions (0666 less the umask), not mkstemp's private 0600."""
    destination = Path(destination).expanduser()
    handle, temporary = tempfile.mkstemp(dir=destination.parent, prefix=destination.name + ".", suffix=".part")
    os.close(handle)
    try:
        with open(temporary, "wb") as stream:  # stream.name is the temporary path
            yield stream
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, destination)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_csv(records, path, fields) -> None:
    """Write dict records as CSV with the columns ``fields`` (other keys ignored), atomically, creating the folder."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(records)
    Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as stream:
        stream.write(text.getvalue().encode())


def read_csv(path, fields, integers=(), floats=(), what: str = "records") -> list[dict]:
    """Read CSV records, checking that every column of ``fields`` is there (else ValueError naming the file and the
    missing columns). Columns in ``integers`` and ``floats`` are converted; an empty cell becomes None or NaN."""
    records = []
    with open(path, newline="") as stream:
        for row in csv.DictReader(stream):
            missing = [name for name in fields if name not in row]
            if missing:
                raise ValueError(f"{path}: not a CSV of {what} (no column {', '.join(missing)})")
            for name in integers:
                row[name] = int(row[name]) if row[name] else None
            for name in floats:
                row[name] = float(row[name]) if row[name] else float("nan")
            records.append(row)
    return records
