"""The broker's JSON config files (``config/*.json``): tolerant parsing, safe loading and atomic writing.

The broker serialises these files with fastjson 1.x, which writes the keys of integer-keyed maps
without quotes (``{0:317,1:142}``, format doc §10.1). :func:`parse_fastjson` accepts that; such keys
come back as Python ``int``. :func:`dump_fastjson` writes the broker's shape back.

Loading follows the broker's fallback (§10.3): the main file, else ``<file>.bak`` when the main one is
missing, empty or torn; a 4.9.3 broker renames ``<file>.tmp`` over the main file, so when the main file
is missing ``<file>.tmp`` is the newest complete version and is tried first.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from rmq_source import nofollow
from rmq_source.errors import RmqConfigFileError, RmqSourceError, RmqStoreLayoutError

TOPIC_GROUP_SEPARATOR = "@"

# A JSON string literal (skipped untouched) or a bare integer in key position (captured). Strings are
# matched first so a ",12:" inside a string value is never rewritten.
_STRING_OR_BARE_KEY = re.compile(r'"(?:[^"\\]|\\.)*"|([{,]\s*)(-?\d+)(\s*:)', re.S)
# Bare keys are re-quoted with this prefix so the object hook can tell them from quoted keys. A real
# quoted key would need a NUL character to collide, which fastjson never writes in a key.
_INT_KEY_MARK = "\x00"


def _quote_bare_keys(text: str) -> str:
    def repl(m: re.Match) -> str:
        if m.group(2) is None:
            return m.group(0)
        return f'{m.group(1)}"\\u0000{m.group(2)}"{m.group(3)}'
    return _STRING_OR_BARE_KEY.sub(repl, text)


def _object_hook(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key.startswith(_INT_KEY_MARK):
            key = int(key[1:])
        out[key] = value
    return out


def parse_fastjson(text: str) -> Any:
    """Parse fastjson output, including maps whose integer keys are written without quotes.

    Bare integer keys become ``int``; quoted keys stay ``str``. Raises :class:`ValueError`
    (``json.JSONDecodeError``) on anything else that is not JSON.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_fastjson expects str, got {type(text).__name__}")
    return json.loads(_quote_bare_keys(text), object_pairs_hook=_object_hook)


def _read_candidate(path: Path, root: str | os.PathLike | None,
                    error_cls: type[RmqSourceError]) -> bytes | None:
    """Bytes of ``path``, None when absent; below ``root``, never through a symlink."""
    if root is None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
    return nofollow.read_file(path, root=root, error_cls=error_cls)


def load_config_json(path: str | os.PathLike, *, root: str | os.PathLike | None = None,
                     error_cls: type[RmqSourceError] = RmqStoreLayoutError) -> Any | None:
    """Load a broker config file with the broker's fallback.

    Tries the main file; when it is missing, empty (only whitespace) or not parseable, tries
    ``<file>.tmp`` (first, if the main file is missing) and ``<file>.bak``. Returns the parsed object,
    or ``None`` when no candidate file holds any content (the broker then starts with an empty table).
    Raises :class:`RmqConfigFileError` naming every file and its problem when at least one candidate
    has content but none parses.

    With ``root`` (a folder above ``path`` that others may write to), no candidate and no folder
    below ``root`` is opened through a symlink: one raises ``error_cls`` naming it.
    """
    path = Path(path)
    problems: list[str] = []
    main_exists = False
    candidates = [path]
    while candidates:
        candidate = candidates.pop(0)
        try:
            raw = _read_candidate(candidate, root, error_cls)
        except RmqSourceError:
            raise
        except OSError as exc:
            raw, exists = None, True
            problems.append(f"{candidate}: cannot read ({exc.strerror or exc})")
        else:
            exists = raw is not None
        if candidate == path:
            main_exists = exists
            bak = path.with_name(path.name + ".bak")
            tmp = path.with_name(path.name + ".tmp")
            # A stale .tmp next to a readable main file is older than or equal to it (4.9.3 renames
            # .tmp only after copying main to .bak); keep it as a last resort only.
            candidates = [bak, tmp] if main_exists else [tmp, bak]
        if raw is None or not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(f"{candidate}: not UTF-8 at byte {exc.start}")
            continue
        try:
            return parse_fastjson(text)
        except ValueError as exc:
            problems.append(f"{candidate}: not valid JSON ({exc})")
    if problems:
        raise RmqConfigFileError("cannot load config file " + str(path) + ": " + "; ".join(problems))
    return None


