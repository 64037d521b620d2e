"""The real disks a test fails under a service: a small ext4 loop mount, or a folder under a
real quota (a btrfs subvolume with a qgroup limit), chosen by a test's parameter."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mdq.testing.disks import QuotaDisk, SmallDisk

Disk = SmallDisk | QuotaDisk


def made_disk(request: pytest.FixtureRequest, folder: Path, name: str) -> Iterator[Disk]:
    """A 24 MiB ext4 disk mounted on ``folder / name``, or, when the test parametrizes its
    ``disk`` fixture with ``"quota"`` (``indirect``), a folder there under a 24 MiB quota;
    destroyed after the test."""
    made: Disk
    if getattr(request, "param", "ext4") == "quota":
        if shutil.which("mkfs.btrfs") is None:
            pytest.skip("mkfs.btrfs not found: install Debian's btrfs-progs for a real quota")
        made = QuotaDisk(mount_point=folder / name, image=folder / f"{name}.img", quota_mb=24)
    else:
        made = SmallDisk(mount_point=folder / name, image=folder / f"{name}.img", size_mb=24)
    made.create()
    try:
        yield made
    finally:
        made.destroy()


def on_ext4(action: Callable[[SmallDisk], None]) -> Callable[[Disk], None]:
    """``action``, which only an ext4 disk can take (read-only, shut down, unmount, freeze)."""

    def act(disk: Disk) -> None:
        assert isinstance(disk, SmallDisk), f"{action.__name__} needs an ext4 disk"
        action(disk)

    return act
