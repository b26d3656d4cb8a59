"""The OCI archives the real test node imports (``scripts/k8senv.d/oci.py``): what ``ctr images import`` reads
(index, manifest, config and layer blobs, each under its own digest) and what a layer keeps of a directory tree.

Pure file work in a temporary directory: no containerd here (the real node imports these archives in
``tests/k8s/test_real_node.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "k8senv.d"))
import oci  # noqa: E402  (scripts/k8senv.d is not a package: the script puts it on sys.path the same way)


def _blob(tar: tarfile.TarFile, digest: str) -> bytes:
    data = tar.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}").read()
    assert "sha256:" + hashlib.sha256(data).hexdigest() == digest, "a blob is not stored under its own digest"
    return data


def _tree(root: Path) -> None:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_bytes(b"#!/bin/sh\necho hi\n")
    os.chmod(root / "bin" / "tool", 0o755)
    os.symlink("tool", root / "bin" / "alias")
    (root / "proc").mkdir()
    (root / "proc" / "junk").write_text("never in a layer")
    (root / "tmp").mkdir(mode=0o1777)
    os.chmod(root / "tmp", 0o1777)


def test_an_archive_holds_what_ctr_import_reads_each_blob_under_its_digest(tmp_path: Path) -> None:
    """index.json names the image for containerd and points at the manifest; the manifest at the config and the
    layer; the config's diff IDs are the (uncompressed) layers' digests and it carries the process settings;
    ``archive_image`` reads the name and manifest digest back."""
    _tree(tmp_path / "rootfs")
    digest, size = oci.write_layer(tmp_path / "rootfs", tmp_path / "layer.tar")
    assert size == (tmp_path / "layer.tar").stat().st_size
    config = oci.ImageConfig(entrypoint=["/bin/tool"], cmd=["x"], env=["PATH=/bin"], user="50000:0")
    manifest_digest = oci.write_archive("leoflow.local/t:1", [tmp_path / "layer.tar"], config, tmp_path / "t.tar")
    with tarfile.open(tmp_path / "t.tar") as tar:
        assert json.load(tar.extractfile("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
        index = json.load(tar.extractfile("index.json"))
        (entry,) = index["manifests"]
        assert entry["digest"] == manifest_digest
        assert entry["annotations"]["io.containerd.image.name"] == "leoflow.local/t:1"
        manifest = json.loads(_blob(tar, manifest_digest))
        (layer,) = manifest["layers"]
        assert (layer["digest"], layer["size"], layer["mediaType"]) == (digest, size, oci.LAYER_MEDIA_TYPE)
        assert _blob(tar, layer["digest"]) == (tmp_path / "layer.tar").read_bytes()
        image = json.loads(_blob(tar, manifest["config"]["digest"]))
    assert image["rootfs"] == {"type": "layers", "diff_ids": [digest]}
    assert image["config"] == {"Entrypoint": ["/bin/tool"], "Cmd": ["x"], "Env": ["PATH=/bin"], "User": "50000:0"}
    assert oci.archive_image(tmp_path / "t.tar") == ("leoflow.local/t:1", manifest_digest)


def test_a_layer_keeps_modes_times_links_and_owners_but_not_proc(tmp_path: Path) -> None:
    """A layer keeps file modes (the sticky /tmp), modification times (Python checks a ``.pyc`` against its
    source's), symlinks and the owner it is told (``chown``), leaves out what is under /proc, /sys and /dev, and
    gives the same digest for the same tree written twice."""
    _tree(tmp_path / "rootfs")
    os.utime(tmp_path / "rootfs" / "bin" / "tool", (1_700_000_000, 1_700_000_000))
    first, _ = oci.write_layer(tmp_path / "rootfs", tmp_path / "a.tar", chown=(50000, 0))
    second, _ = oci.write_layer(tmp_path / "rootfs", tmp_path / "b.tar", chown=(50000, 0))
    assert first == second
    with tarfile.open(tmp_path / "a.tar") as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["./bin/tool"].mtime == 1_700_000_000
    assert "./proc" in members and "./proc/junk" not in members
    assert members["./bin/tool"].mode & 0o777 == 0o755
    assert members["./tmp"].mode & 0o7777 == 0o1777
    assert members["./bin/alias"].issym() and members["./bin/alias"].linkname == "tool"
    assert {(m.uid, m.gid) for m in members.values()} == {(50000, 0)}


def test_an_image_needs_a_layer(tmp_path: Path) -> None:
    """An archive without a layer is refused before anything is written."""
    with pytest.raises(ValueError, match="at least one layer"):
        oci.write_archive("leoflow.local/t:1", [], oci.ImageConfig(), tmp_path / "t.tar")
    assert not (tmp_path / "t.tar").exists()
