"""schooner.data.storage is a thin face over schooner.cluster.storage (one owner of atomic writes and file
access, issue 35): the functions both have are cluster's own; data keeps only what is its own (the file
identity its fingerprints use, its compact JSON, listing helpers), and its public names keep working."""

from __future__ import annotations

import pytest

from schooner.cluster import storage as cluster_storage
from schooner.data import storage

SHARED = ["url_to_fs", "is_local", "local_path", "join", "exists", "isdir", "open_file", "file_size",
          "read_bytes", "makedirs", "remove", "remove_tree", "write_bytes", "atomic_open", "is_temp_name",
          "unique_tag"]  # fmt: skip


@pytest.mark.parametrize("name", SHARED)
def test_the_functions_both_have_are_clusters(name):
    assert getattr(storage, name) is getattr(cluster_storage, name)


def test_datas_own_names_still_work(tmp_path):
    p = str(tmp_path / "a" / "b.json")
    storage.makedirs(str(tmp_path / "a"))
    storage.write_json(p, {"big": 2**70, "x": [1, 2]})
    assert storage.read_json(p) == {"big": 2**70, "x": [1, 2]}
    assert storage.list_dir(str(tmp_path / "a")) == ["b.json"]
    assert storage.file_identity(p)["size"] == storage.file_size(p)
    assert storage.has_glob("a/*.json") and not storage.has_glob("a/b.json")
    with storage.atomic_open(str(tmp_path / "c.bin")) as f:
        f.write(b"abc")
    assert storage.read_bytes(str(tmp_path / "c.bin")) == b"abc"
