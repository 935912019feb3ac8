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
        if path:
            done.update(load_listed(path))
    return done


def load_listed(path: str | os.PathLike[str]) -> dict[str, str]:
    """The groups a state or output file lists, uid to ``'emitted'`` or ``'incomplete'`` (given up
    on); none when it does not exist. An output file's lines (groups, no status) count as emitted,
    and so does a uid listed both ways."""
    listed: dict[str, str] = {}
    if not os.path.exists(path):
        return listed
    with open(path, 'rb') as f:
        for line in f:
            if not line.strip():
                continue
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if isinstance(o, dict) and isinstance(o.get('uid'), str):
                status = 'incomplete' if o.get('status') == 'incomplete' else 'emitted'
                if listed.get(o['uid']) != 'emitted':
                    listed[o['uid']] = status
    return listed


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
