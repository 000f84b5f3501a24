"""`hf-scratch publish` from a checkout: see hf_scratch_transformer/cli/publish.py for the options."""

import runpy

runpy.run_module("hf_scratch_transformer.cli.publish", run_name="__main__")
