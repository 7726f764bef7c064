"""pip install ./python: the kiln package (pure Python; numpy at run time).

setup.py alone, with no pyproject.toml: pip then builds with the setuptools
already installed (Debian's python3-setuptools) instead of fetching one, so
the install works offline. The package still needs kiln itself, built or
installed: kiln/_build.py says where it looks, the tree this setup.py is in
among those places (recorded in the installed package as kiln/_tree.py).
"""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BuildWithTree(build_py):
    def run(self):
        super().run()
        with open(os.path.join(self.build_lib, "kiln", "_tree.py"), "w") as f:
            f.write(f'"""Written by setup.py: the kiln tree installed from."""\nTREE = {TREE!r}\n')

setup(
    name="kiln",
    version="0.4.0",
    description="kiln from Python: compile ONNX and YAML models to Vulkan and run them",
    packages=["kiln"],
    python_requires=">=3.9",
    install_requires=["numpy"],
    cmdclass={"build_py": BuildWithTree},
)
