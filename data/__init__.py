"""The embedded corpus, installed as package data `hf_scratch_transformer.data` (pyproject.toml):
`python -m hf_scratch_transformer.data` prints its file, the main job's default training text."""

from importlib.resources import files
from pathlib import Path

DEFAULT_CORPUS = Path(str(files(__name__) / "tinyshakespeare" / "input.txt"))
