"""The `hf-scratch` subcommands, one flat script module each. The command itself (its table of subcommands,
`--help`, `--version`) lives in `hf_scratch_command`, outside this package, so that it answers those without importing
torch and transformers; `main` here is the same function. No model file imports this package."""

from hf_scratch_command import COMMANDS, main, usage

__all__ = ["COMMANDS", "main", "usage"]
