"""Generates the protobuf classes from the repository's proto/ into the package while building.

The generated module is build output (ignored by git); in a clone the package generates it on first
use instead (see lightning_sidecar_client/proto.py).
"""
import os
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithProto(build_py):
    def run(self):
        import importlib.util

        spec = importlib.util.spec_from_file_location('_lsc_proto', HERE / 'lightning_sidecar_client' / 'proto.py')
        proto = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(proto)
        root = Path(os.environ.get('LIGHTNING_PROTO_DIR') or HERE.parent.parent / 'proto')
        generated_dir = HERE / 'lightning_sidecar_client' / '_generated'
        with tempfile.TemporaryDirectory() as tmp:
            generated = proto.generate(Path(tmp), root)
            generated_dir.mkdir(exist_ok=True)
            (generated_dir / 'records_pb2.py').write_bytes(generated.read_bytes())
            (generated_dir / '__init__.py').write_text('')
        if 'lightning_sidecar_client._generated' not in self.packages:
            self.packages.append('lightning_sidecar_client._generated')
        super().run()


setup(cmdclass={'build_py': BuildWithProto})
