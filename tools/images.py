"""Building mdq's two container images with buildah, also where no registry or index answers.

``make images`` and the image test (``tests/integration/test_images.py``) build
``deploy/Dockerfile`` (the services image) and ``deploy/runner.Dockerfile`` (the runner image)
from the repository root, the same files that ``deploy/`` and ``docker-compose.yml`` name. Both
take the base image and the wheel source as build arguments:

- *public* (the Dockerfiles' defaults): ``python:3.11.11-slim`` from the registry, every wheel
  from PyPI (or ``PIP_INDEX_URL``, a mirror or proxy of it);
- *offline* (no registry): the base is a Debian bookworm rootfs made by ``debootstrap`` from
  Debian's packages (python3, its venv module, passwd) and imported into buildah's storage as
  ``localhost/mdq-base:bookworm-<key>``; the wheels are downloaded on the host by pip into a
  wheelhouse (exactly the hash-pinned files of ``deploy/requirements/*.txt``), linked into
  ``deploy/wheelhouse/`` and installed with ``pip --no-index --find-links`` inside
  (``--build-arg PIP_NO_INDEX=1``).

``auto`` (the default) tries to pull the public base and builds offline when that fails.

Everything cacheable lives under one folder that outlives a checkout (``MDQ_IMAGE_CACHE``,
default ``~/.cache/mdq-images``): buildah's storage (``vfs``: the only driver that works as
root in this sandbox, and buildah's layer cache keeps a second build of unchanged inputs to a
few seconds), the wheelhouses and the imported base, each keyed by what goes into it (the lock
files' bytes and the host's Python tag; the debootstrap recipe), so a changed input makes a new
one and an unchanged one is reused. Builds run with ``--isolation=chroot``: no daemon, no
user namespace, as root.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The repository root: the build context (only meaningful in a checkout, not an install)."""
DEPLOY = REPO_ROOT / "deploy"
REQUIREMENTS = ("runtime.txt", "build.txt")
"""The hash-pinned lock files under ``deploy/requirements`` (``make lock``)."""
PUBLIC_BASE = "python:3.11.11-slim"
"""The Dockerfiles' default ``BASE_IMAGE`` (what a normal build uses)."""
REGISTRY_BASE = f"docker.io/library/{PUBLIC_BASE}"
DEBIAN_SUITE = "bookworm"
"""Debian's release whose python3 is 3.11, the version the images are made for."""
DEBIAN_MIRROR = os.environ.get("MDQ_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BASE_PACKAGES = ("python3", "python3-venv", "passwd")
"""On top of debootstrap's minbase: the interpreter, ``python3 -m venv`` and ``useradd``."""
BASE_PRUNE = (
    "var/cache/apt",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/log",
)
"""Folders emptied in the base rootfs: package caches and lists, documentation, logs."""
BASE_RECIPE_VERSION = "1"
"""Raised when the way the base is made changes in a way its other inputs do not show."""
NEEDED_TOOLS = ("buildah", "debootstrap")
INSTALL_HINT = "apt-get install buildah podman debootstrap"
BUILD_STAGE = "localhost/mdq-build-stage:cache"
"""The Dockerfiles' build stage, kept tagged as the cache of their slow steps (not an image to
ship: it holds pip and the source tree)."""


def default_cache() -> Path:
    return Path(os.environ.get("MDQ_IMAGE_CACHE", Path.home() / ".cache" / "mdq-images"))


def missing_tools() -> list[str]:
    """The tools an offline build needs that are not on PATH (and ``root`` when not root:
    buildah's chroot isolation with vfs storage runs as root here)."""
    missing = [tool for tool in NEEDED_TOOLS if shutil.which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root")
    return missing


def project_version() -> str:
    return str(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"])


def _digest(*parts: bytes | str) -> str:
    sha = hashlib.sha256()
    for part in parts:
        sha.update(part.encode() if isinstance(part, str) else part)
        sha.update(b"\0")
    return sha.hexdigest()[:16]


def _log(message: str) -> None:
    print(f"[images] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Image:
    """One image that was built: its name and what it weighs."""

    name: str
    dockerfile: str
    size_bytes: int
    seconds: float


@dataclass
class Builder:
    """buildah with its storage under ``cache`` (chroot isolation, vfs)."""

    cache: Path = field(default_factory=default_cache)

    @property
    def storage(self) -> list[str]:
        return [
            "--root",
            str(self.cache / "storage"),
            "--runroot",
            str(self.cache / "runroot"),
            "--storage-driver",
            "vfs",
        ]

    def buildah(self, *args: str, capture: bool = False, check: bool = True) -> str:
        result = subprocess.run(
            ["buildah", *self.storage, *args],
            check=check,
            text=True,
            stdout=subprocess.PIPE if capture else None,
        )
        return result.stdout or ""

    def exists(self, image: str) -> bool:
        result = subprocess.run(
            ["buildah", *self.storage, "inspect", "--type", "image", image],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        return result.returncode == 0

    def size(self, image: str) -> int:
        """Bytes of the image's layers, uncompressed (what a node stores)."""
        inspected = json.loads(self.buildah("inspect", "--type", "image", image, capture=True))
        manifest = json.loads(inspected["Manifest"])
        return sum(int(layer["size"]) for layer in manifest["layers"])

    def run_command(
        self,
        container: str,
        *command: str,
        mounts: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> list[str]:
        """The command line that runs ``command`` in ``container`` (chroot isolation, the
        host's network, the image's user): ``mounts`` as ``host:inside[:ro]``."""
        volumes = [part for mount in mounts for part in ("--volume", mount)]
        variables = [
            part for key, value in (env or {}).items() for part in ("--env", f"{key}={value}")
        ]
        return [
            "buildah",
            *self.storage,
            "run",
            "--isolation=chroot",
            "--network=host",
            *volumes,
            *variables,
            container,
            "--",
            *command,
        ]

    def container(self, image: str) -> str:
        """A new working container of ``image`` (``remove`` it when done)."""
        return self.buildah("from", "--pull=never", "--quiet", image, capture=True).strip()

    def remove(self, container: str) -> None:
        self.buildah("rm", container, check=False, capture=True)

    def config(self, image: str) -> dict[str, object]:
        """The image's OCI configuration (``config`` of its manifest: User, Env, Labels...)."""
        inspected = json.loads(self.buildah("inspect", "--type", "image", image, capture=True))
        config: dict[str, object] = inspected["OCIv1"]["config"]
        return config

    # -- the offline inputs --------------------------------------------------------------
    def pull_public_base(self) -> bool:
        """Whether the public base is here or can be pulled (a registry answers)."""
        if self.exists(REGISTRY_BASE):
            return True
        result = subprocess.run(
            ["buildah", *self.storage, "pull", "--quiet", REGISTRY_BASE],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            timeout=600,
        )
        if result.returncode != 0:
            _log(f"no registry: {result.stderr.strip().splitlines()[-1:]}")
        return result.returncode == 0

    def local_base(self) -> str:
        """The debootstrap base, imported once per recipe: its image name."""
        recipe = json.dumps(
            {
                "suite": DEBIAN_SUITE,
                "mirror": DEBIAN_MIRROR,
                "packages": BASE_PACKAGES,
                "prune": BASE_PRUNE,
                "version": BASE_RECIPE_VERSION,
                "arch": os.uname().machine,
            },
            sort_keys=True,
        )
        name = f"localhost/mdq-base:{DEBIAN_SUITE}-{_digest(recipe)}"
        if self.exists(name):
            return name
        started = time.monotonic()
        _log(f"making {name} with debootstrap from {DEBIAN_MIRROR}")
        self.cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="base-", dir=self.cache) as folder:
            rootfs = Path(folder) / "rootfs"
            subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(BASE_PACKAGES)}",
                    DEBIAN_SUITE,
                    str(rootfs),
                    DEBIAN_MIRROR,
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            for part in BASE_PRUNE:
                target = rootfs / part
                if target.is_dir():
                    shutil.rmtree(target)
                    target.mkdir()
            archive = Path(folder) / "rootfs.tar"
            subprocess.run(
                ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(archive), "."],
                check=True,
            )
            container = self.buildah("from", "scratch", capture=True).strip()
            try:
                self.buildah("add", "--quiet", container, str(archive), "/")
                self.buildah(
                    "config",
                    "--env",
                    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "--env",
                    "LANG=C.UTF-8",
                    "--label",
                    f"org.opencontainers.image.description=Debian {DEBIAN_SUITE} minbase "
                    f"+ {' '.join(BASE_PACKAGES)} (debootstrap)",
                    "--cmd",
                    "python3",
                    container,
                )
                self.buildah("commit", "--quiet", "--rm", container, name, capture=True)
            except BaseException:
                self.buildah("rm", container, check=False)
                raise
        _log(f"{name}: {time.monotonic() - started:.0f} s")
        return name

    def wheelhouse(self) -> Path:
        """The host wheelhouse of the lock files (downloaded once per lock and Python tag),
        linked into ``deploy/wheelhouse/`` for the build to mount."""
        locks = [DEPLOY / "requirements" / name for name in REQUIREMENTS]
        tag = f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}"
        key = _digest(tag, *(lock.read_bytes() for lock in locks))
        folder = self.cache / "wheelhouse" / key
        if not folder.is_dir():
            started = time.monotonic()
            _log(f"downloading the wheelhouse {key} on the host (pip download, hashes checked)")
            folder.parent.mkdir(parents=True, exist_ok=True)
            partial = Path(tempfile.mkdtemp(prefix=f".partial-{key}-", dir=folder.parent))
            for lock in locks:
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "pip",
                        "download",
                        "--quiet",
                        "--no-deps",
                        "--prefer-binary",
                        "--require-hashes",
                        "--dest",
                        str(partial),
                        "-r",
                        str(lock),
                    ],
                    check=True,
                )
            partial.rename(folder)
            _log(f"wheelhouse {key}: {time.monotonic() - started:.0f} s")
        context = DEPLOY / "wheelhouse"
        wanted = {path.name for path in folder.iterdir()}
        for path in context.iterdir():
            if path.suffix == ".whl" and path.name not in wanted:
                path.unlink()
        for path in folder.iterdir():
            target = context / path.name
            if not target.exists():
                try:
                    os.link(path, target)
                except OSError:  # another file system
                    shutil.copy2(path, target)
        return folder

    # -- the images ----------------------------------------------------------------------
    def build(
        self,
        dockerfile: str,
        name: str,
        *,
        base: str | None,
        offline: bool,
        revision: str,
        target: str = "",
    ) -> Image:
        started = time.monotonic()
        args = [
            f"VERSION={project_version()}",
            f"REVISION={revision}",
            f"SOURCE={_source()}",
        ]
        if base is not None:
            args.append(f"BASE_IMAGE={base}")
        if offline:
            args.append("PIP_NO_INDEX=1")
        build_args = [part for arg in args for part in ("--build-arg", arg)]
        self.buildah(
            "bud",
            "--isolation=chroot",
            "--layers",
            "--quiet",
            "--pull=never" if offline else "--pull=missing",
            *build_args,
            "--file",
            str(DEPLOY / dockerfile),
            *(["--target", target] if target else []),
            "--tag",
            name,
            str(REPO_ROOT),
        )
        return Image(name, dockerfile, self.size(name), time.monotonic() - started)

    def build_all(self, *, mode: str = "auto") -> list[Image]:
        """Both images of this checkout (``mode``: auto | public | offline)."""
        offline = mode == "offline" or (mode == "auto" and not self.pull_public_base())
        base: str | None = None
        if offline:
            base = self.local_base()
            self.wheelhouse()
        revision = _revision()
        version = project_version()
        # The build stage (the same in both files) tagged too, so that pruning keeps its
        # layers: they are the cache of the slow steps (the pinned packages' install).
        self.build(
            "Dockerfile", BUILD_STAGE, base=base, offline=offline, revision=revision, target="build"
        )
        images = [
            self.build(
                dockerfile,
                f"localhost/{name}:{version}",
                base=base,
                offline=offline,
                revision=revision,
            )
            for dockerfile, name in (("Dockerfile", "mdq"), ("runner.Dockerfile", "mdq-runner"))
        ]
        self.prune()
        return images

    def prune(self) -> None:
        """Remove the images no tag leads to any more (an earlier build's steps): on vfs each
        costs a full copy of its file system. One pass frees the ends of such chains, so
        repeat until a pass frees nothing; the steps of the tagged images stay (the cache)."""
        for _ in range(100):
            if not self.buildah("rmi", "--prune", check=False, capture=True).strip():
                return


def _git(*args: str) -> str:
    result = subprocess.run(
        ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def _revision() -> str:
    commit = _git("rev-parse", "HEAD") or "unknown"
    return commit + ("-dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def _source() -> str:
    return _git("remote", "get-url", "origin") or "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.images", description=__doc__)
    parser.add_argument("--mode", choices=("auto", "public", "offline"), default="auto")
    parser.add_argument("--cache", type=Path, default=default_cache())
    options = parser.parse_args(argv)
    if shutil.which("buildah") is None or (
        options.mode == "offline" and shutil.which("debootstrap") is None
    ):
        print(f"buildah (and debootstrap, offline) are needed: {INSTALL_HINT}", file=sys.stderr)
        return 2
    builder = Builder(options.cache)
    for image in builder.build_all(mode=options.mode):
        print(f"{image.name}  {image.size_bytes / 1e6:.0f} MB  ({image.seconds:.0f} s)")
    print(f"storage: {builder.cache / 'storage'} (buildah {' '.join(builder.storage)} images)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
