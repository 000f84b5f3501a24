"""`hf-scratch train` from a checkout: see hf_scratch_transformer/cli/train.py for the options."""

import runpy

runpy.run_module("hf_scratch_transformer.cli.train", run_name="__main__")
