"""`hf-scratch convert` from a checkout: see hf_scratch_transformer/cli/convert.py for the options."""

import runpy

runpy.run_module("hf_scratch_transformer.cli.convert", run_name="__main__")
