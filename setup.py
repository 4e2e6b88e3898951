"""The wheel's packages, found rather than listed (the rest of the build is in pyproject.toml).

Every package under ``pgmemory/`` is discovered, so a new subpackage needs no entry anywhere;
folders without an ``__init__.py`` (``pgmemory/ui/templates/``) count as namespace packages,
which is what ships their files without a setuptools warning. The top-level ``migrations/``
folder ships as ``pgmemory.migrations`` (mapped in pyproject.toml's ``package-dir``): a name
that ``[tool.setuptools.packages.find]`` cannot give it, since discovery names a package after
its folder. Hence these lines instead of a ``find`` table in pyproject.toml.
"""

from setuptools import find_namespace_packages, find_packages, setup

OWN = find_namespace_packages(include=["pgmemory", "pgmemory.*"], exclude=["*__pycache__"])
MIGRATIONS = ["pgmemory.migrations"] + [
    f"pgmemory.migrations.{name}" for name in find_packages(where="migrations")
]

setup(packages=OWN + MIGRATIONS)
