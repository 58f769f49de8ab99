"""Writing files so that nothing is ever left half-written."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_write(destination):
    """Yield an open binary file; on success it becomes ``destination``, on any error it is removed.

    The bytes go to a temporary file in the destination's folder, which is renamed over
    ``destination`` only after the block finished (a rename within one folder is atomic), so
    a crash or an interrupted download never leaves a file that looks complete. The file
    gets the usual permissions (0666 less the umask), not mkstemp's private 0600.
    """
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
