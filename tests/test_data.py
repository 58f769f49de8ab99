"""nnlib.lesson01_mnist.data: parsing, verification, every error path, the download, and the helpers."""


import numpy as np
import pytest
from conftest import gzip_bytes, idx_bytes

from nnlib.lesson01_mnist import data
from nnlib.lesson01_mnist.data import MNISTError

# -- parsing and verification ----------------------------------------------------------------

def test_parse_idx_round_trip():
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    parsed = data.parse_idx(idx_bytes(array))
    np.testing.assert_array_equal(parsed, array)
    assert parsed.dtype == np.uint8 and parsed.flags.writeable


def test_bad_magic_is_reported():
    raw = bytearray(idx_bytes(np.zeros((2, 2), dtype=np.uint8)))
    raw[0] = 0x1F  # what a gzip file starts with, e.g. a .gz saved without its suffix
    with pytest.raises(MNISTError, match="wrong magic number"):
        data.parse_idx(bytes(raw), "some-file")


@pytest.mark.parametrize("change", [-1, +1])
def test_length_not_matching_header_is_reported(change):
    raw = idx_bytes(np.zeros((4, 5), dtype=np.uint8))
    raw = raw[:change] if change < 0 else raw + b"\0"
    with pytest.raises(MNISTError, match="truncated or has extra bytes"):
        data.parse_idx(raw, "f")


def test_gz_and_raw_files_load_alike(tmp_path, tiny_mnist):
    array, raw, digest = tiny_mnist["train-images-idx3-ubyte"]
    (tmp_path / "a").write_bytes(raw)
    (tmp_path / "b.gz").write_bytes(gzip_bytes(raw))
    from_raw = data.load_idx(tmp_path / "a", digest)
    from_gz = data.load_idx(tmp_path / "b.gz", digest)
    np.testing.assert_array_equal(from_raw, array)
    np.testing.assert_array_equal(from_gz, array)


def test_checksum_mismatch_names_both_hashes(tmp_path, tiny_mnist):
    array, raw, digest = tiny_mnist["train-labels-idx1-ubyte"]
    damaged = raw[:-1] + bytes([raw[-1] ^ 1])
    path = tmp_path / "labels"
    path.write_bytes(damaged)
    with pytest.raises(MNISTError) as caught:
        data.load_idx(path, digest)
    message = str(caught.value)
    assert str(path) in message and digest in message
    assert data.hashlib.sha256(damaged).hexdigest() in message
    assert "fetch-data" in message


def test_truncated_gzip_is_reported(tmp_path, tiny_mnist):
    _, raw, digest = tiny_mnist["train-images-idx3-ubyte"]
    path = tmp_path / "images.gz"
    path.write_bytes(gzip_bytes(raw)[:200])
    with pytest.raises(MNISTError, match="truncated or corrupt"):
        data.load_idx(path, digest)


def test_verified_arrays_are_saved_by_digest_and_read_instead_of_the_file(tmp_path, tiny_mnist, isolated_cache,
                                                                          monkeypatch):
    """$NNLIB_MNIST_ARRAYS (the tests' session sets it): a verified file's array is saved as <sha256>.npy, and the
    next load reads it instead of the file; a file that fails its check is never saved."""
    monkeypatch.setattr(data, "SHA256", checksums(tiny_mnist))
    for name, (_, raw, _) in tiny_mnist.items():
        (tmp_path / (name + ".gz")).write_bytes(gzip_bytes(raw))
    arrays = tmp_path / "arrays"
    arrays.mkdir()
    monkeypatch.setenv("NNLIB_MNIST_ARRAYS", str(arrays))
    first = data.load_mnist(tmp_path, download=False)
    assert sorted(path.name for path in arrays.iterdir()) == sorted(f"{digest}.npy" for _, _, digest in
                                                                     tiny_mnist.values())
    images = tmp_path / "train-images-idx3-ubyte.gz"
    images.write_bytes(b"not read again")
    again = data.load_mnist(tmp_path, download=False)
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        np.testing.assert_array_equal(getattr(again, field), getattr(first, field))
    (arrays / f"{data.SHA256['train-images-idx3-ubyte']}.npy").unlink()
    with pytest.raises(MNISTError, match="truncated or corrupt"):
        data.load_mnist(tmp_path, download=False)
    assert len(list(arrays.iterdir())) == 3  # nothing saved for the damaged file, nothing half-written


