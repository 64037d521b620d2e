"""A small real filesystem that tests can fill, make read-only, fail or unmount.

``SmallDisk`` (ext4 on a loop mount) makes every failure of a data disk for real: ENOSPC,
EROFS, EIO, a lost mount, a hung disk; ``QuotaDisk`` (a btrfs subvolume over its qgroup limit)
makes EDQUOT. Needs root to mount.

How each failure is made: docs/testing.md, "Disks that fail".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import subprocess
import time
from pathlib import Path

EXT4_IOC_SHUTDOWN = 0x8004587D
"""_IOR('X', 125, __u32): shut the filesystem down."""
EXT4_GOING_FLAGS_NOLOGFLUSH = 2
FIFREEZE = 0xC0045877
"""_IOWR('X', 119, int): block every write until thawed."""
FITHAW = 0xC0045878
"""Shut down without flushing the journal (what a dying device does)."""


class DiskUnavailable(RuntimeError):
    """The small disk cannot be made here (not root, no loop devices)."""


class SmallDisk:
    """An ext4 loop filesystem of ``size_mb`` MiB mounted on ``mount_point``."""

    def __init__(self, *, mount_point: Path, image: Path, size_mb: int = 32) -> None:
        self.mount_point = mount_point
        self.image = image
        self.size_mb = size_mb
        self.filler = mount_point / ".test-fill"
        self.mounted = False

    def create(self) -> SmallDisk:
        """Make the filesystem and mount it."""
        self.mount_point.mkdir(parents=True, exist_ok=True)
        with self.image.open("wb") as handle:
            handle.truncate(self.size_mb * 1024 * 1024)
        self._run("mkfs.ext4", "-q", "-F", "-m", "0", str(self.image))
        self.mount()
        return self

    def mount(self) -> None:
        self._run("mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.mount_point))
        self.mounted = True

    def make_read_only(self) -> None:
        """Every write fails with EROFS from now on (until unmounted and mounted)."""
        source = subprocess.run(
            ["findmnt", "-n", "-o", "SOURCE", str(self.mount_point)],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        trigger = Path("/sys/fs/ext4") / Path(source).name / "trigger_fs_error"
        trigger.write_text("mdq test: made read-only\n")

    def shut_down(self) -> None:
        """Every read and write fails with EIO from now on (until unmounted and mounted)."""
        descriptor = os.open(self.mount_point, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(
                descriptor, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH)
            )
        finally:
            os.close(descriptor)

    def freeze(self) -> None:
        self._ioctl(FIFREEZE)

    def thaw(self) -> None:
        self._ioctl(FITHAW)

    def _ioctl(self, request: int) -> None:
        descriptor = os.open(self.mount_point, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(descriptor, request, 0)
        finally:
            os.close(descriptor)

    def fill(self) -> int:
        """Write a file until the filesystem refuses another byte; the bytes written."""
        return fill_file(self.filler)

    def fill_up(self) -> None:
        """``fill``, for callers that do not need the count."""
        self.fill()

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        """Unmount (lazily if something still holds it open)."""
        if not self.mounted:
            return
        for _ in range(20):
            done = subprocess.run(
                ["umount", str(self.mount_point)], capture_output=True, timeout=30, check=False
            )
            if done.returncode == 0:
                break
            time.sleep(0.25)
        else:
            subprocess.run(
                ["umount", "-l", str(self.mount_point)], capture_output=True, check=False
            )
        self.mounted = False

    def remount(self) -> None:
        """Unmount and mount again: back from ``make_read_only`` or ``shut_down``."""
        self.unmount()
        self.mount()

    def destroy(self) -> None:
        self.unmount()
        self.image.unlink(missing_ok=True)

    @staticmethod
    def _run(*argv: str) -> None:
        try:
            subprocess.run(argv, check=True, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as error:
            stderr = getattr(error, "stderr", b"") or b""
            why = stderr.decode(errors="replace").strip() or str(error)
            raise DiskUnavailable(f"{' '.join(argv)}: {why}") from None


class QuotaDisk:
    """A btrfs subvolume on ``mount_point`` limited to ``quota_mb`` MiB by a qgroup, on a
    btrfs file system of ``size_mb`` MiB (plenty of room beyond the quota) in ``image``."""

    def __init__(
        self, *, mount_point: Path, image: Path, quota_mb: int = 24, size_mb: int = 256
    ) -> None:
        self.mount_point = mount_point
        self.image = image
        self.quota_mb = quota_mb
        self.size_mb = size_mb
        self.root = image.with_name(image.name + ".root")
        self.filler = mount_point / ".test-fill"
        self.mounted = False

    def create(self) -> QuotaDisk:
        """Make the file system, its quota'd subvolume, and mount it."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self.image.open("wb") as handle:
            handle.truncate(self.size_mb * 1024 * 1024)
        SmallDisk._run("mkfs.btrfs", "-q", "-f", str(self.image))
        SmallDisk._run("mount", "-o", "loop", str(self.image), str(self.root))
        self.mounted = True
        SmallDisk._run("btrfs", "quota", "enable", str(self.root))
        SmallDisk._run("btrfs", "subvolume", "create", str(self.root / "volume"))
        SmallDisk._run("btrfs", "qgroup", "limit", f"{self.quota_mb}M", str(self.root / "volume"))
        self.mount_point.mkdir(parents=True, exist_ok=True)
        SmallDisk._run("mount", "--bind", str(self.root / "volume"), str(self.mount_point))
        return self

    def fill_up(self) -> None:
        """Write a file until the quota refuses another byte (EDQUOT)."""
        fill_file(self.filler)

    def free(self) -> None:
        """Delete the filler and let btrfs account for it (a commit), so writes fit again."""
        self.filler.unlink(missing_ok=True)
        SmallDisk._run("btrfs", "filesystem", "sync", str(self.root))

    def destroy(self) -> None:
        if self.mounted:
            for folder in (self.mount_point, self.root):
                subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)
            self.mounted = False
        self.image.unlink(missing_ok=True)


__all__ = ["DiskUnavailable", "QuotaDisk", "SmallDisk"]


def fill_file(path: Path) -> int:
    """Append zeros to ``path`` until its filesystem refuses another byte (in ever smaller
    writes, down to one); the bytes written."""
    written = 0
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (1 << 20, 1 << 12, 1 << 9, 1):
            block = b"\0" * chunk
            while True:
                try:
                    written += os.write(descriptor, block)
                except OSError:
                    break
        with contextlib.suppress(OSError):
            os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return written
