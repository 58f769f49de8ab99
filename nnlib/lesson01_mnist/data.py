"""MNIST: find, download, verify, parse, and prepare the data.

The four official IDX files are looked up in the directory the caller names (``load_mnist(data_dir=...)``), then in
``$NNLIB_DATA``, then in the user cache ``$XDG_CACHE_HOME/nnlib/mnist`` (default ``~/.cache/nnlib/mnist``); else they
are downloaded into the cache from the mirrors in ``MIRRORS``. Each file may be gzip-compressed (``.gz``) or raw;
its *decompressed* bytes must have the SHA-256 listed in ``SHA256``, and its IDX header (magic number, element type,
dimensions, exact length) must agree with its contents. Any problem raises :class:`MNISTError` naming the file and
what to do. The IDX format (http://yann.lecun.com/exdb/mnist/) is big-endian: ``0x00 0x00 <type code> <number of
dimensions>``, then one uint32 per dimension, then the data. MNIST uses type code 0x08 (unsigned byte) throughout.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import struct
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nnlib.lesson01_mnist.files import atomic_write

LESSON = 1

# The decompressed files' SHA-256 (identical to the official distribution's).
SHA256 = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}

# Mirrors serving ``<name>.gz`` (the same two torchvision uses).
MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "https://storage.googleapis.com/cvdf-datasets/mnist/")

IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def how_to_fetch(names, mirror: str) -> str:
    """What to do when MNIST cannot be downloaded here (``names``: the missing files)."""
    return (f"To fetch MNIST on a machine with internet, run `python -m nnlib fetch-data` there (or download "
            f"{', '.join(name + '.gz' for name in names)} from {mirror}), then copy the files (.gz or decompressed) "
            f"into {cache_dir()} on this machine, or into any folder and set NNLIB_DATA to it.")


class MNISTError(RuntimeError):
    """Something is wrong with an MNIST file or with getting one."""


@dataclass
class MNIST:
    """The MNIST arrays as stored in the IDX files: train_images (60000, 28, 28) uint8, train_labels (60000,) uint8,
    test_images (10000, 28, 28) uint8, test_labels (10000,) uint8."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


# -- Where the files are -----------------------------------------------------------------------------

