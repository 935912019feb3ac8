import json
import random
import shutil
import struct
import subprocess

import pytest

from lightning_sidecar_client.js_json import dumps, js_number

CASES = [
    (1.0, '1'), (0.5, '0.5'), (-0.0, '0'), (0, '0'), (-3, '-3'), (1e21, '1e+21'), (1e20, '100000000000000000000'),
    (123456789012345680000.0, '123456789012345680000'), (1e-7, '1e-7'), (1.5e-7, '1.5e-7'), (0.000001, '0.000001'),
    (1.2345e-6, '0.0000012345'), (-1.7976931348623157e308, '-1.7976931348623157e+308'), (5e-324, '5e-324'),
    (0.1 + 0.2, '0.30000000000000004'), (2**53, '9007199254740992'), (2**60, '1152921504606847000'), (12.0, '12'),
    (float('nan'), 'null'), (float('inf'), 'null'), (-2.5e-5, '-0.000025'), (1.25e22, '1.25e+22'),
]


@pytest.mark.parametrize('value,text', CASES)
def test_numbers_are_written_as_javascript_writes_them(value, text):
    assert js_number(value) == text


def test_strings_keep_non_ascii_and_escape_controls_and_lone_surrogates_like_json_stringify():
    assert dumps('é€😀') == '"é€😀"'
    assert dumps('a"b\\c\n\t\x01\x7f\u2028') == '"a\\"b\\\\c\\n\\t\\u0001\x7f\u2028"'
    assert dumps(json.loads('"\\ud800x"')) == '"\\ud800x"'


def test_containers_have_no_whitespace_and_keep_key_order():
    assert dumps({'b': [1, 2.0, None, True], 'a': {'x': 'y'}, 'c': []}) == '{"b":[1,2,null,true],"a":{"x":"y"},"c":[]}'


@pytest.mark.skipif(shutil.which('node') is None, reason='node is not installed: no cross-check with JSON.stringify')
def test_random_doubles_and_strings_match_node_json_stringify():
    rng = random.Random(7)
    values = [struct.unpack('<d', rng.getrandbits(64).to_bytes(8, 'little'))[0] for _ in range(3000)]
    values += [rng.uniform(-5, 0) for _ in range(1000)] + [rng.random() * 10 ** rng.randint(-12, 25) for _ in range(1000)]
    values = [v for v in values if v == v and abs(v) != float('inf')]
    strings = [''.join(chr(rng.choice([rng.randint(0, 0x7f), rng.randint(0x80, 0xffff), rng.randint(0x10000, 0x10ffff)])) for _ in range(20)) for _ in range(200)]
    payload = {'numbers': values, 'strings': strings}
    # Node parses the same doubles from Python's repr (shortest round-trip) and writes them back.
    text = '{"numbers":[' + ','.join(repr(v) for v in values) + '],"strings":' + json.dumps(strings) + '}'
    out = subprocess.run(['node', '-e', 'let s="";process.stdin.on("data",c=>s+=c).on("end",()=>process.stdout.write(JSON.stringify(JSON.parse(s))))'],
                         input=text.encode(), capture_output=True, check=True)
    assert dumps(payload) == out.stdout.decode('utf-8', 'surrogatepass')