def test_missing_data_offline_says_how_to_fetch(tmp_path, isolated_cache):
    with pytest.raises(MNISTError) as caught:
        data.load_mnist(tmp_path, download=False)
    message = str(caught.value)
    assert "train-images-idx3-ubyte" in message and "NNLIB_DATA" in message
    assert "python -m nnlib fetch-data" in message and str(isolated_cache) in message


def test_search_order_caller_then_environment_then_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NNLIB_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data.candidate_dirs(tmp_path / "mine") == [
        tmp_path / "mine", tmp_path / "env", tmp_path / "xdg" / "nnlib" / "mnist"]


# -- download -------------------------------------------------------------------------------

def serve(server, files, prefix="/m/"):
    for name, (_, raw, _) in files.items():
        server.routes[prefix + name + ".gz"] = gzip_bytes(raw)
    return server.url + prefix


def checksums(files):
    return {name: digest for name, (_, _, digest) in files.items()}


def test_download_fetches_verifies_and_loads(file_server, tiny_mnist, isolated_cache, monkeypatch):
    mirror = serve(file_server, tiny_mnist)
    data.fetch_mnist(mirrors=(mirror,), checksums=checksums(tiny_mnist), progress=False)
    assert sorted(p.name for p in isolated_cache.iterdir()) == sorted(n + ".gz" for n in tiny_mnist)
    for name, (array, _, digest) in tiny_mnist.items():
        np.testing.assert_array_equal(data.load_idx(isolated_cache / (name + ".gz"), digest), array)
    # A second fetch finds the files and downloads nothing.
    before = len(file_server.requests)
    data.fetch_mnist(mirrors=(mirror,), checksums=checksums(tiny_mnist), progress=False)
    assert len(file_server.requests) == before


def test_download_falls_back_to_the_next_mirror(file_server, tiny_mnist, isolated_cache):
    good = serve(file_server, tiny_mnist, "/good/")
    data.fetch_mnist(mirrors=(file_server.url + "/missing/", good), checksums=checksums(tiny_mnist),
                     retries=1, progress=False)
    assert any(r.startswith("/missing/") for r in file_server.requests)
    assert len(list(isolated_cache.iterdir())) == 4


def test_failed_download_leaves_no_file(file_server, tiny_mnist, isolated_cache):
    """A corrupt download, an interrupted one, and a 404 each leave the folder empty."""
    served = serve(file_server, tiny_mnist)
    file_server.routes[served.removeprefix(file_server.url) + "train-images-idx3-ubyte.gz"] = gzip_bytes(b"junk")
    with pytest.raises(MNISTError, match="checksum mismatch"):
        data.fetch_mnist(mirrors=(served,), checksums=checksums(tiny_mnist), retries=2, progress=False)
    assert list(isolated_cache.iterdir()) == []

    path = "/m/train-images-idx3-ubyte.gz"
    file_server.routes[path] = gzip_bytes(tiny_mnist["train-images-idx3-ubyte"][1])
    file_server.lie_about_length.add(path)
    with pytest.raises(MNISTError, match="could not download"):
        data.download_file(file_server.url + path, isolated_cache / "x.gz", retries=2, progress=False)
    assert list(isolated_cache.iterdir()) == []

    with pytest.raises(MNISTError, match="no mirror could be reached"):
        data.fetch_mnist(mirrors=(file_server.url + "/nowhere/",), checksums=checksums(tiny_mnist),
                         retries=1, progress=False)
    assert list(isolated_cache.iterdir()) == []


