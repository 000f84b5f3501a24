"""`hf-scratch train-accelerate` from a checkout: see hf_scratch_transformer/cli/train_accelerate.py for the options."""

import runpy

runpy.run_module("hf_scratch_transformer.cli.train_accelerate", run_name="__main__")
