"""Inputs and outputs checked before any work; outputs written to a temporary name beside the target,
then renamed, so that a failure (or an interrupt) leaves nothing half-written and nothing created.

* :func:`check_input` — an input path exists and is the right kind (file or folder), one line if not.
* :func:`check_output_path` — a file output: its suffix, that its folder is (or can be made) a writable
  folder, and that it is none of the inputs. Nothing is created.
* :func:`check_companions` — files written beside an output that the user did not name (a textured
  OBJ's ``.mtl`` and ``.png``): refused when they exist and were not written by microdreamer.
* :func:`made_parents` — create an output's missing folders, and remove them again on failure.
* :func:`staged_folder` — a job's output folder assembled in a hidden sibling and moved into place only
  when the job succeeds.
* :func:`atomic_path` — one file written under a temporary name and renamed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from microdreamer.errors import InputError


def check_input(path: str | os.PathLike, kind: str, what: str) -> Path:
    """``path`` as a Path, or a one-line InputError when it is missing, not a ``kind`` (``"file"`` or
    ``"folder"``) or unreadable. ``what`` names the input in the message (``"splat"``)."""
    path = Path(path)
    if not path.exists():
        raise InputError(
            f"{path}: {'folder' if kind == 'folder' else 'file'} not found; give the path of the {what}"
        )
    if kind == "file" and path.is_dir():
        raise InputError(f"{path}: is a folder, not a {what} file; give the file itself")
    if kind == "folder" and not path.is_dir():
        raise InputError(f"{path}: is a file, not a {what} folder; give the folder")
    if not os.access(path, os.R_OK | (os.X_OK if kind == "folder" else 0)):
        raise InputError(f"{path}: cannot be read (permission denied); check its permissions")
    return path


def _nearest_existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _check_folder_writable(folder: Path, output: Path, create: bool) -> None:
    """``folder`` is (or, with ``create``, can become) a folder where ``output`` can be written."""
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{output}: {folder} is a file, not a folder; choose another output path")
    if not folder.exists():
        base = _nearest_existing(folder)
        if base.exists() and not base.is_dir():
            raise InputError(f"{output}: {base} is a file, not a folder; choose another output path")
        if not create:
            raise InputError(
                f"{output}: the folder {folder} does not exist; create it or choose another path"
            )
        folder = base
    probe = folder / f".microdreamer-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise InputError(
            f"{output}: cannot write in {folder} ({reason}); choose another output path"
        ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_not_input(output: Path, inputs: Iterable[str | os.PathLike]) -> None:
    """InputError when writing ``output`` would replace one of ``inputs``."""
    for inp in inputs:
        if inp is not None and _same_file(output, Path(inp)):
            raise InputError(
                f"{output}: is the input {inp}; writing there would replace it, choose another output path"
            )


def check_output_path(
    path: str | os.PathLike,
    suffixes: Sequence[str],
    what: str,
    inputs: Iterable[str | os.PathLike] = (),
    create_parents: bool = False,
) -> Path:
    """``path`` as a Path, or a one-line InputError if its suffix is not one of ``suffixes`` (case
    ignored), it is a folder, its folder does not exist (unless ``create_parents``: then the nearest
    existing folder above it must be writable) or cannot be written, or it is one of ``inputs``.
    ``what`` names the kind of file in the message. Creates nothing (a probe file is removed at once)."""
    path = Path(path)
    if path.suffix.lower() not in suffixes:
        given = path.suffix or "(none)"
        choices = ", ".join(suffixes[:-1]) + f" or {suffixes[-1]}" if len(suffixes) > 1 else suffixes[0]
        raise InputError(f"{path}: unsupported {what} format {given!r}; use {choices}")
    if path.is_dir():
        raise InputError(f"{path}: is a folder; give a file name ending in {' or '.join(suffixes)}")
    _check_folder_writable(path.parent, path, create_parents)
    check_not_input(path, inputs)
    return path


def check_output_folder(
    path: str | os.PathLike, outputs: Sequence[str] = (), inputs: Iterable[str | os.PathLike] = ()
) -> Path:
    """A job's output folder: not a file, writable (or creatable below a writable folder), and none of
    the files ``outputs`` it will hold is one of ``inputs``. Creates nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{path}: exists and is not a folder; give a folder for the outputs")
    _check_folder_writable(path, path, create=True)
    inputs = list(inputs)
    for name in outputs:
        check_not_input(path / name, inputs)
    return path


