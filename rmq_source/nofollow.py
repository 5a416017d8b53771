"""File access below a folder that other users may write to, never through a symlink.

A consumer group's state folder (``offsetStorePath``) is shared by every query of the group, maybe
on a shared file system, so anyone allowed to write there could plant a symlink named like one of
our files (or like a temporary file we are about to create) and make us truncate and overwrite any
file our user can write. The rules here:

* ``root`` is the folder the user configured: it, and the path leading to it, are trusted and may be
  symlinks (operators move folders to other disks). Everything *below* it is reached from an open
  descriptor of ``root``, one name at a time, with ``O_NOFOLLOW``: a symlink at any level (a
  sub-folder such as ``<brokerName>``, the file, a lock file, a backup) is refused with the caller's
  error class naming the path and the link's target, and so is anything that is not a regular file
  (a FIFO would block the open) or, for a folder, not a folder.
* New content is written to a temporary file created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under an
  unpredictable name (``.<name>.<random>.tmp``), fsynced, then renamed over the file inside the same
  open folder, and the folder is fsynced: a reader sees the old or the new content, a crash leaves
  one of the two (plus, at worst, an orphaned temporary file, which nothing reads).
* The only file written in place, by appending (a log), must also have a single hard link.
* Renaming never follows a symlink at the destination either, but a destination that is one is
  still refused: it means someone is tampering with the folder.

Errors: a refusal raises ``error_cls`` (one of the package's classes). Any other ``OSError`` (missing
permission, I/O error) propagates unchanged for the caller to wrap with its own context.
"""
from __future__ import annotations

import errno
import os
import secrets
import stat
from contextlib import contextmanager
from typing import Iterator

from rmq_source.errors import RmqSourceError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# O_NONBLOCK keeps the open of a planted FIFO from blocking; it changes nothing for regular files.
_FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_TEMP_ATTEMPTS = 100


def _split(path: str | os.PathLike, root: str | os.PathLike | None) -> tuple[str, list[str], str]:
    """(root, folder names below root, file name) of ``path``; ``root`` defaults to its folder."""
    path = os.path.abspath(os.fspath(path))
    root = os.path.dirname(path) if root is None else os.path.abspath(os.fspath(root))
    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    if any(p in ("", os.curdir, os.pardir) for p in parts):
        raise ValueError(f"{path} is not a file below {root}")
    return root, parts[:-1], parts[-1]


class Folder:
    """An open folder below ``root``; every name in it is opened without following symlinks."""

    def __init__(self, fd: int, path: str, root: str, error_cls: type[RmqSourceError]):
        self.fd = fd
        self.path = path
        self.root = root
        self.error_cls = error_cls

    def path_of(self, name: str) -> str:
        return os.path.join(self.path, name)

    def lstat(self, name: str) -> os.stat_result | None:
        """The entry ``name`` itself (a link is not followed), or None when there is none."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def refusal(self, name: str, *, folder: bool = False) -> RmqSourceError | None:
        """The error for ``name`` when it is a symlink or not the kind of entry expected, else None."""
        st = self.lstat(name)
        if st is None:
            return None
        shown = self.path_of(name)
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(name, dir_fd=self.fd)
            except OSError:
                target = "?"
            return self.error_cls(
                f"{shown} is a symlink (to {target}); refusing to follow it: below the state folder "
                f"{self.root} only real folders and regular files are used, since a link planted "
                "there could make this process overwrite any file its user can write; remove the link")
        if folder and not stat.S_ISDIR(st.st_mode):
            return self.error_cls(f"{shown} is not a folder; refusing to use it as one")
        if not folder and not stat.S_ISREG(st.st_mode):
            return self.error_cls(f"{shown} is not a regular file; refusing to open it")
        return None

    def check(self, name: str) -> None:
        """Raise unless ``name`` is absent or a regular file."""
        problem = self.refusal(name)
        if problem is not None:
            raise problem

    def open(self, name: str, flags: int, mode: int = 0o666) -> int:
        """``os.open`` of a regular file ``name`` in this folder, never through a symlink."""
        try:
            fd = os.open(name, flags | _FILE_FLAGS, mode, dir_fd=self.fd)
        except OSError:
            problem = self.refusal(name)
            if problem is not None:
                raise problem from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise self.error_cls(f"{self.path_of(name)} is not a regular file; refusing to open it")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, name: str) -> bytes | None:
        """Whole content of ``name``, or None when it does not exist."""
        try:
            fd = self.open(name, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            chunks = []
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
        finally:
            os.close(fd)

    def append(self, name: str, data: bytes) -> None:
        """Append ``data`` to ``name`` (created if missing) with ``O_APPEND`` writes; not fsynced.

        A file with more than one hard link is refused too: the only file written in place, it
        must not be another file under a second name."""
        fd = self.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            links = os.fstat(fd).st_nlink
            if links > 1:
                raise self.error_cls(
                    f"{self.path_of(name)} has {links} hard links; refusing to append to it: below "
                    f"the state folder {self.root} files are never shared with other names, since "
                    "a planted link could make this process write into any file its user can write")
            _write_all(fd, data)
        finally:
            os.close(fd)

    def write_temp(self, name: str, data: bytes) -> str:
        """Create a new, unpredictably named temporary file for ``name`` holding ``data`` (fsynced);
        returns its name. ``O_EXCL`` makes the create fail rather than open anything that exists."""
        for _ in range(_TEMP_ATTEMPTS):
            tmp = f".{name}.{secrets.token_hex(8)}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o666,
                             dir_fd=self.fd)
            except FileExistsError:
                continue
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except BaseException:
                os.close(fd)
                self.unlink(tmp)
                raise
            os.close(fd)
            return tmp
        raise FileExistsError(errno.EEXIST, f"no free temporary name for {self.path_of(name)}")

    def replace(self, src: str, dst: str) -> None:
        """Rename ``src`` over ``dst`` inside this folder (``dst`` must not be a symlink)."""
        self.check(dst)
        os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        """Remove ``name`` if it exists (a symlink is removed, never followed)."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass

    def sync(self) -> None:
        """fsync the folder, so that renames in it survive a crash."""
        try:
            os.fsync(self.fd)
        except OSError as exc:  # some file systems refuse fsync on a folder; the rename still stands
            if exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
                raise

    def write_atomic(self, name: str, data: bytes) -> None:
        """Replace ``name`` with ``data``: temporary file, fsync, rename, folder fsync."""
        tmp = self.write_temp(name, data)
        try:
            self.replace(tmp, name)
        except BaseException:
            self.unlink(tmp)
            raise
        self.sync()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@contextmanager
