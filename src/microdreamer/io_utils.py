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
* :func:`resolve_inside` — a file that an input names (an OBJ's ``mtllib``, a ``transforms.json``
  frame's ``file_path``) resolved inside the input's own folder: absolute names and names that climb
  out (``..`` or a symlink) are refused.

Every temporary sits beside its target under one naming scheme (:func:`temp_path`:
``.NAME.tmp-PID``, ``.NAME.old-PID``, shortened with a hash to fit 255 bytes), is tracked while it
exists (:func:`remove_in_flight` removes what a signal left) and, when its process was killed, is
removed by the next run into the same target (:func:`sweep_stale`). A staged folder is written by one
run at a time (a ``.NAME.lock`` beside it holds the writer's process id).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from microdreamer.errors import InputError

logger = logging.getLogger(__name__)


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
    check_output_name(path)
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
    """A job's output folder: not a file, a name that fits, writable (or creatable below a writable
    folder) and so is the folder above it (where it is staged), and none of the files ``outputs`` it will
    hold is one of ``inputs``. Creates nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{path}: exists and is not a folder; give a folder for the outputs")
    check_output_name(path)
    _check_folder_writable(path, path, create=True)
    full = Path(os.path.abspath(path))
    if full.parent.exists():  # the staging folder and the lock live beside the output folder
        _check_folder_writable(full.parent, path, create=True)
    inputs = list(inputs)
    for name in outputs:
        check_not_input(path / name, inputs)
    return path


def resolve_inside(folder: str | os.PathLike, name: str, what: str, source: str | os.PathLike) -> Path:
    """The file that the input ``source`` names as ``name``, relative to ``folder`` (its own folder),
    resolved (symlinks followed). One InputError line when the name is empty, absolute, or leads out of
    ``folder`` (``..``, or a symlink pointing elsewhere): an input reads only inside its own folder.
    ``what`` names the reference in the message (``"image"``, ``"material library"``)."""
    if not isinstance(name, str) or not name.strip() or "\x00" in name:
        raise InputError(f"{source}: names {what} {name!r}, which is no file name; fix the file")
    if Path(name).is_absolute() or re.match(r"^[A-Za-z]:[\\/]", name):
        raise InputError(f"{source}: names {what} {name!r} by an absolute path; put the file in {folder} "
                         "and name it relative to that folder")  # fmt: skip
    base = Path(folder).resolve()
    try:
        target = (base / name).resolve()
    except (OSError, RuntimeError, ValueError) as e:  # a symlink loop, a name the system refuses
        raise InputError(f"{source}: {what} {name!r} cannot be resolved ({e}); fix the file") from None
    if not target.is_relative_to(base):
        raise InputError(f"{source}: {what} {name!r} lies outside its folder {folder}; put the file in that "
                         "folder and name it relative to it")  # fmt: skip
    return target


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


# ---------------------------------------------------------------------------------------- temporaries
MAX_NAME_BYTES = 255
#: a temporary's name: ``.BASE.TAG-PID`` and, for files, the target's suffix
_TEMP = re.compile(r"^\.(?P<base>.+)\.(?P<tag>tmp|old)-(?P<pid>\d+)(?P<suffix>\.[^.]{1,16})?$")
#: temporaries of this process that exist now (removed by :func:`remove_in_flight` after a signal)
_IN_FLIGHT: dict[Path, None] = {}
#: the signals that end a run; the command line turns each into an exception
END_SIGNALS = tuple(
    getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n)
)


def check_output_name(path: str | os.PathLike) -> None:
    """InputError when the last part of ``path`` cannot name an output: empty, ``.``/``..`` (after
    normalising), or longer than a file name may be (255 bytes)."""
    name = Path(os.path.abspath(path)).name
    if not name:
        raise InputError(f"{path}: is the root folder; give a folder below it for the outputs")
    if len(os.fsencode(name)) > MAX_NAME_BYTES:
        raise InputError(f"{path}: its name is {len(os.fsencode(name))} bytes, over the {MAX_NAME_BYTES} a "
                         "file name may have; choose a shorter name")  # fmt: skip


def _fit(name: str, room: int) -> str:
    """``name`` cut to ``room`` bytes (UTF-8), ending in a hash of the whole when cut."""
    raw = os.fsencode(name)
    if len(raw) <= room:
        return name
    digest = hashlib.sha1(raw).hexdigest()[:12]
    return os.fsdecode(raw[: max(0, room - 13)]).encode("utf-8", "ignore").decode() + "~" + digest


def temp_path(
    path: str | os.PathLike, tag: str = "tmp", pid: int | None = None, suffix: bool = False
) -> Path:
    """The temporary sibling of ``path``: ``.NAME.TAG-PID`` (``suffix``: ``.STEM.TAG-PID.SUFFIX``, so
    writers choosing a format from the suffix still work), shortened with a hash to fit 255 bytes."""
    path = Path(os.path.abspath(path))
    pid = os.getpid() if pid is None else pid
    keep = path.suffix if suffix and 0 < len(path.suffix) <= 17 else ""
    base = path.name[: len(path.name) - len(keep)] if keep else path.name
    tail = f".{tag}-{pid}{keep}"
    return path.with_name("." + _fit(base, MAX_NAME_BYTES - 1 - len(tail)) + tail)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def sweep_stale(path: str | os.PathLike) -> list[Path]:
    """Remove the temporaries of ``path`` (``.NAME.tmp-PID``, ``.NAME.old-PID``) whose process is gone: a
    run that was killed (SIGKILL, a power cut) before it could clean up. Each is reported on the log;
    those of live processes are left alone. Returns the paths removed."""
    path = Path(os.path.abspath(path))
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        m = _TEMP.match(entry.name)
        if m is None:
            continue
        pid = int(m["pid"])
        p = Path(entry.path)
        if temp_path(path, m["tag"], pid, suffix=bool(m["suffix"])).name != entry.name:
            continue
        if p in _IN_FLIGHT or _alive(pid):
            continue
        _remove(p)
        removed.append(p)
        logger.warning("%s: removed %s, left by a run that was killed (process %d)", path, p.name, pid)
    return removed


@contextlib.contextmanager
def _tracked(path: Path) -> Iterator[Path]:
    _IN_FLIGHT[path] = None
    try:
        yield path
    finally:
        with signals_held():
            _remove(path)
            _IN_FLIGHT.pop(path, None)


def remove_in_flight() -> None:
    """Remove every temporary of this process that still exists (the command line calls it, with
    signals held, when a run ends by a signal that arrived during another clean-up)."""
    with signals_held():
        for p in reversed(list(_IN_FLIGHT)):
            _remove(p)
            _IN_FLIGHT.pop(p, None)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold off the signals that end a run (:data:`END_SIGNALS`) for the block (a clean-up that must
    finish), then deliver the first that came. Outside the main thread: the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {}
    try:
        for s in END_SIGNALS:
            previous[s] = signal.signal(s, lambda signum, frame: pending.append(signum))
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if pending:
            signal.raise_signal(pending[0])


@contextlib.contextmanager
def run_lock(final: str | os.PathLike) -> Iterator[None]:
    """One run at a time writes ``final``: ``.NAME.lock`` beside it holds this process's id for the
    block. A lock whose process is gone (a killed run) is removed and reported; a live one refuses."""
    final = Path(os.path.abspath(final))
    lock = final.with_name("." + _fit(final.name, MAX_NAME_BYTES - 6) + ".lock")
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                pid = int(lock.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pid = None  # being written this instant, or garbage
            if pid is None or _alive(pid):
                who = f"process {pid}" if pid is not None else "another process"
                raise InputError(f"{final}: another microdreamer run ({who}) is writing it; wait for that run "
                                 f"to end or choose another output (a stale lock: delete {lock})") from None  # fmt: skip
            with contextlib.suppress(OSError):
                lock.unlink()
            logger.warning("%s: removed the lock of a run that was killed (process %d)", final, pid)
            continue
        except OSError as e:
            raise InputError(
                f"{final}: cannot write in {final.parent} ({e.strerror}); choose another output"
            ) from None
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        break
    else:
        raise InputError(f"{final}: cannot take its lock {lock}; delete it if no run is writing there")
    _IN_FLIGHT[lock] = None
    try:
        yield
    finally:
        with signals_held():
            _remove(lock)
            _IN_FLIGHT.pop(lock, None)


#: errors of a write that the user can act on (space, permissions, a vanished folder)
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT,
                 errno.ENOTDIR, errno.EISDIR, errno.EFBIG, errno.EIO, errno.ENAMETOOLONG}  # fmt: skip
#: errors that say which device, not which file: a full disk, a quota, a read-only or failing disk
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}


def write_error(e: OSError, output: Path, *places: Path) -> InputError | None:
    """The one-line InputError for ``e`` raised while writing ``output``, or None when ``e`` is not a
    write error of ``output`` (a file of another place, say an input that vanished): a disk error names
    no file; others must name ``output`` or a path inside one of ``places`` (its temporaries)."""
    if e.errno not in _WRITE_ERRNOS:
        return None
    if e.filename is None:
        if e.errno not in DISK_ERRNOS:
            return None
    else:
        name = Path(os.path.abspath(os.fsdecode(e.filename)))
        ours = [Path(os.path.abspath(output)), *(Path(os.path.abspath(p)) for p in places)]
        if not any(name == p or name.is_relative_to(p) for p in ours):
            return None
    what = "free space on that disk" if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else "check it"
    return InputError(
        f"{output}: cannot be written ({e.strerror or type(e).__name__}); {what} or choose another path"
    )


def _move_in(stage: Path, final: Path, replace: bool, owned: Sequence[str]) -> None:
    """Move the staged run into ``final`` as one: every target first set aside, then every staged file
    renamed in; a failure puts the set-aside files back. ``replace``: ``final`` replaced whole; else the
    staged files replace those of the same names, ``owned`` files of an earlier run that this run did
    not write are removed, and the user's other files are kept."""
    if replace:
        old = temp_path(final, "old")
        _remove(old)
        with _tracked(old):
            if final.exists():
                os.replace(final, old)
            try:
                os.replace(stage, final) if stage.is_dir() else final.mkdir()
            except BaseException:
                if old.exists() and not final.exists():
                    os.replace(old, final)
                raise
        return
    items = sorted(stage.iterdir()) if stage.is_dir() else []
    for item in items:
        target = final / item.name
        if target.is_dir() and not item.is_dir():
            raise InputError(f"{target}: is a folder; the output {item.name} cannot replace it")
    final.mkdir(exist_ok=True)
    written = {item.name for item in items}
    leaving = [final / n for n in owned if n not in written and (final / n).is_file()]
    old = temp_path(final, "old")
    _remove(old)
    with _tracked(old):
        old.mkdir()
        set_aside, moved = [], []
        try:
            for target in [final / item.name for item in items if (final / item.name).exists()] + leaving:
                os.replace(target, old / target.name)
                set_aside.append(target)
            for item in items:
                os.replace(item, final / item.name)
                moved.append(final / item.name)
        except BaseException:
            for target in moved:
                _remove(target)
            for target in set_aside:
                with contextlib.suppress(OSError):
                    os.replace(old / target.name, target)
            raise


@contextlib.contextmanager
def staged_folder(
    final: str | os.PathLike, replace: bool = False, owned: Sequence[str] = ()
) -> Iterator[Path]:
    """Yield a hidden, not yet created folder beside ``final`` for a job to write its outputs into; when
    the block succeeds its files are moved into ``final`` as one (see :func:`_move_in`: ``replace`` the
    folder whole, only for a folder the caller knows is its own; else files of the same names replaced,
    the ``owned`` names of an earlier run removed, the user's other files kept). Otherwise the stage is
    removed with any parents made for it: a failed job leaves no folder and no partial outputs, and a job
    that fails in an existing folder changes nothing.

    One run at a time (:func:`run_lock`); temporaries of killed runs are removed first
    (:func:`sweep_stale`); a write error (a full disk, permissions) becomes one InputError line."""
    shown = Path(final)
    final = Path(os.path.abspath(final))
    check_output_name(shown)
    if final.exists() and not final.is_dir():
        raise InputError(f"{shown}: exists and is not a folder; give a folder for the outputs")
    with made_parents(final.parent), run_lock(final):
        sweep_stale(final)
        stage = temp_path(final, "tmp")
        _remove(stage)
        try:
            with _tracked(stage):
                yield stage
                with signals_held():
                    _move_in(stage, final, replace, owned)
        except OSError as e:
            if (err := write_error(e, shown, final, stage, temp_path(final, "old"))) is not None:
                raise err from e
            raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.

    On any exception (an interrupt and SIGTERM included: the command line turns SIGTERM into an
    exception) the temporary file is removed, so a failure never leaves a half-written output; its
    removal is not cut short by a second signal (:func:`signals_held`). The temporary name keeps the
    target's suffix (``.NAME.tmp-<pid>.glb``) so that writers choosing a format from the suffix still
    work. An OSError of the write itself (a full disk, which names no file, or permission denied)
    becomes one InputError line naming the output.
    """
    path = Path(path)
    check_output_name(path)
    sweep_stale(path)
    tmp = temp_path(path, "tmp", suffix=True)
    tmp = path.with_name(tmp.name) if not path.is_absolute() else tmp
    try:
        with _tracked(tmp):
            yield tmp
            os.replace(tmp, path)
    except OSError as e:
        if (err := write_error(e, path, tmp)) is not None:
            raise err from e
        raise


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
