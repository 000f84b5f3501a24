"""`hf-scratch benchmark` from a checkout: see hf_scratch_transformer/cli/benchmark.py for the options."""

import runpy

runpy.run_module("hf_scratch_transformer.cli.benchmark", run_name="__main__")
