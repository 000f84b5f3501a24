"""The model card template, installed as package data `hf_scratch_transformer.model_cards` (pyproject.toml)."""
