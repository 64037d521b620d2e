"""The store every cluster shares (``mdq.bus.copies``), on a real nats-server configured as
``mdq up`` configures it, through a runner's own minted credentials: a checkpoint's files go in
and come back whole and verified, a corrupt or missing chunk is refused (nothing half-written
is left), a slot rewritten with a shorter file still reads right, and a runner can neither
write nor read another job's copies."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats.errors
import pytest
from nats.aio.client import Client

from mdq.bus.connect import connect
from mdq.bus.copies import CopyStore, CopyUnusable, FileToCopy
from mdq.bus.security.auth import Trust, issue, runner_issuer, write_secret
from mdq.bus.security.permissions import service_permissions
from mdq.bus.streams import ensure_streams
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.embedded import EmbeddedNats
from tests.helpers import closed_nats

SUBJECTS = Subjects("mdq")
MINE, THEIRS = "0123456789ab-mine", "bob.0123456789ab-theirs"
THEIRS_TOKEN = "0123456789ab-theirs"
CHUNK = 1000
"""A small chunk size, so every file here spans several chunks."""


@pytest.fixture(scope="module")
def secured() -> Iterator[tuple[EmbeddedNats, Trust, Path]]:
    with closed_nats("mdq-copies-") as secured:
        yield secured


@pytest.fixture(scope="module")
async def streams(secured: tuple[EmbeddedNats, Trust, Path]) -> AsyncIterator[None]:
    server, trust, folder = secured
    creds = issue(trust, service_permissions("admin", SUBJECTS), folder / "admin.creds")
    admin = await connect(server.url, name="admin", creds=creds)
    await ensure_streams(admin.jetstream(), SUBJECTS)
    yield
    await admin.close()


async def runner_of(job: str, secured: tuple[EmbeddedNats, Trust, Path]) -> Client:
    """A connection with the credentials the node agent mints for ``job``'s runner."""
    server, trust, folder = secured
    path = write_secret(folder / f"{job}.creds", runner_issuer(trust).creds(job))
    return await connect(server.url, name=f"runner-{job}", creds=path)


@pytest.fixture
async def mine(
    streams: None, secured: tuple[EmbeddedNats, Trust, Path]
) -> AsyncIterator[CopyStore]:
    client = await runner_of(MINE, secured)
    yield CopyStore(client.jetstream(timeout=2), SUBJECTS, chunk_bytes=CHUNK)
    await client.close()