def microdreamer_mtl(path: Path, image: str) -> bool:
    """True when ``path`` is a material file microdreamer wrote that names ``image``."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8", errors="replace")
    except OSError:
        return False
    return head.startswith("# microdreamer") and f"map_Kd {image}" in head


def check_companions(output: Path, companions: Sequence[Path], ours: Callable[[Path], bool]) -> None:
    """Refuse to write ``output`` when a file it brings along (``companions``, written beside it but
    not named by the user) exists and ``ours(path)`` says microdreamer did not write it."""
    for c in companions:
        if c.exists() and not ours(c):
            others = ", ".join(p.name for p in companions)
            raise InputError(
                f"{output}: writing it also writes {others}, and {c} already exists and was not written "
                "by microdreamer; move it, choose another name, or write a .glb"
            )


def textured_obj_companions(output: Path) -> tuple[list[Path], Callable[[Path], bool]]:
    """The files a textured OBJ brings (``NAME.mtl``, ``NAME.png``) and the test that one of them is a
    previous microdreamer output (the MTL is ours and names the PNG), for :func:`check_companions`."""
    mtl, png = output.with_suffix(".mtl"), output.with_suffix(".png")

    def ours(p: Path) -> bool:
        return microdreamer_mtl(mtl, png.name) if p in (mtl, png) else False

    return [mtl, png], ours


@contextlib.contextmanager
def made_parents(folder: str | os.PathLike) -> Iterator[Path]:
    """Create ``folder`` and its missing parents; if the block fails, remove those it created (when
    they are still empty)."""
    folder = Path(folder)
    created = []
    p = folder
    while not p.exists() and p != p.parent:
        created.append(p)
        p = p.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{folder}: cannot create the folder ({e.strerror}); choose another path") from None
    try:
        yield folder
    except BaseException:
        for c in created:  # deepest first
            with contextlib.suppress(OSError):
                c.rmdir()
        raise


@contextlib.contextmanager
def staged_folder(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a hidden, not yet created folder beside ``final`` for a job to write its outputs into; when
    the block succeeds its files are moved into ``final`` (created if needed; files of the same names
    replaced, others kept), otherwise it is removed with any parents made for it. A failed job thus
    leaves no folder and no partial outputs; a job that fails in an existing folder changes nothing."""
    final = Path(final)
    if final.exists() and not final.is_dir():
        raise InputError(f"{final}: exists and is not a folder; give a folder for the outputs")
    with made_parents(final.parent):
        stage = final.parent / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(stage, ignore_errors=True)
        try:
            yield stage
            final.mkdir(exist_ok=True)
            if stage.is_dir():
                for item in sorted(stage.iterdir()):
                    target = final / item.name
                    if target.is_dir() and not item.is_dir():
                        raise InputError(f"{target}: is a folder; the output {item.name} cannot replace it")
                    if item.is_dir() and target.exists():
                        shutil.rmtree(target) if target.is_dir() else target.unlink()
                    os.replace(item, target)
        finally:
            shutil.rmtree(stage, ignore_errors=True)


#: errors of a write that the user can act on (space, permissions, a vanished folder)
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT,
                 errno.ENOTDIR, errno.EISDIR, errno.EFBIG, errno.EIO}  # fmt: skip


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.

    On any exception (an interrupt and SIGTERM included: the command line turns SIGTERM into an
    exception) the temporary file is removed, so a failure never leaves a half-written output. The
    temporary name keeps the target's suffix (``.tmp-<pid>.glb``) so that writers choosing a format
    from the suffix still work. An OSError of the write itself (disk full, permission denied) becomes
    one InputError line naming the output.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        mine = e.filename is not None and Path(e.filename).name in (tmp.name, path.name)
        if mine and e.errno in _WRITE_ERRNOS:
            raise InputError(
                f"{path}: cannot be written ({e.strerror}); free space or choose another path"
            ) from e
        raise
    finally:
        if tmp.exists():
            tmp.unlink()


def _cgroup_free() -> int | None:
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):  # fmt: skip
        try:
            with open(limit) as f:
                text = f.read().strip()
            if text == "max" or int(text) >= 1 << 60:
                return None
            with open(usage) as f:
                return int(text) - int(f.read().strip())
        except (OSError, ValueError):
            continue
    return None


def free_host_memory() -> int:
    """Bytes of host memory a step may still take: MemAvailable (Linux), within the cgroup's limit;
    the free physical pages elsewhere; 2^62 (no limit) when neither can be read."""
    host = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    host = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if host is None:
        try:
            host = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            host = 1 << 62
    cgroup = _cgroup_free()
    return host if cgroup is None else min(host, cgroup)


def check_memory(need: int, what: str, advice: str, share: float = 0.9) -> None:
    """InputError when ``need`` bytes exceed ``share`` of the free host memory; ``what`` says what needs
    it (``"image.png: decoding 20000x20000 pixels"``), ``advice`` what to do."""
    free = free_host_memory()
    if need > share * free:
        raise InputError(
            f"{what} needs about {need / 2**30:.1f} GB but {free / 2**30:.1f} GB are free; {advice}"
        )


def to_uint8(image: np.ndarray) -> np.ndarray:
    """A float image in [0, 1] (clipped) as uint8, rounded to nearest (ties to even)."""
    return np.round(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)
