"""Where the CLI's commands write: stdout, guarded, and the files named by ``--out``/``-o``/
``--trace``/``--html``, checked before anything runs; and the project's directories a
command defaults to (``project_dir``).

A command writes to stdout as to any stream; the CLI's ``main`` wraps it so that a write or
flush that fails (the reader of a pipe gone, a full disk) raises ``OutputGone``, which no
command's ``except OSError`` (meant for its own files) or ``except Exception`` (a bug said in
one line) takes for something else: ``main`` answers it once for every command.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO, cast


class OutputGone(BaseException):
    """stdout cannot be written (``error`` says why): the command stops there.

    A ``BaseException``, as ``KeyboardInterrupt`` is: it ends the command, and no handler
    of a command's own errors may report it as one of them."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error

    @property
    def broken_pipe(self) -> bool:
        return isinstance(self.error, BrokenPipeError)


class _Guarded:
    """``stream`` whose ``write`` and ``flush`` raise ``OutputGone`` for an ``OSError``."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            raise OutputGone(e) from e

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            raise OutputGone(e) from e

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard(stream: TextIO) -> TextIO:
    return cast(TextIO, _Guarded(stream))


def discard(stream: TextIO) -> None:
    """Point ``stream``'s file descriptor at the null device: what is still buffered, and
    the interpreter's flush at exit, then go nowhere instead of failing again."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # not a file (a test's capture)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


# -- the project's directories ---------------------------------------------------------------


def project_dir(relative: Path, command_file: str) -> Path | None:
    """``relative`` (``examples/scenarios``, ``diagrams``) in the current directory, else in
    the clone of the project the package runs from (the source tree, an editable install),
    found from ``command_file``, a command's module (``agent_runtime/tools/commands/X.py``);
    ``None`` when neither has it. An installed copy has no clone beside it, and a
    site-packages holding some other project's ``relative`` is not ours: a clone is where
    pyproject.toml is."""
    if relative.is_dir():
        return relative
    clone = Path(command_file).resolve().parents[3]
    if (clone / "pyproject.toml").is_file() and (clone / relative).is_dir():
        return clone / relative
    return None


# -- output files --------------------------------------------------------------------------------


def unwritable(path: str | Path) -> str | None:
    """Why a file could not be written at ``path`` (what ``open`` would say once the missing
    directories are made, as ``write_file`` makes them), found without leaving anything
    behind; ``None`` when it can be. A link is judged by the file it leads to."""
    p = Path(path)
    if _loops(p):  # exists() and is_dir() say False for a link loop
        return os.strerror(errno.ELOOP)
    if p.is_dir():
        return os.strerror(errno.EISDIR)
    if p.exists():
        return None if os.access(p, os.W_OK) else os.strerror(errno.EACCES)
    if p.is_symlink():  # to no file yet: the file is made where it leads
        p = Path(os.path.realpath(p))
        if not p.parent.is_dir():  # open() makes no directory for a link's file
            return os.strerror(errno.ENOENT)
    if not_a_directory(p.parent) is not None:
        return os.strerror(errno.ENOTDIR)
    if (link := dangling_link(p.parent)) is not None:
        return f"{link} is a link to {os.readlink(link)}, which is not there"
    # a file made and removed at once where the first missing directory would be made:
    # permissions say nothing of /proc, /sys, a read-only mount, where even root cannot
    existing = next(d for d in p.parents if d.exists())
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=f".{p.name}.", suffix=".tmp")
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    os.unlink(probe)
    return None


def dangling_link(p: Path) -> Path | None:
    """The link among ``p`` and the parents to be made for it that leads nowhere, if any:
    no directory can be made there (``mkdir`` says "File exists")."""
    for d in (p, *p.parents):
        if d.exists():
            return None
        if d.is_symlink():
            return d
    return None


