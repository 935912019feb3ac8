"""Which groups are done, kept across restarts: the output file's lines and a state file's.

Each output line and each state line is a JSON object with a ``uid``; a torn last line (a crash
mid-write) is not a record. Lines are fsync'd before offsets move, so a restart never emits a
group twice.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Iterable

from . import js_json


def load_done(paths: Iterable[str | os.PathLike[str] | None]) -> set[str]:
    done: set[str] = set()
    for path in paths:
        if not path or not os.path.exists(path):
            continue
        with open(path, 'rb') as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    o = json.loads(line)
                except ValueError:
                    continue
                if isinstance(o, dict) and isinstance(o.get('uid'), str):
                    done.add(o['uid'])
    return done


def iso_now() -> str:
    """The time as JavaScript's ``Date.prototype.toISOString`` writes it (milliseconds, ``Z``)."""
    now = datetime.now(timezone.utc)
    return now.strftime('%Y-%m-%dT%H:%M:%S.') + f'{now.microsecond // 1000:03d}Z'


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Appends one line and fsyncs it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        data = (line + '\n').encode('utf-8')
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)


def remember(path: str | os.PathLike[str], uid: str, status: str) -> None:
    append_line(path, js_json.dumps({'uid': uid, 'status': status, 'at': iso_now()}))
