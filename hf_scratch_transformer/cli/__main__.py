"""`python -m hf_scratch_transformer.cli COMMAND ...`: the same as the installed `hf-scratch` command."""

from hf_scratch_transformer.cli import main

main()