def _loops(link: Path) -> bool:
    try:
        os.stat(link)
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` name one file (the same path, a link, a hard link)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet), or is a link loop
        # realpath, not Path.resolve: that raises RuntimeError on a link loop
        return os.path.realpath(a) == os.path.realpath(b)


def not_a_directory(out: Path) -> Path | None:
    """The existing file that stands where ``out`` or one of its parents would be a
    directory, if any."""
    for p in (out, *out.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def check_directory(out: Path, names: list[str] | None = None) -> str | None:
    """Why the files ``names`` could not be written in the directory ``out`` (made if
    missing), if they could not: a file where a directory is needed, a directory where a
    file would be written, a parent that cannot be written. ``names`` ``None``: ``out`` is
    only read, and only a file standing where it would be is a reason."""
    blocker = not_a_directory(out)
    if blocker is not None:
        return "not a directory" + ("" if blocker == out else f" ({blocker} is a file)")
    if (link := dangling_link(out)) is not None:
        if _loops(link):  # it does lead somewhere: back to itself
            return os.strerror(errno.ELOOP) + ("" if link == out else f" ({link})")
        where = "" if link == out else f"{link} is "
        return f"{where}a link to {os.readlink(link)}, which is not there"
    if names is None:
        return None
    for name in names:
        target = out / name
        if target.is_symlink() and not Path(os.path.realpath(target)).parent.is_dir():
            return f"{target} is a link into a directory that is not there ({os.readlink(target)})"
        if target.exists() and not target.is_file():
            return (
                f"{target} is a directory, not a file"
                if target.is_dir()
                else (f"{target} is not a regular file")
            )
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        return os.strerror(errno.EACCES) + (f" ({existing})" if existing != out else "")
    return None


def write_file(path: str | Path, text: str) -> None:
    """Write ``text`` to the file ``path``, whole or not at all: to a temporary file beside
    it first, renamed into place once written, so a write that fails (a full disk) leaves
    no half-written file and whatever was at ``path`` as it was. Missing directories are
    made (and removed again when the write fails). A link's target is the file replaced,
    its permissions kept. Written as it is: a device or a FIFO (``/dev/stdout``), and a
    file its user may write in a directory they may not. Raises ``OSError`` naming
    ``path``."""
    p = Path(path)
    made = _missing(p.parent)
    done = False
    try:
        with _naming(p):
            p.parent.mkdir(parents=True, exist_ok=True)
            mode = _mode(p)
            staged: tuple[str, Path] | None = None
            if mode is None or stat.S_ISREG(mode):
                try:
                    staged = _staged(p, text, mode)
                except PermissionError:
                    if mode is None:
                        raise
            if staged is None:
                with open(p, "w", encoding="utf-8") as fh:
                    fh.write(text)
            else:
                tmp, target = staged
                try:
                    os.replace(tmp, target)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
        done = True
    finally:
        if not done:
            _unmake(made)


def write_all(out: Path, files: Mapping[str, str]) -> list[Path]:
    """Write every ``NAME: text`` in ``files`` to ``out/NAME`` (``out`` made if missing), all
    or none: each is written to a temporary file beside it first, and only when every one is
    written are they renamed into place (the directories made for them are removed again
    when one fails). A link's target is the file replaced, its permissions kept, as
    ``write_file``'s. Returns the paths written; raises ``OSError`` naming one of them."""
    made = _missing(out)
    staged: list[tuple[str, Path]] = []
    done = False
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            with _naming(out / name):
                staged.append(_staged(out / name, text, _mode(out / name)))
        for (tmp, target), name in zip(staged, files, strict=True):
            with _naming(out / name):
                os.replace(tmp, target)
        done = True
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if not done:
            _unmake(made)
    return [out / name for name in files]


def _staged(path: Path, text: str, mode: int | None) -> tuple[str, Path]:
    """``text`` in a temporary file beside the file ``path`` leads to, with ``mode``'s
    permissions (a new file's, ``None``, as ``open`` makes them, not mkstemp's 0600).
    Returns the temporary file and the file it is to replace; raises ``OSError``."""
    target = Path(os.path.realpath(path))
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with open(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fd, stat.S_IMODE(mode) if mode is not None else 0o666 & ~_umask())
            fh.write(text)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp, target


def _mode(path: Path) -> int | None:
    """The mode of the file ``path`` leads to; ``None`` when there is none yet."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    """An ``OSError`` raised inside names ``path``, the file the user asked for, never a
    temporary file of ours."""
    try:
        yield
    except OSError as e:
        e.filename, e.filename2 = str(path), None
        raise


def _missing(d: Path) -> list[Path]:
    """``d`` and its parents that are not there, the deepest first."""
    return [p for p in (d, *d.parents) if not p.exists()]


def _unmake(made: list[Path]) -> None:
    for p in made:  # the deepest first; one that holds something else stays
        with contextlib.suppress(OSError):
            p.rmdir()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
