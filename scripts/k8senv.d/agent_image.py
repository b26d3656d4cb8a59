"""leoflow's agent image, built from the repository without Docker, for the real test node (`scripts/k8senv image`).

What docker/Dockerfile builds on the official Airflow image, built here from Debian instead (the machine cannot
pull apache/airflow): Debian bookworm's Python 3.11 with a venv at /opt/airflow holding the Airflow of
constraints.txt and leoflow's dependencies (the `kubernetes` extra), leoflow itself with its sources in
/opt/leoflow/src, dumb-init; user 50000:0 (named "airflow", home /home/airflow, as there), ENTRYPOINT ``/usr/bin/dumb-init --``, CMD ``python -m leoflow_agent
pod``. ``tests/k8s/test_real_node.py`` checks that the two agree on user, entrypoint and Python packages.

Two layers, each cached under $K8SENV_CACHE/images by a hash of what goes into it:

- the base (``agent-base-<hash>``): mmdebstrap's minbase with python3, python3-venv, ca-certificates and
  dumb-init, then ``pip install -c constraints.txt`` of pyproject.toml's dependencies, in a chroot. Keyed by
  constraints.txt, the dependency lists, :data:`RECIPE` and the builder's code; about 3 minutes cold, most of it downloads (pip
  uses this machine's pip cache, bind-mounted);
- leoflow (``leoflow-agent-<hash>.tar``, the image): the package installed with ``pip --no-deps --target
  /opt/leoflow/site`` (on sys.path through a .pth file in the venv) and its sources, owned by 50000:0. Keyed by
  the base and every file under leoflow_airflow/ and leoflow_agent/, so a code change rebuilds this layer alone
  (seconds).

The image is named ``leoflow.local/leoflow-agent:<hash>``. Needs root (chroot, mounts) and mmdebstrap.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Callable

import oci

REPO = Path(__file__).resolve().parents[2]
RECIPE = "2"
"""Bump when the base's recipe changes (packages, venv layout): the cache key includes it."""
SUITE = "bookworm"
MIRRORS = (f"deb http://deb.debian.org/debian {SUITE} main",
           f"deb http://deb.debian.org/debian {SUITE}-updates main",
           f"deb http://deb.debian.org/debian-security {SUITE}-security main")
PACKAGES = ("python3", "python3-venv", "ca-certificates", "dumb-init")
VENV = "/opt/airflow"
SITE = f"{VENV}/lib/python3.11/site-packages"
USER = "50000:0"
ENTRYPOINT = ["/usr/bin/dumb-init", "--"]
CMD = ["python", "-m", "leoflow_agent", "pod"]
ENV = [f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/home/airflow",
       "PYTHONUNBUFFERED=1"]
AIRFLOW_USER = ("airflow", 50000, 0, "/home/airflow")
"""The official image's user (name, uid, gid, home): the Task SDK needs the uid to have a name
(``getpass.getuser()`` in ``airflow.sdk.api.client``: "The user that Airflow is running as has no username")."""
SOURCES = ("pyproject.toml", "constraints.txt", "README.md", "leoflow_airflow", "leoflow_agent")
"""What the Dockerfile copies into /opt/leoflow/src, and what the leoflow layer's key is made of."""
IMAGE_REPO = "leoflow.local/leoflow-agent"


class ImageError(Exception):
    """The image could not be built; the message says which step failed and how."""


def dependencies() -> list[str]:
    """pyproject.toml's dependencies plus its `kubernetes` extra (the Dockerfile installs ``[kubernetes]``)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["kubernetes"]]


def base_key() -> str:
    """Hex key of the base layer: RECIPE, SUITE, PACKAGES, constraints.txt, :func:`dependencies` and the
    builder's own code (this module and oci.py)."""
    h = hashlib.sha256(json.dumps([RECIPE, SUITE, PACKAGES, dependencies()]).encode())
    for f in (REPO / "constraints.txt", Path(__file__), Path(oci.__file__)):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _source_files() -> list[Path]:
    """Every file of SOURCES (no bytecode), sorted."""
    files = []
    for name in SOURCES:
        p = REPO / name
        files += [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts]
    return sorted(files)


def image_key() -> str:
    """Hex key of the image: the base's key and the path and bytes of every source file."""
    h = hashlib.sha256(base_key().encode())
    for f in _source_files():
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def image_name() -> str:
    """The name the image is imported under: ``leoflow.local/leoflow-agent:<image_key>``."""
    return f"{IMAGE_REPO}:{image_key()}"


