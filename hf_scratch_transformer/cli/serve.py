"""Serve a saved model folder as an OpenAI-compatible endpoint with transformers' own server, `transformers serve`
(its routes, streaming and continuous batching):

    hf-scratch serve outputs/quickstart/model --port 8000
    hf-scratch serve outputs/quickstart/model --continuous-batching --cb-num-blocks 256

then `/v1/chat/completions` (the tokenizer needs a chat template), `/v1/completions`, `/v1/models`, `/health`.
Every option of `transformers serve` works (`hf-scratch serve --help`); it needs `pip install "transformers[serving]"`.

Why not `transformers serve` itself: its model manager resolves the class as `getattr(transformers,
config.architectures[0])`, where no remote-code class is found. This command puts the Scratch classes there and runs
the same command. A folder exported to a native family (`hf-scratch convert FOLDER NATIVE_FOLDER`) needs neither
this nor `--trust-remote-code`: plain `transformers serve NATIVE_FOLDER` serves it.
"""

import transformers
import typer
from transformers.cli.serve import Serve

from hf_scratch_transformer import AUTO_CLASSES

# Where `transformers serve` looks for the class named in config.json's `architectures`.
for models in AUTO_CLASSES.values():
    for _, model_class in models:
        setattr(transformers, model_class.__name__, model_class)

typer.run(Serve)