# -- the real MNIST and the helpers -----------------------------------------------------------

def test_real_mnist_shapes_and_labels(mnist):
    assert mnist.train_images.shape == (60000, 28, 28) and mnist.train_images.dtype == np.uint8
    assert mnist.test_images.shape == (10000, 28, 28)
    assert np.bincount(mnist.train_labels).tolist()[:3] == [5923, 6742, 5958]
    assert np.bincount(mnist.test_labels, minlength=10).sum() == 10000


def test_scale_pixels():
    images = np.array([[[0, 255], [51, 102]]], dtype=np.uint8)
    scaled = data.scale_pixels(images)
    assert scaled.dtype == np.float32 and scaled.shape == (1, 4)
    np.testing.assert_allclose(scaled, [[0, 1, 0.2, 0.4]], rtol=1e-6)
    assert data.scale_pixels(images, np.float64).dtype == np.float64


def test_one_hot():
    np.testing.assert_array_equal(data.one_hot(np.array([2, 0]), 3), [[0, 0, 1], [1, 0, 0]])
    with pytest.raises(ValueError, match=r"labels must lie in 0\.\.9"):
        data.one_hot(np.array([10]))


def test_train_validation_split_is_seeded_and_disjoint():
    images, labels = np.arange(100)[:, None], np.arange(100)
    a = data.train_validation_split(images, labels, 20, seed=3)
    b = data.train_validation_split(images, labels, 20, seed=3)
    assert [len(part) for part in a] == [80, 80, 20, 20]
    np.testing.assert_array_equal(a[3], b[3])
    assert set(a[1]).isdisjoint(a[3]) and set(a[1]) | set(a[3]) == set(range(100))
    with pytest.raises(ValueError, match="must match"):
        data.train_validation_split(images, labels[:5], 20)


def test_course_subset(mnist):
    images, labels = data.course_subset(mnist)
    assert images.shape == (5000, 20, 20) and images.flags.c_contiguous
    assert np.bincount(labels).tolist() == [500] * 10
    assert data.scale_pixels(images).shape == (5000, 400)
    again, _ = data.course_subset(mnist)
    np.testing.assert_array_equal(images, again)


def test_read_idx_rows_reads_a_slice_of_gz_and_raw_files(tmp_path, tiny_mnist):
    array, raw, _ = tiny_mnist["train-images-idx3-ubyte"]
    (tmp_path / "images").write_bytes(raw)
    (tmp_path / "images.gz").write_bytes(gzip_bytes(raw))
    for name in ("images", "images.gz"):
        np.testing.assert_array_equal(data.read_idx_rows(tmp_path / name, 5, 12), array[5:12])
        assert data.read_idx_rows(tmp_path / name, 3, 3).shape == (0, 28, 28)
    with pytest.raises(ValueError, match=r"rows \[15, 25\) are outside the 20 rows"):
        data.read_idx_rows(tmp_path / "images", 15, 25)
    (tmp_path / "short").write_bytes(raw[:-100])
    with pytest.raises(MNISTError, match="truncated"):
        data.read_idx_rows(tmp_path / "short", 0, 20)


def test_read_idx_rows_matches_the_real_file(mnist):
    from nnlib.lesson01_mnist.data import candidate_dirs, find_file

    path = find_file("train-labels-idx1-ubyte", candidate_dirs())
    np.testing.assert_array_equal(data.read_idx_rows(path, 59990, 60000), mnist.train_labels[59990:])


def test_read_idx_rows_refuses_a_file_that_is_not_idx(tmp_path):
    (tmp_path / "notidx").write_bytes(b"\x1f\x8b\x08\x00rest")
    with pytest.raises(MNISTError, match="wrong magic number 1f8b0800"):
        data.read_idx_rows(tmp_path / "notidx", 0, 1)