def _dump(obj: Any, indent: int, out: list[str]) -> None:
    if isinstance(obj, dict):
        if not obj:
            out.append("{}")
            return
        pad = "\t" * (indent + 1)
        if all(isinstance(k, int) and not isinstance(k, bool) for k in obj):
            # fastjson pretty mode breaks lines only before String keys: {0:1,1:2\n<indent>}
            out.append("{")
            first = True
            for key, value in obj.items():
                if not first:
                    out.append(",")
                first = False
                out.append(str(key))
                out.append(":")
                _dump(value, indent + 1, out)
            out.append("\n" + "\t" * indent + "}")
            return
        out.append("{")
        first = True
        for key, value in obj.items():
            if not first:
                out.append(",")
            first = False
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                raise TypeError(f"dump_fastjson: map key {key!r} is neither str nor int")
            out.append("\n" + pad)
            out.append(str(key) if isinstance(key, int) else json.dumps(key, ensure_ascii=False))
            out.append(":")
            _dump(value, indent + 1, out)
        out.append("\n" + "\t" * indent + "}")
        return
    if isinstance(obj, (list, tuple)):
        if not obj:
            out.append("[]")
            return
        pad = "\t" * (indent + 1)
        out.append("[")
        for i, value in enumerate(obj):
            if i:
                out.append(",")
            out.append("\n" + pad)
            _dump(value, indent + 1, out)
        out.append("\n" + "\t" * indent + "]")
        return
    if obj is None or isinstance(obj, (bool, str)):
        out.append(json.dumps(obj, ensure_ascii=False))
        return
    if isinstance(obj, int):
        out.append(str(obj))
        return
    if isinstance(obj, float):
        out.append(json.dumps(obj, allow_nan=False))
        return
    raise TypeError(f"dump_fastjson: cannot serialise {type(obj).__name__}")


def dump_fastjson(obj: Any) -> str:
    """Serialise ``obj`` the way the broker's fastjson pretty mode does.

    Tabs for indentation, no space after ``:``, no trailing newline; maps whose keys are all ``int``
    are written with bare keys on one line (``{0:317,1:142\\n\\t\\t}``). The result is readable by
    :func:`parse_fastjson` and by the broker.
    """
    out: list[str] = []
    _dump(obj, 0, out)
    return "".join(out)


def _parses(raw: bytes) -> bool:
    try:
        parse_fastjson(raw.decode("utf-8"))
        return True
    except ValueError:       # includes UnicodeDecodeError and JSONDecodeError
        return False


def write_config_atomic(path: str | os.PathLike, text: str, *, root: str | os.PathLike | None = None,
                        error_cls: type[RmqSourceError] = RmqStoreLayoutError) -> None:
    """Replace ``path`` with ``text`` (UTF-8) so that a reader never sees a torn or missing file.

    Steps: write a new temp file in the same directory, created exclusively under an unpredictable
    name, and fsync it; copy the current content (if any, and only if it parses) to ``<file>.bak``
    the same way (temp + rename, so the .bak is never torn either); ``os.replace`` the temp file
    over ``path``; fsync the directory. Creates the directory if needed.

    Nothing is opened through a symlink: not the file, its ``.bak``, nor any folder between ``root``
    (default: the file's own folder, which is trusted) and the file; one raises ``error_cls``
    naming it (:mod:`rmq_source.nofollow`).
    """
    path = Path(path)
    if not isinstance(text, str):
        raise TypeError(f"write_config_atomic expects str text, got {type(text).__name__}")
    bak = path.name + ".bak"
    with nofollow.folder(path.parent, root=root, create=True, error_cls=error_cls) as folder:
        folder.check(bak)
        tmp = folder.write_temp(path.name, text.encode("utf-8"))
        try:
            previous = folder.read(path.name)
            if previous and _parses(previous):   # never replace a good .bak with a torn file
                bak_tmp = folder.write_temp(bak, previous)
                try:
                    folder.replace(bak_tmp, bak)
                except BaseException:
                    folder.unlink(bak_tmp)
                    raise
            folder.replace(tmp, path.name)
        except BaseException:
            folder.unlink(tmp)
            raise
        folder.sync()