def checkpoint_files(folder: Path, step: int, size: int) -> tuple[pb.Checkpoint, list[FileToCopy]]:
    folder.mkdir(parents=True, exist_ok=True)
    xml = folder / f"ckpt-{step:012d}.xml"
    xml.write_bytes(bytes(range(256)) * (size // 256) + b"<State/>")
    native = xml.with_suffix(".chk")
    native.write_bytes(b"\x00native" * (size // 16))
    sidecar = xml.with_suffix(".json")
    sidecar.write_text(f'{{"step": {step}}}')
    checkpoint = pb.Checkpoint(
        step=step,
        path=str(xml),
        sha256=hashlib.sha256(xml.read_bytes()).hexdigest(),
        size_bytes=xml.stat().st_size,
        native_sha256=hashlib.sha256(native.read_bytes()).hexdigest(),
        native_path=str(native),
        platform="CPU",
    )
    files = [
        FileToCopy(xml, "state_xml"),
        FileToCopy(native, "native"),
        FileToCopy(sidecar, "sidecar"),
    ]
    return checkpoint, files


async def test_a_checkpoint_copied_comes_back_whole_on_another_cluster(
    mine: CopyStore, tmp_path: Path
) -> None:
    checkpoint, files = checkpoint_files(tmp_path / "lab1", 4000, 10_000)
    manifest = await mine.put_checkpoint(
        job_id=MINE, attempt=2, slot="a", checkpoint=checkpoint, files=files
    )
    assert manifest.checkpoint.copy_slot == "2.a"
    sizes = [file.path.stat().st_size for file in files]  # 9,992, 4,375 and 13 bytes
    assert [f.chunks for f in manifest.files] == [-(-size // CHUNK) for size in sizes]
    assert [f.size_bytes for f in manifest.files] == sizes
    found = await mine.checkpoint_manifest(MINE, 2, "a")
    assert found == manifest
    assert await mine.checkpoint_manifest(MINE, 2, "b") is None
    written = await mine.fetch(found, tmp_path / "lab2")
    for source, copy in zip(files, written, strict=True):
        assert copy.name == source.path.name and copy.read_bytes() == source.path.read_bytes()


async def test_a_slot_rewritten_with_a_shorter_file_reads_right(
    mine: CopyStore, tmp_path: Path
) -> None:
    _, long_files = checkpoint_files(tmp_path / "first", 1000, 20_000)
    long_checkpoint = pb.Checkpoint(
        step=1000, sha256=hashlib.sha256(long_files[0].path.read_bytes()).hexdigest()
    )
    long_checkpoint.native_sha256 = hashlib.sha256(long_files[1].path.read_bytes()).hexdigest()
    await mine.put_checkpoint(
        job_id=MINE, attempt=3, slot="b", checkpoint=long_checkpoint, files=long_files
    )
    checkpoint, files = checkpoint_files(tmp_path / "second", 3000, 3_000)
    manifest = await mine.put_checkpoint(
        job_id=MINE, attempt=3, slot="b", checkpoint=checkpoint, files=files
    )
    found = await mine.checkpoint_manifest(MINE, 3, "b")
    assert found is not None and found.checkpoint.step == 3000 and found == manifest
    written = await mine.fetch(found, tmp_path / "elsewhere")
    assert written[0].read_bytes() == files[0].path.read_bytes()


async def test_a_corrupt_or_missing_chunk_is_refused_and_leaves_nothing(
    mine: CopyStore, secured: tuple[EmbeddedNats, Trust, Path], tmp_path: Path
) -> None:
    checkpoint, files = checkpoint_files(tmp_path / "lab1", 5000, 5_000)
    manifest = await mine.put_checkpoint(
        job_id=MINE, attempt=4, slot="a", checkpoint=checkpoint, files=files
    )
    client = await runner_of(MINE, secured)
    try:  # the chunk replaced (one message per subject), as a torn or tampered copy would be
        await client.jetstream().publish(SUBJECTS.copy(MINE, "ckpt.4.a.0.2"), b"x" * CHUNK)
    finally:
        await client.close()
    target = tmp_path / "lab2"
    with pytest.raises(CopyUnusable, match="sha256"):
        await mine.fetch(manifest, target)
    assert list(target.iterdir()) == []
    missing = await mine.put_checkpoint(
        job_id=MINE, attempt=4, slot="b", checkpoint=checkpoint, files=files
    )
    missing.files[1].chunks += 1  # a chunk that was never stored
    with pytest.raises(CopyUnusable, match="missing"):
        await mine.fetch(missing, tmp_path / "lab3")
    assert not any(path.name.endswith(".chk") for path in (tmp_path / "lab3").iterdir())


async def test_a_file_changed_while_copied_publishes_no_manifest(
    mine: CopyStore, tmp_path: Path
) -> None:
    checkpoint, files = checkpoint_files(tmp_path / "lab1", 6000, 2_000)
    checkpoint.sha256 = "0" * 64  # what was announced is not what is on disk any more
    with pytest.raises(CopyUnusable, match="changed"):
        await mine.put_checkpoint(
            job_id=MINE, attempt=5, slot="a", checkpoint=checkpoint, files=files
        )
    assert await mine.checkpoint_manifest(MINE, 5, "a") is None


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The subjects the server refused this test's clients (a permissions violation each, as
    ``mdq.bus.connect.log_client_error`` logs them)."""
    return re.findall(r'permissions violation for publish to "([^"]+)"', caplog.text, re.I)


async def test_a_runner_neither_writes_nor_reads_another_jobs_copies(
    mine: CopyStore,
    secured: tuple[EmbeddedNats, Trust, Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    their_client = await runner_of(THEIRS, secured)
    theirs = CopyStore(their_client.jetstream(timeout=2), SUBJECTS, chunk_bytes=CHUNK)
    try:
        checkpoint, files = checkpoint_files(tmp_path / "theirs", 100, 2_000)
        await theirs.put_checkpoint(
            job_id=THEIRS, attempt=1, slot="a", checkpoint=checkpoint, files=files
        )
        assert await theirs.checkpoint_manifest(THEIRS, 1, "a") is not None
        caplog.set_level(logging.ERROR, logger="mdq.bus")
        # the server refuses the request (and so no answer comes): the refusal is the proof
        with pytest.raises(nats.errors.TimeoutError):
            await mine.checkpoint_manifest(THEIRS, 1, "a")
        assert any(THEIRS_TOKEN in subject for subject in refusals(caplog)), caplog.text
        caplog.clear()
        forged, forged_files = checkpoint_files(tmp_path / "forged", 200, 2_000)
        with pytest.raises(nats.errors.TimeoutError):
            await mine.put_checkpoint(
                job_id=THEIRS, attempt=1, slot="a", checkpoint=forged, files=forged_files
            )
        assert any(THEIRS_TOKEN in subject for subject in refusals(caplog)), caplog.text
        kept = await theirs.checkpoint_manifest(THEIRS, 1, "a")
        assert kept is not None and kept.checkpoint.step == 100
    finally:
        await their_client.close()
