"""Output files written without following links: the one place every writer of a run goes through.

A results folder is often shared (a lab's network drive, a CI workspace): a symbolic link planted there as
``results.csv`` -> ``~/.bashrc`` would make a plain ``open(path, "w")`` write outside the folder, and a hard link
planted as ``log.jsonl`` would make an append land in another file. Every file medadv writes therefore goes
through this module (issue 28, item 11):

* whole files (:func:`write_bytes`, :func:`write_text`, :func:`open_output` with ``"w"``, :func:`save_figure`)
  are written to a new temporary file beside the target, created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a link
  planted under any name is never opened), flushed to disk and renamed over the target with ``os.replace``
  (a rename replaces a link, it never follows one). The target is checked first: a symbolic link there is
  refused (:class:`LinkedOutputError`), so a planted link is reported, not silently replaced;
* appended files (``"a"``: the JSON Lines logs) are opened with ``O_APPEND | O_NOFOLLOW`` and must be a regular
  file with a single link (a hard link would make the append land in another file);
* with ``root`` (the output folder), every folder between ``root`` and the file is opened with ``O_NOFOLLOW``
  through the previous folder's descriptor (created when missing), so no component below ``root`` can be a link;
  without it the last component is protected and the folder is the caller's (a path the user gave).

The folder is opened once per file and the file is written and renamed through that descriptor
(``dir_fd``), so a folder swapped for a link while the file is written does not redirect the write.
POSIX only: where ``O_NOFOLLOW`` does not exist (Windows) the link checks use ``os.lstat`` instead.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["LinkedOutputError", "open_output", "write_bytes", "write_text", "save_figure", "check_not_linked",
           "tmp_prefix"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIR_FD = os.open in os.supports_dir_fd and _NOFOLLOW != 0


class LinkedOutputError(OSError):
    """An output file (or a folder on its way) is a link, or not a regular file: medadv does not write
    through it. The message names the path; it has no ``errno`` (the CLI prints it as one line)."""


def tmp_prefix(name: str) -> str:
    """The start of the names of the temporary files written beside ``name`` (``.results.json.``); the rest
    is random, so no name can be planted in advance."""
    return f".{name}."


def _refuse_link(path: Path, what: str = "a symbolic link") -> LinkedOutputError:
    try:
        to = f" to {os.readlink(path)}" if what == "a symbolic link" else ""
    except OSError:
        to = ""
    return LinkedOutputError(f"{path} is {what}{to}: medadv writes its outputs only as regular files inside the "
                             "output folder, never through a link; remove it (or choose another output folder)")


def check_not_linked(path: str | os.PathLike, *, hard_links: bool = True) -> None:
    """Refuse (:class:`LinkedOutputError`) when ``path`` is a symbolic link (dangling or not) or, with
    ``hard_links``, a regular file with other hard links (what matters for a file appended to: a file written
    whole replaces its name and leaves the other names alone); a missing path is fine."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise _refuse_link(p)
    if hard_links and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise _refuse_link(p, f"a file with {st.st_nlink} hard links (another name of the same file may be "
                              "outside the output folder)")


def _open_dir(folder: Path, root: Path | None) -> int:
    """A descriptor of ``folder``; with ``root``, every component of ``folder`` below ``root`` is opened (or made)
    without following a link, starting from ``root`` itself (which the user named: it may be a link)."""
    flags = os.O_RDONLY | _DIRECTORY | _CLOEXEC
    if root is None or not _DIR_FD:
        if root is not None:  # no dir_fd support: check each component with lstat instead
            here = root
            for part in _below(folder, root):
                here = here / part
                check_not_linked(here)
        folder.mkdir(parents=True, exist_ok=True)
        return os.open(folder, flags)
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, flags)
    here = root
    try:
        for part in _below(folder, root):
            here = here / part
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=fd)
            try:
                nxt = os.open(part, flags | _NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if os.path.islink(here):
                    raise _refuse_link(here) from None
                if not os.path.isdir(here):
                    raise LinkedOutputError(f"{here} is not a folder: medadv writes its outputs below it") from None
                raise e
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _below(folder: Path, root: Path) -> tuple[str, ...]:
    try:
        parts = folder.relative_to(root).parts
    except ValueError:
        raise ValueError(f"{folder} is not inside the output folder {root}") from None
    if ".." in parts:
        raise ValueError(f"{folder} leaves the output folder {root} ('..')")
    return parts


def _lstat(name: str, fd: int, path: Path) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False) if _DIR_FD else os.lstat(path)
    except FileNotFoundError:
        return None


def _check_target(name: str, fd: int, path: Path) -> None:
    st = _lstat(name, fd, path)
    if st is None:
        return
    if stat.S_ISLNK(st.st_mode):
        raise _refuse_link(path)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, "a folder is there, not a file", str(path))


