"""`hf-scratch finetune` from a checkout: see hf_scratch_transformer/cli/finetune.py for the options."""

import runpy

runpy.run_module("hf_scratch_transformer.cli.finetune", run_name="__main__")
