"""JSON text byte-for-byte as JavaScript's ``JSON.stringify`` writes it.

The Node ``groups`` command and this package must print identical group lines, so numbers follow
ECMAScript's Number::toString (``1`` not ``1.0``, ``1e-7`` not ``1e-07``, ``1e+21`` from 21
digits on), strings are escaped as ECMAScript's well-formed ``JSON.stringify`` does (non-ASCII kept,
lone surrogates as ``\\udxxx``), and there is no whitespace.
"""
from __future__ import annotations

import math
import re
from typing import Any

_ESCAPES = {'"': '\\"', '\\': '\\\\', '\b': '\\b', '\f': '\\f', '\n': '\\n', '\r': '\\r', '\t': '\\t'}
_NEEDS_ESCAPE = re.compile('[\x00-\x1f"\\\\\ud800-\udfff]')


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    return _ESCAPES.get(c) or '\\u%04x' % ord(c)


def js_string(s: str) -> str:
    # A Python str holds a surrogate code point only when it is lone (a JSON pair decodes to one
    # astral character), and ECMAScript escapes exactly the lone ones.
    return '"' + _NEEDS_ESCAPE.sub(_escape, s) + '"'


def js_number(x: float | int) -> str:
    """ECMAScript Number::toString of ``x`` (as a double)."""
    if isinstance(x, int):
        if abs(x) < 10**21:
            return str(x) if abs(x) <= 2**53 else js_number(float(x))
        x = float(x)
    if math.isnan(x) or math.isinf(x):
        return 'null'
    if x == 0:
        return '0'
    text = repr(x)  # the shortest digits that round-trip, as ECMAScript asks for
    sign = ''
    if text[0] == '-':
        sign, text = '-', text[1:]
    mantissa, _, exp = text.partition('e')
    whole, _, frac = mantissa.partition('.')
    digits = whole + frac
    stripped = digits.lstrip('0')
    # value = 0.<digits> × 10^n
    n = len(whole) + (int(exp) if exp else 0) - (len(digits) - len(stripped))
    digits = stripped.rstrip('0')
    k = len(digits)
    if k <= n <= 21:
        body = digits + '0' * (n - k)
    elif 0 < n <= 21:
        body = digits[:n] + '.' + digits[n:]
    elif -6 < n <= 0:
        body = '0.' + '0' * -n + digits
    else:
        e = n - 1
        body = (digits if k == 1 else digits[0] + '.' + digits[1:]) + 'e' + ('+' if e >= 0 else '-') + str(abs(e))
    return sign + body


def dumps(value: Any) -> str:
    """``JSON.stringify(value)`` for dicts, lists, tuples, str, int, float, bool and None.

    Dict keys keep their insertion order, as object keys do in JavaScript for non-index keys.
    """
    out: list[str] = []
    _write(value, out)
    return ''.join(out)


def _write(v: Any, out: list[str]) -> None:
    if v is None:
        out.append('null')
    elif v is True:
        out.append('true')
    elif v is False:
        out.append('false')
    elif isinstance(v, str):
        out.append(js_string(v))
    elif isinstance(v, (int, float)):
        out.append(js_number(v))
    elif isinstance(v, dict):
        out.append('{')
        first = True
        for k, item in v.items():
            if not first:
                out.append(',')
            first = False
            out.append(js_string(str(k)))
            out.append(':')
            _write(item, out)
        out.append('}')
    elif isinstance(v, (list, tuple)):
        out.append('[')
        for i, item in enumerate(v):
            if i:
                out.append(',')
            _write(item, out)
        out.append(']')
    elif hasattr(v, 'tolist'):  # numpy arrays and scalars
        _write(v.tolist(), out)
    else:
        raise TypeError(f'js_json: cannot serialise {type(v).__name__}')
