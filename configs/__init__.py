"""The `accelerate launch` configs of configs/accelerate, installed as package data `hf_scratch_transformer.configs`
(pyproject.toml), so that an installed package has them too: `python -m hf_scratch_transformer.configs` prints their
folder (docs/distributed.md)."""

from importlib.resources import files
from pathlib import Path

ACCELERATE = Path(str(files(__name__) / "accelerate"))