def _run(argv: list[str], what: str, **kw) -> None:
    """Run a build step; raise ImageError with the end of its output when it fails."""
    r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kw)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-20:])
        raise ImageError(f"{what} failed (exit {r.returncode}):\n{tail}")


def _pip_cache() -> Path:
    """This machine's pip cache directory (PIP_CACHE_DIR, else XDG_CACHE_HOME/pip, else ~/.cache/pip)."""
    if os.environ.get("PIP_CACHE_DIR"):
        return Path(os.environ["PIP_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pip"


BUILD_CA = "etc/leoflow-build-ca.crt"
"""Where this machine's CA bundle is copied into the build root, for pip's downloads (removed afterwards)."""


class _Chroot:
    """A build root set up for pip as this machine's own pip is: /proc, /dev, the pip cache and any
    PIP_FIND_LINKS directory mounted, /etc/resolv.conf and the CA bundle pip trusts here (PIP_CERT, else
    SSL_CERT_FILE, else Debian's bundle) copied in, the host's other PIP_* settings passed on; all undone on exit.
    """

    def __init__(self, root: Path):
        self.root, self.mounts = root, []
        self.env = {k: v for k, v in os.environ.items() if k.startswith("PIP_") and k not in ("PIP_CERT",
                                                                                           "PIP_CACHE_DIR")}

    def __enter__(self) -> "_Chroot":
        shutil.copyfile("/etc/resolv.conf", self.root / "etc/resolv.conf")
        ca = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt"
        if Path(ca).is_file():
            shutil.copyfile(ca, self.root / BUILD_CA)
            self.env.update(PIP_CERT=f"/{BUILD_CA}", SSL_CERT_FILE=f"/{BUILD_CA}")
        cache = _pip_cache()
        cache.mkdir(parents=True, exist_ok=True)
        mounts = [("proc", "proc", ["-t", "proc"]), ("/dev", "dev", ["--bind"]),
                  (str(cache), "var/cache/leoflow-pip", ["--bind"])]
        links = os.environ.get("PIP_FIND_LINKS", "")
        mounts += [(d, d.lstrip("/"), ["--bind"]) for d in links.split() if d.startswith("/") and Path(d).is_dir()]
        try:
            for src, dest, opts in mounts:
                (self.root / dest).mkdir(parents=True, exist_ok=True)
                _run(["mount", *opts, src, str(self.root / dest)], f"mount {dest}")
                self.mounts.append(self.root / dest)
        except BaseException:
            self.__exit__()
            raise
        return self

    def bind(self, src: Path, dest: str) -> None:
        """Bind-mount `src` at `dest` inside the root (undone on exit)."""
        (self.root / dest).mkdir(parents=True, exist_ok=True)
        _run(["mount", "--bind", str(src), str(self.root / dest)], f"mount {dest}")
        self.mounts.append(self.root / dest)

    def run(self, argv: list[str], what: str) -> None:
        """Run `argv` inside the root with the pip cache at /var/cache/leoflow-pip."""
        env = {**self.env, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
               "PIP_CACHE_DIR": "/var/cache/leoflow-pip", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        _run(["chroot", str(self.root), *argv], what, env=env)

    def __exit__(self, *exc) -> None:
        for m in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(m)], capture_output=True)
        for m in reversed(self.mounts):  # the empty mount points this build added
            if m.name not in ("proc", "dev"):
                try:
                    m.rmdir()
                except OSError:
                    pass
        self.mounts.clear()
        (self.root / "etc/resolv.conf").unlink(missing_ok=True)
        (self.root / BUILD_CA).unlink(missing_ok=True)


def _build_base(work: Path, log: Callable[[str], None]) -> Path:
    """Build the base root in `work`/rootfs (mmdebstrap, venv, dependencies); return it."""
    if not shutil.which("mmdebstrap"):
        raise ImageError("mmdebstrap is missing: apt-get install mmdebstrap")
    root = work / "rootfs"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log(f"agent image: debootstrapping {SUITE} ({', '.join(PACKAGES)})")
    _run(["mmdebstrap", "--mode=root", "--variant=minbase", f"--include={','.join(PACKAGES)}",
          "--aptopt=Apt::Install-Recommends \"false\"",
          "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
          "--dpkgopt=path-exclude=/usr/share/locale/*", SUITE, str(root), *MIRRORS], "mmdebstrap")
    (root / "opt/leoflow/src").mkdir(parents=True)
    shutil.copyfile(REPO / "constraints.txt", root / "opt/leoflow/src/constraints.txt")
    name, uid, gid, home = AIRFLOW_USER
    with _Chroot(root) as ch:
        ch.run(["useradd", "--uid", str(uid), "--gid", str(gid), "--home-dir", home, "--create-home",
                "--shell", "/bin/bash", name], "useradd")
        ch.run(["python3", "-m", "venv", VENV], "python3 -m venv")
        log(f"agent image: pip install of {len(dependencies())} dependencies under constraints.txt")
        ch.run([f"{VENV}/bin/pip", "install", "-q", "-c", "/opt/leoflow/src/constraints.txt", *dependencies()],
               "pip install of the dependencies")
    shutil.rmtree(root / "opt/leoflow")
    for junk in ("var/cache/apt", "var/lib/apt/lists", "var/log"):
        shutil.rmtree(root / junk, ignore_errors=True)
        (root / junk).mkdir(parents=True, exist_ok=True)
    return root


def _build_app(base_root: Path, work: Path) -> Path:
    """Build the leoflow layer's tree in `work`/app (sources, the --target install, the .pth); return it."""
    app = work / "app"
    shutil.rmtree(app, ignore_errors=True)
    src = app / "opt/leoflow/src"
    src.mkdir(parents=True)
    for name in SOURCES:
        p = REPO / name
        if p.is_file():
            shutil.copyfile(p, src / name)
        else:
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    with _Chroot(base_root) as ch:
        ch.bind(app / "opt/leoflow", "opt/leoflow")
        ch.run([f"{VENV}/bin/pip", "install", "-q", "--no-deps", "--target", "/opt/leoflow/site", "/opt/leoflow/src"],
               "pip install of leoflow")
    shutil.rmtree(src / "build", ignore_errors=True)
    for egg in src.glob("*.egg-info"):
        shutil.rmtree(egg)
    (app / SITE.lstrip("/")).mkdir(parents=True)
    (app / SITE.lstrip("/") / "leoflow.pth").write_text("/opt/leoflow/site\n")
    for p in [app / "opt/leoflow", *(app / "opt/leoflow").rglob("*")]:
        os.lchown(p, 50000, 0)
    return app


def build(cache: Path, log: Callable[[str], None]) -> Path:
    """Build (or reuse) the agent image's OCI archive under `cache` and return its path.

    One build at a time per cache: a second caller waits on ``cache/.lock`` (flock) and then finds the archive.
    The archive is ``cache/leoflow-agent-<image_key>.tar`` holding image :func:`image_name`; the base layer is
    kept as ``cache/agent-base-<base_key>/`` (its root and layer file) for the next leoflow change. Older
    archives and bases are removed. Raises ImageError when a step fails (mmdebstrap, pip, a mount) or
    this process is not root.
    """
    out = cache / f"leoflow-agent-{image_key()}.tar"
    if out.is_file():
        log(f"agent image {image_name()} already built: {out}")
        return out
    if os.geteuid() != 0:
        raise ImageError("building the agent image needs root (mmdebstrap --mode=root, chroot, mounts)")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.is_file():
            log(f"agent image {image_name()} built meanwhile: {out}")
            return out
        return _build_locked(cache, out, log)


def _build_locked(cache: Path, out: Path, log: Callable[[str], None]) -> Path:
    """:func:`build`'s work, under its lock."""
    base = cache / f"agent-base-{base_key()}"
    base_layer = base / "layer.tar"
    if not base_layer.is_file():
        root = _build_base(base, log)
        log("agent image: writing the base layer")
        oci.write_layer(root, base / "layer.tar.tmp")
        (base / "layer.tar.tmp").rename(base_layer)
    work = cache / f".agent-work-{os.getpid()}"
    try:
        app = _build_app(base / "rootfs", work)
        oci.write_layer(app, work / "app.tar")
        config = oci.ImageConfig(entrypoint=ENTRYPOINT, cmd=CMD, env=ENV, user=USER, workdir="/tmp")
        oci.write_archive(image_name(), [base_layer, work / "app.tar"], config, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for old in cache.glob("leoflow-agent-*.tar"):
        if old != out:
            old.unlink(missing_ok=True)
    for old in cache.glob("agent-base-*"):
        if old != base:
            shutil.rmtree(old, ignore_errors=True)
    log(f"agent image {image_name()}: {out} ({out.stat().st_size / 2**20:.0f} MiB)")
    return out