def _config_path(store_root: str | os.PathLike, name: str) -> Path:
    return Path(store_root) / "config" / name


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_group_offset(offset: int, path: str | os.PathLike, key: str, qid: Any) -> int:
    """A committed group offset read from ``path`` must be a queue offset that can exist.

    Queue offsets are 0 or more and a unit's ConsumeQueue address (``offset * 20``) is a 64-bit
    integer, so anything outside ``[0, MAX_QUEUE_OFFSET]`` is damage or a foreign tool's value:
    :class:`RmqConfigFileError` names the file, the entry and the valid range (instead of a later
    "beyond the queue's max offset" that blames the queue).
    """
    from rmq_source.store.native import MAX_QUEUE_OFFSET
    if not 0 <= offset <= MAX_QUEUE_OFFSET:
        raise RmqConfigFileError(
            f"{path}: {key!r} queue {qid} has offset {offset}, which is not a queue offset: "
            f"expected an integer in [0, {MAX_QUEUE_OFFSET}] (the next queue offset to consume)")
    return offset


def read_consumer_offsets(store_root: str | os.PathLike) -> dict[tuple[str, str], dict[int, int]]:
    """Consumer offsets of ``<store_root>/config/consumerOffset.json`` (§10.1).

    Returns ``{(topic, group): {queueId: offset}}`` where an offset is the next queue offset to
    consume. ``"topic@group"`` keys are split at the first ``@`` (topic names cannot contain it). An
    absent file gives ``{}``; a file whose content is not the broker's shape raises
    :class:`RmqConfigFileError`.
    """
    path = _config_path(store_root, "consumerOffset.json")
    data = load_config_json(path)
    if data is None:
        return {}
    table = data.get("offsetTable") if isinstance(data, dict) else None
    if table is None and isinstance(data, dict) and "offsetTable" not in data:
        return {}
    if not isinstance(table, dict):
        raise RmqConfigFileError(f"{path}: 'offsetTable' is not an object")
    result: dict[tuple[str, str], dict[int, int]] = {}
    for key, queues in table.items():
        if not isinstance(key, str) or TOPIC_GROUP_SEPARATOR not in key:
            raise RmqConfigFileError(f"{path}: offsetTable key {key!r} is not 'topic@group'")
        topic, group = key.split(TOPIC_GROUP_SEPARATOR, 1)
        if not topic or not group:
            raise RmqConfigFileError(f"{path}: offsetTable key {key!r} has an empty topic or group")
        if not isinstance(queues, dict):
            raise RmqConfigFileError(f"{path}: offsets of {key!r} are not an object")
        offsets: dict[int, int] = {}
        for qid, offset in queues.items():
            if isinstance(qid, str):
                try:
                    qid = int(qid)
                except ValueError:
                    raise RmqConfigFileError(f"{path}: {key!r} has queue id {qid!r}") from None
            if not _is_int(qid) or not _is_int(offset):
                raise RmqConfigFileError(f"{path}: {key!r} has entry {qid!r}: {offset!r}, "
                                         "expected integer queue id and offset")
            check_group_offset(offset, path, key, qid)
            offsets[qid] = offset
        result[(topic, group)] = offsets
    return result


def read_topics(store_root: str | os.PathLike) -> dict[str, dict]:
    """``topicConfigTable`` of ``<store_root>/config/topics.json`` (§11): topic -> TopicConfig fields.

    An absent file gives ``{}``; a malformed one raises :class:`RmqConfigFileError`.
    """
    path = _config_path(store_root, "topics.json")
    data = load_config_json(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RmqConfigFileError(f"{path}: top level is not an object")
    table = data.get("topicConfigTable", {})
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise RmqConfigFileError(f"{path}: 'topicConfigTable' is not an object of objects")
    return table