def folder(path: str | os.PathLike, *, root: str | os.PathLike | None = None, create: bool,
           error_cls: type[RmqSourceError]) -> Iterator[Folder | None]:
    """Open the folder ``path`` (``root`` itself or a folder below it), walking down from ``root``
    without following symlinks. ``create`` makes missing folders (``root`` with its parents);
    otherwise a missing folder yields None."""
    path = os.path.abspath(os.fspath(path))
    root = path if root is None else os.path.abspath(os.fspath(root))
    parts = [] if path == root else _split(os.path.join(path, "x"), root)[1]
    try:
        fd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        if not create:
            yield None
            return
        os.makedirs(root, exist_ok=True)
        fd = os.open(root, _DIR_FLAGS)
    current = Folder(fd, root, root, error_cls)
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, 0o777, dir_fd=current.fd)
                except FileExistsError:
                    pass
            try:
                sub = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=current.fd)
            except FileNotFoundError:
                if create:
                    raise
                os.close(current.fd)
                current = None
                break
            except OSError:
                problem = current.refusal(part, folder=True)
                if problem is not None:
                    raise problem from None
                raise
            os.close(current.fd)
            current = Folder(sub, current.path_of(part), root, error_cls)
        yield current
    finally:
        if current is not None:
            os.close(current.fd)


# -- one-call helpers on a file path ---------------------------------------------------------------

def read_file(path: str | os.PathLike, *, root: str | os.PathLike | None = None,
              error_cls: type[RmqSourceError]) -> bytes | None:
    """Content of the regular file ``path`` below ``root`` (default: its folder), or None if absent."""
    root, parts, name = _split(path, root)
    with folder(os.path.join(root, *parts), root=root, create=False, error_cls=error_cls) as d:
        return None if d is None else d.read(name)


def write_file_atomic(path: str | os.PathLike, data: bytes, *, root: str | os.PathLike | None = None,
                      error_cls: type[RmqSourceError]) -> None:
    """Replace ``path`` below ``root`` with ``data`` (:meth:`Folder.write_atomic`); creates folders."""
    root, parts, name = _split(path, root)
    with folder(os.path.join(root, *parts), root=root, create=True, error_cls=error_cls) as d:
        d.write_atomic(name, data)


def append_file(path: str | os.PathLike, data: bytes, *, root: str | os.PathLike | None = None,
                error_cls: type[RmqSourceError]) -> None:
    """Append ``data`` to ``path`` below ``root`` (:meth:`Folder.append`); creates folders."""
    root, parts, name = _split(path, root)
    with folder(os.path.join(root, *parts), root=root, create=True, error_cls=error_cls) as d:
        d.append(name, data)


def open_file(path: str | os.PathLike, flags: int, *, root: str | os.PathLike | None = None,
              error_cls: type[RmqSourceError]) -> int:
    """A descriptor of the regular file ``path`` below ``root`` (:meth:`Folder.open`); with
    ``O_CREAT`` in ``flags`` missing folders are created too. The caller closes it."""
    root, parts, name = _split(path, root)
    with folder(os.path.join(root, *parts), root=root, create=bool(flags & os.O_CREAT),
                error_cls=error_cls) as d:
        if d is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", os.fspath(path))
        return d.open(name, flags)


def file_size(path: str | os.PathLike, *, root: str | os.PathLike | None = None,
              error_cls: type[RmqSourceError]) -> int | None:
    """Size of the regular file ``path`` below ``root``, or None when it does not exist."""
    root, parts, name = _split(path, root)
    with folder(os.path.join(root, *parts), root=root, create=False, error_cls=error_cls) as d:
        if d is None:
            return None
        d.check(name)
        st = d.lstat(name)
        return None if st is None else st.st_size


def rename_file(path: str | os.PathLike, new_name: str, *, root: str | os.PathLike | None = None,
                error_cls: type[RmqSourceError]) -> None:
    """Rename the regular file ``path`` to ``new_name`` in the same folder (neither may be a link)."""
    root, parts, name = _split(path, root)
    with folder(os.path.join(root, *parts), root=root, create=False, error_cls=error_cls) as d:
        if d is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", os.fspath(path))
        d.check(name)
        d.replace(name, new_name)


def ensure_folder(path: str | os.PathLike, *, root: str | os.PathLike,
                  error_cls: type[RmqSourceError]) -> None:
    """Create the folder ``path`` below ``root`` (and ``root``) if missing, never through a link."""
    with folder(path, root=root, create=True, error_cls=error_cls):
        pass
