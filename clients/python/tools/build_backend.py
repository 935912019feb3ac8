"""The package's build backend (PEP 517 and PEP 660), standard library only.

So that ``pip install ./clients/python`` needs nothing from a package index: pip's isolated build
environment gets no setuptools or wheel to download, and nothing runs protoc (the protobuf classes
are committed, see regen_proto.py). The package is pure Python: a wheel is its files plus the
metadata of pyproject.toml's ``[project]`` table.
"""
from __future__ import annotations

import base64
import hashlib
import io
import re
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = 'lightning_sidecar_client'
TAG = 'py3-none-any'
# Fixed timestamps: the same sources always make the same archive.
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
TAR_TIME = 315532800


def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    # pyproject.toml is read with tomllib, in the standard library from Python 3.11.
    return [] if sys.version_info >= (3, 11) else ['tomli>=1.1']


get_requires_for_build_editable = get_requires_for_build_sdist = get_requires_for_build_wheel


def _project() -> dict:
    try:
        import tomllib
    except ImportError:  # Python < 3.11: tomli, installed through get_requires_for_build_wheel
        import tomli as tomllib  # type: ignore[no-redef]
    with open(ROOT / 'pyproject.toml', 'rb') as f:
        return tomllib.load(f)['project']


def _dist_name(project: dict) -> str:
    """The name as wheel and sdist file names spell it."""
    return re.sub(r'[-_.]+', '_', project['name']).lower()


def _metadata(project: dict) -> str:
    lines = ['Metadata-Version: 2.1', f"Name: {project['name']}", f"Version: {project['version']}"]
    if 'description' in project:
        lines.append(f"Summary: {project['description']}")
    if 'text' in project.get('license', {}):
        lines.append(f"License: {project['license']['text']}")
    if 'requires-python' in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f'Requires-Dist: {r}' for r in project.get('dependencies', [])]
    for extra, reqs in project.get('optional-dependencies', {}).items():
        lines.append(f'Provides-Extra: {extra}')
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    return '\n'.join(lines) + '\n'


def _package_files() -> list[Path]:
    return sorted(p for p in (ROOT / PACKAGE).rglob('*') if p.is_file() and '__pycache__' not in p.parts and p.suffix != '.pyc')


def _write_wheel(directory: str, contents: list[tuple[str, bytes]]) -> str:
    project = _project()
    dist_info = f"{_dist_name(project)}-{project['version']}.dist-info"
    scripts = project.get('scripts', {})
    contents = contents + [
        (f'{dist_info}/METADATA', _metadata(project).encode()),
        (f'{dist_info}/WHEEL', f'Wheel-Version: 1.0\nGenerator: {PACKAGE} tools/build_backend.py\nRoot-Is-Purelib: true\nTag: {TAG}\n'.encode()),
    ]
    if scripts:
        entry_points = '[console_scripts]\n' + ''.join(f'{name} = {target}\n' for name, target in scripts.items())
        contents.append((f'{dist_info}/entry_points.txt', entry_points.encode()))
    record = ''
    for name, data in contents:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
        record += f'{name},sha256={digest},{len(data)}\n'
    contents.append((f'{dist_info}/RECORD', (record + f'{dist_info}/RECORD,,\n').encode()))
    wheel = f"{_dist_name(project)}-{project['version']}-{TAG}.whl"
    with zipfile.ZipFile(Path(directory) / wheel, 'w', zipfile.ZIP_DEFLATED) as z:
        for name, data in contents:
            info = zipfile.ZipInfo(name, ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return wheel


def build_wheel(wheel_directory: str, config_settings: dict | None = None, metadata_directory: str | None = None) -> str:
    return _write_wheel(wheel_directory, [(p.relative_to(ROOT).as_posix(), p.read_bytes()) for p in _package_files()])


def build_editable(wheel_directory: str, config_settings: dict | None = None, metadata_directory: str | None = None) -> str:
    """A wheel whose .pth file puts this directory on sys.path: edits take effect without reinstalling."""
    return _write_wheel(wheel_directory, [(f'{PACKAGE}.pth', f'{ROOT}\n'.encode())])


def build_sdist(sdist_directory: str, config_settings: dict | None = None) -> str:
    project = _project()
    base = f"{_dist_name(project)}-{project['version']}"
    files = [ROOT / 'pyproject.toml', *sorted((ROOT / 'tools').glob('*.py')), *_package_files()]
    with tarfile.open(Path(sdist_directory) / f'{base}.tar.gz', 'w:gz', format=tarfile.PAX_FORMAT) as tar:
        members = [(p.relative_to(ROOT).as_posix(), p.read_bytes()) for p in files] + [('PKG-INFO', _metadata(project).encode())]
        for name, data in members:
            info = tarfile.TarInfo(f'{base}/{name}')
            info.size, info.mtime, info.mode = len(data), TAR_TIME, 0o644
            tar.addfile(info, io.BytesIO(data))
    return f'{base}.tar.gz'