@contextlib.contextmanager
def _atomic(path: Path, root: Path | None, binary: bool, encoding: str, newline: str | None) -> Iterator[IO[Any]]:
    fd_dir = _open_dir(path.parent, root)
    tmp = ""
    try:
        _check_target(path.name, fd_dir, path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
        for _ in range(16):  # a random name: nothing planted in advance can be hit (O_EXCL refuses what exists)
            tmp = f"{tmp_prefix(path.name)}{secrets.token_hex(6)}.tmp"
            try:
                fd = os.open(tmp, flags, 0o666, dir_fd=fd_dir) if _DIR_FD else os.open(path.parent / tmp, flags, 0o666)
                break
            except FileExistsError:
                continue
        else:  # pragma: no cover - 16 collisions of 48 random bits
            raise LinkedOutputError(f"cannot create a temporary file beside {path}")
        try:
            fh: IO[Any] = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding=encoding, newline=newline)
        except BaseException:
            os.close(fd)
            raise
        with fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        _check_target(path.name, fd_dir, path)  # checked again just before the rename, which never follows a link
        if _DIR_FD:
            os.replace(tmp, path.name, src_dir_fd=fd_dir, dst_dir_fd=fd_dir)
        else:
            os.replace(path.parent / tmp, path)
        tmp = ""
    finally:
        if tmp:
            with contextlib.suppress(OSError):
                if _DIR_FD:
                    os.unlink(tmp, dir_fd=fd_dir)
                else:
                    os.unlink(path.parent / tmp)
        os.close(fd_dir)


@contextlib.contextmanager
def _append(path: Path, root: Path | None, binary: bool, encoding: str, newline: str | None) -> Iterator[IO[Any]]:
    fd_dir = _open_dir(path.parent, root)
    try:
        # O_NONBLOCK: a FIFO planted under the name fails at once (ENXIO) instead of blocking the run
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC | _NONBLOCK
        try:
            if _DIR_FD:
                fd = os.open(path.name, flags, 0o666, dir_fd=fd_dir)
            else:
                check_not_linked(path)
                fd = os.open(path, flags, 0o666)
        except OSError as e:
            st = _lstat(path.name, fd_dir, path)
            if st is not None and stat.S_ISLNK(st.st_mode):
                raise _refuse_link(path) from None
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise LinkedOutputError(f"{path} is not a regular file: medadv appends its log only to a file it "
                                        "wrote; remove it") from None
            raise e
    finally:
        os.close(fd_dir)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LinkedOutputError(f"{path} is not a regular file: medadv appends its log only to a file it wrote; "
                                    "remove it")
        if st.st_nlink > 1:
            raise _refuse_link(path, f"a file with {st.st_nlink} hard links (another name of the same file may be "
                                     "outside the output folder)")
        if _NONBLOCK:
            import fcntl

            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
        fh: IO[Any] = os.fdopen(fd, "ab") if binary else os.fdopen(fd, "a", encoding=encoding, newline=newline)
    except BaseException:
        os.close(fd)
        raise
    with fh:
        yield fh
        fh.flush()
        os.fsync(fh.fileno())


def open_output(path: str | os.PathLike, mode: str = "w", *, root: str | os.PathLike | None = None,
                encoding: str = "utf-8", newline: str | None = None) -> contextlib.AbstractContextManager[IO[Any]]:
    """A file object writing ``path`` without following links (a context manager).

    ``mode`` ``"w"``/``"wb"``: the file is written in full or not at all (a temporary file renamed over ``path``
    when the block ends without an error; an error leaves ``path`` as it was). ``"a"``/``"ab"``: appended, flushed
    to disk when the block ends. ``root``: the output folder; the folders between it and ``path`` are created and
    none of them may be a link. A link (or hard link, for ``"a"``) where medadv would write is refused with
    :class:`LinkedOutputError` before anything is written.
    """
    if mode not in ("w", "wb", "a", "ab"):
        raise ValueError(f"`mode` must be 'w', 'wb', 'a' or 'ab', got {mode!r}")
    p = Path(path)
    r = Path(root) if root is not None else None
    opener = _append if mode.startswith("a") else _atomic
    return opener(p, r, mode.endswith("b"), encoding, newline)


def write_bytes(path: str | os.PathLike, data: bytes, *, root: str | os.PathLike | None = None) -> None:
    """``path`` holds ``data`` (atomically, never through a link: :func:`open_output`)."""
    with open_output(path, "wb", root=root) as fh:
        fh.write(data)


def write_text(path: str | os.PathLike, text: str, *, root: str | os.PathLike | None = None,
               encoding: str = "utf-8", newline: str | None = None) -> None:
    """``path`` holds ``text`` (atomically, never through a link: :func:`open_output`)."""
    with open_output(path, "w", root=root, encoding=encoding, newline=newline) as fh:
        fh.write(text)


def save_figure(fig: Any, path: str | os.PathLike, *, root: str | os.PathLike | None = None, **kwargs: Any) -> None:
    """``fig.savefig`` into memory, then written as :func:`write_bytes` does (matplotlib itself would open the
    path, following a link). The format is the suffix of ``path`` unless ``format`` is given."""
    buf = io.BytesIO()
    kwargs.setdefault("format", Path(path).suffix.lstrip(".").lower() or "png")
    fig.savefig(buf, **kwargs)
    write_bytes(path, buf.getvalue(), root=root)
