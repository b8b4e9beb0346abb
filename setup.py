# Kept so that `pip install -e .` works with older pip front-ends; all metadata is in pyproject.toml.
from setuptools import setup

setup()
