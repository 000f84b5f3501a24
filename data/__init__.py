"""The embedded corpus, installed as package data `hf_scratch_transformer.data` (pyproject.toml)."""
