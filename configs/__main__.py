"""`python -m hf_scratch_transformer.configs`: the folder of the installed `accelerate launch` configs, e.g.

    accelerate launch --config_file "$(python -m hf_scratch_transformer.configs)/fsdp.yaml" \
        -m hf_scratch_transformer.cli.train_accelerate --preset gpt2-small
"""

from hf_scratch_transformer.configs import ACCELERATE

print(ACCELERATE)