def cache_dir() -> Path:
    """The user cache folder for MNIST: ``$XDG_CACHE_HOME/nnlib/mnist``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nnlib" / "mnist"


def candidate_dirs(data_dir=None) -> list[Path]:
    """The folders searched for MNIST, in order (the caller's, $NNLIB_DATA, the cache)."""
    named = [data_dir, os.environ.get("NNLIB_DATA") or None]
    return [Path(folder).expanduser() for folder in named if folder is not None] + [cache_dir()]


def find_file(name: str, directories) -> Path | None:
    """The first ``name`` or ``name.gz`` found in ``directories``, or None."""
    candidates = (directory / file for directory in directories for file in (name, name + ".gz"))
    return next((candidate for candidate in candidates if candidate.is_file()), None)


# -- Reading and checking one file -------------------------------------------------------------------

def read_bytes(path: Path, gzipped: bool | None = None) -> bytes:
    """The decompressed contents of ``path`` (gzip if ``gzipped``; None: if its name ends in .gz)."""
    path = Path(path)
    if not (path.suffix == ".gz" if gzipped is None else gzipped):
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as stream:
            return stream.read()
    except (EOFError, OSError, zlib.error) as error:
        raise MNISTError(f"{path}: the gzip file is truncated or corrupt ({error}). "
                         "Delete it and fetch it again (`python -m nnlib fetch-data`).") from error


def verify_sha256(data: bytes, expected: str, path: Path) -> None:
    """Raise MNISTError unless the SHA-256 of ``data`` is ``expected``."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise MNISTError(f"{path}: checksum mismatch: the decompressed file's SHA-256 is {actual}, expected "
                         f"{expected}. The file is damaged or is not the official MNIST file; delete it and fetch it "
                         "again (`python -m nnlib fetch-data`).")


def parse_idx_header(data: bytes, path="<bytes>"):
    """(dtype, shape, header_length) from the start of an IDX file, which must hold the whole header (the module
    docstring's layout); MNISTError for a wrong magic number, an unknown type code, or a header cut short."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise MNISTError(f"{path}: not an IDX file (wrong magic number {data[:4].hex() or 'empty'}; "
                         "IDX files begin with 00 00). Check that the file is an MNIST file.")
    type_code, ndim = data[2], data[3]
    if type_code not in IDX_TYPES:
        raise MNISTError(f"{path}: unknown IDX element type code 0x{type_code:02x}.")
    header_length = 4 + 4 * ndim
    if len(data) < header_length:
        raise MNISTError(f"{path}: the IDX header is cut short ({len(data)} bytes).")
    shape = struct.unpack(f">{ndim}I", data[4:header_length])
    return np.dtype(IDX_TYPES[type_code]), shape, header_length


def parse_idx(data: bytes, path="<bytes>") -> np.ndarray:
    """Parse IDX bytes into an array; MNISTError for a bad header (parse_idx_header) or a length that does not match
    it. (The shape needs no check of its own: the SHA-256 pins the header.)"""
    dtype, shape, header_length = parse_idx_header(data, path)
    expected_length = header_length + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected_length:
        raise MNISTError(f"{path}: {len(data)} bytes, but its IDX header {tuple(shape)} needs {expected_length}: "
                         "the file is truncated or has extra bytes. Delete it and fetch it again.")
    return np.frombuffer(data, dtype=dtype, offset=header_length).reshape(shape).astype(dtype.newbyteorder("="))


def load_idx(path: Path, expected_sha256: str | None = None) -> np.ndarray:
    """Read, verify and parse one IDX file (.gz or raw)."""
    data = read_bytes(path)
    if expected_sha256 is not None:
        verify_sha256(data, expected_sha256, path)
    return parse_idx(data, path)


def read_idx_rows(path, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of an IDX file (.gz or raw), reading only the header and those rows: each rank can read its
    own shard (a .gz file is still decompressed up to ``stop``). A slice cannot be checked against the SHA-256:
    verify the whole file once first (load_idx, or ``python -m nnlib fetch-data``)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as stream:
            head = stream.read(4)
            head += stream.read(4 * head[3]) if len(head) == 4 else b""
            dtype, shape, header_length = parse_idx_header(head, path)
            if not 0 <= start <= stop <= shape[0]:
                raise ValueError(f"rows [{start}, {stop}) are outside the {shape[0]} rows of {path}")
            row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
            stream.seek(header_length + start * row_bytes)
            data = stream.read((stop - start) * row_bytes)
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise MNISTError(f"{path}: the gzip file is truncated or corrupt ({error})") from error
    if len(data) != (stop - start) * row_bytes:
        raise MNISTError(f"{path}: the file ends before row {stop}; it is truncated")
    return np.frombuffer(data, dtype=dtype).reshape(stop - start, *shape[1:]).astype(dtype.newbyteorder("="))


# -- Download ----------------------------------------------------------------------------------------

def download_file(url: str, destination: Path, expected_sha256: str | None = None, retries: int = 3,
                  progress: bool = True) -> Path:
    """Download ``url`` to ``destination`` through atomic_write (never a file that only looks complete), checking its
    length and, if given, its decompressed SHA-256; up to ``retries`` tries, each waiting 30 s at most for a reply."""
    from tqdm import tqdm

    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    last_error = None
    for attempt in range(1, retries + 1):
        try:
            with atomic_write(destination) as out, urllib.request.urlopen(url, timeout=30) as response:
                total = int(response.headers.get("Content-Length") or 0) or None
                with tqdm(total=total, unit="B", unit_scale=True, desc=destination.name,
                          disable=not progress, leave=False) as bar:
                    while chunk := response.read(1 << 16):
                        out.write(chunk)
                        bar.update(len(chunk))
                if total is not None and out.tell() != total:
                    raise MNISTError(f"{url}: the download was interrupted ({out.tell()} of {total} bytes)")
                if expected_sha256 is not None:
                    out.flush()
                    verify_sha256(read_bytes(out.name, destination.suffix == ".gz"), expected_sha256, Path(url))
            return destination
        except (urllib.error.URLError, http.client.HTTPException, OSError, MNISTError) as error:
            last_error = error
            if attempt < retries:
                time.sleep(0.5 * attempt)
    raise MNISTError(f"could not download {url} after {retries} tries: {last_error}")


def fetch_mnist(directory=None, mirrors=MIRRORS, checksums=SHA256, retries: int = 3, progress: bool = True) -> Path:
    """Verify every MNIST file found in the search folders (module docstring) in place; download each missing one
    into ``directory`` (default: the user cache), trying each mirror in turn. Returns the download folder."""
    target = Path(directory).expanduser() if directory is not None else cache_dir()
    search = candidate_dirs(directory)
    for name, expected in checksums.items():
        found = find_file(name, search)
        if found is not None:
            verify_sha256(read_bytes(found), expected, found)
            continue
        errors = []
        for mirror in mirrors:
            try:
                download_file(mirror + name + ".gz", target / (name + ".gz"), expected, retries, progress)
                break
            except MNISTError as error:
                errors.append(str(error))
        else:
            raise MNISTError(
                f"{name}: not found in {', '.join(map(str, search))} and no mirror could be reached "
                f"({'; '.join(errors)}). " + how_to_fetch([name], mirrors[0] if mirrors else "a mirror"))
    return target


def load_mnist(data_dir=None, download: bool = True, progress: bool = True) -> MNIST:
    """The four MNIST files as an :class:`MNIST` of uint8 arrays, found where the module docstring says,
    downloaded and verified if needed; with ``download=False`` a missing file raises MNISTError saying how to get it."""
    search = candidate_dirs(data_dir)
    missing = [name for name in SHA256 if find_file(name, search) is None]
    if missing:
        if not download:
            raise MNISTError(f"MNIST files {', '.join(missing)} not found in {', '.join(map(str, search))}. "
                             + how_to_fetch(missing, MIRRORS[0]))
        fetch_mnist(progress=progress)
    arrays = [load_verified(find_file(name, search), SHA256[name], os.environ.get("NNLIB_MNIST_ARRAYS"))
              for name in SHA256]
    return MNIST(*arrays)  # (SHA256 lists the files in MNIST's order)


def load_verified(path: Path, expected_sha256: str, arrays_dir=None) -> np.ndarray:
    """Like :func:`load_idx`, with a folder of arrays already verified (``$NNLIB_MNIST_ARRAYS``; None: none), so that
    many short jobs on one machine do not each decompress and hash the same files: a verified file is saved there as
    ``<sha256>.npy``, and later loads read that array (named by its bytes' digest, it stands for that file only)."""
    if arrays_dir is None:
        return load_idx(path, expected_sha256)
    saved = Path(arrays_dir) / f"{expected_sha256}.npy"
    if saved.is_file():
        return np.load(saved)
    array = load_idx(path, expected_sha256)
    with atomic_write(saved) as stream:
        np.save(stream, array)
    return array


# -- Preparing arrays for the network ----------------------------------------------------------------

def scale_pixels(images: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Flatten images (N, 28, 28) uint8 to (N, 784) in [0, 1] as ``dtype``."""
    return np.multiply(images.reshape(len(images), -1), 1 / 255, dtype=dtype)


def one_hot(labels: np.ndarray, num_classes: int = 10, dtype=np.float32) -> np.ndarray:
    """Labels (N,) with values in 0..num_classes-1 to a one-hot matrix (N, num_classes): row y of the identity."""
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in 0..{num_classes - 1}; got values from {labels.min()} to {labels.max()}")
    return np.eye(num_classes, dtype=dtype)[labels]


def train_validation_split(images, labels, validation_size: int = 10000, seed: int = 0):
    """Split into (train_images, train_labels, validation_images, validation_labels), shuffled with ``seed``."""
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels; they must match")
    if not 0 < validation_size < len(images):
        raise ValueError(f"validation_size must be between 1 and {len(images) - 1}; got {validation_size}")
    order = np.random.default_rng(seed).permutation(len(images))
    validation, train = order[:validation_size], order[validation_size:]
    return images[train], labels[train], images[validation], labels[validation]


def crop_center(images: np.ndarray, size: int = 20) -> np.ndarray:
    """The central ``size`` x ``size`` pixels of images (N, H, W)."""
    height, width = images.shape[1:]
    top, left = (height - size) // 2, (width - size) // 2
    return images[:, top:top + size, left:left + size]


def course_subset(mnist: MNIST, per_class: int = 500, size: int = 20, seed: int = 0):
    """The seed experiments' data: ``per_class`` training digits of each class, drawn with ``seed``, shuffled, their
    central ``size`` x ``size`` pixels: (images (5000, 20, 20) uint8, labels (5000,) uint8) by default."""
    rng = np.random.default_rng(seed)
    chosen = [rng.choice(np.flatnonzero(mnist.train_labels == digit), per_class, replace=False) for digit in range(10)]
    order = rng.permutation(np.concatenate(chosen))
    return np.ascontiguousarray(crop_center(mnist.train_images[order], size)), mnist.train_labels[order]
