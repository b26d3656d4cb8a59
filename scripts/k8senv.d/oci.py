"""Container images without Docker: directory trees packed as OCI image-layout archives for `ctr images import`.

The real test node (scripts/k8senv.d/node.py) runs images built on this machine: the pause image, a busybox
image and leoflow's agent image (scripts/k8senv.d/agent_image.py). Each layer is one directory tree, tarred as
it is on disk (owners, modes, times and hard links kept: Python checks each ``.pyc`` against its source's
modification time, so a layer that zeroed times would have every module compiled again at every import),
uncompressed: the archives never leave the machine, and an uncompressed layer costs no CPU to pack or unpack.

Format: the OCI image layout (https://github.com/opencontainers/image-spec/blob/main/image-layout.md) in one
tar: `oci-layout`, `index.json` and `blobs/sha256/<digest>`, the manifest's descriptor annotated with
`io.containerd.image.name` (the name containerd gives the imported image) and
`org.opencontainers.image.ref.name`. Only the standard library is used.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
SKIPPED_DIRS = ("dev", "proc", "sys")
"""Top-level directories whose contents never go into a layer: the runtime mounts its own there."""


@dataclass(frozen=True)
class ImageConfig:
    """What a container of the image runs: OCI image config fields (`Entrypoint`, `Cmd`, `Env`, `User`,
    `WorkingDir`). `env` is a list of "NAME=value"."""

    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    user: str = ""
    workdir: str = ""


def _normalize(info: tarfile.TarInfo, chown: tuple[int, int] | None) -> tarfile.TarInfo | None:
    """Tar filter: drop the contents of SKIPPED_DIRS and device files, clear owner names, apply `chown`."""
    parts = info.name.split("/")  # "./proc/x": not Path(...).parts, which drops the "."
    if len(parts) > 2 and parts[0] == "." and parts[1] in SKIPPED_DIRS:
        return None
    if info.isdev() or info.isfifo():
        return None
    info.uname = info.gname = ""
    if chown is not None:
        info.uid, info.gid = chown
    return info


def write_layer(root: Path, out: Path, chown: tuple[int, int] | None = None) -> tuple[str, int]:
    """Tar the tree at `root` as one layer into file `out` (paths relative to "/" of the image).

    `chown` (uid, gid), when given, owns every entry; otherwise each keeps its owner on disk. Returns the
    layer's digest ("sha256:<hex>", also its diff ID as it is uncompressed) and its size in bytes.
    Raises OSError when `root` cannot be read or `out` written.
    """
    with open(out, "wb") as f:
        with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for child in sorted(os.listdir(root)):
                tar.add(root / child, arcname=f"./{child}", filter=lambda i: _normalize(i, chown))
    return f"sha256:{_file_sha256(out)}", out.stat().st_size


def write_archive(name: str, layers: list[Path], config: ImageConfig, out: Path) -> str:
    """Write the OCI image-layout archive of image `name` ("leoflow.local/pause:1") to `out`.

    `layers` are layer files from :func:`write_layer`, lowest first. The archive is written beside `out` and
    renamed into place, so a reader never sees half an archive. Returns the manifest's digest. Raises OSError
    on a read or write failure, ValueError when `layers` is empty.
    """
    if not layers:
        raise ValueError("an image needs at least one layer")
    blobs: list[tuple[str, Path | bytes]] = []
    layer_descs, diff_ids = [], []
    for layer in layers:
        digest = "sha256:" + _file_sha256(layer)
        layer_descs.append({"mediaType": LAYER_MEDIA_TYPE, "digest": digest, "size": layer.stat().st_size})
        diff_ids.append(digest)
        blobs.append((digest, layer))
    cfg = {
        "architecture": "amd64", "os": "linux",
        "config": {k: v for k, v in (("Entrypoint", config.entrypoint), ("Cmd", config.cmd), ("Env", config.env),
                                     ("User", config.user), ("WorkingDir", config.workdir)) if v},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    cfg_bytes = json.dumps(cfg, sort_keys=True).encode()
    cfg_digest = "sha256:" + hashlib.sha256(cfg_bytes).hexdigest()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": cfg_digest, "size": len(cfg_bytes)},
        "layers": layer_descs}, sort_keys=True).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": [{
        "mediaType": MANIFEST_MEDIA_TYPE, "digest": manifest_digest, "size": len(manifest),
        "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}}]}).encode()
    blobs += [(cfg_digest, cfg_bytes), (manifest_digest, manifest)]
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w") as tar:
            _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
            _add_bytes(tar, "index.json", index)
            for digest, blob in blobs:
                arcname = f"blobs/sha256/{digest.split(':', 1)[1]}"
                if isinstance(blob, bytes):
                    _add_bytes(tar, arcname, blob)
                else:
                    tar.add(blob, arcname=arcname, filter=lambda i: _normalize(i, (0, 0)))
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return manifest_digest


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Add a regular file `name` holding `data` (mode 0644, time 0) to `tar`."""
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def _file_sha256(path: Path) -> str:
    """Return the hex SHA-256 of the file at `path`."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def archive_image(archive: Path) -> tuple[str, str]:
    """The image an archive of :func:`write_archive` holds: its name (``io.containerd.image.name``) and manifest
    digest, read from its ``index.json``. Raises ValueError when the archive has no such index."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{archive} has no index.json")
        manifest = json.load(member)["manifests"][0]
    return manifest["annotations"]["io.containerd.image.name"], manifest["digest"]
