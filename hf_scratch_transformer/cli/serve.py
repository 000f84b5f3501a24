"""Serve a saved model folder as an OpenAI-compatible endpoint with transformers' own server, `transformers serve`
(its routes, streaming and continuous batching):

    hf-scratch serve outputs/quickstart/model --port 8000
    hf-scratch serve outputs/quickstart/model --continuous-batching --cb-num-blocks 256

then `/v1/chat/completions` (the tokenizer needs a chat template), `/v1/completions`, `/v1/models`, `/health`.
Every option of `transformers serve` works (`hf-scratch serve --help`); it needs `pip install "transformers[serving]"`.

Why not `transformers serve` itself: its model manager resolves the class as `getattr(transformers,
config.architectures[0])`, where no remote-code class is found. This command puts the Scratch classes there and runs
the same command, for `ScratchDecoderForCausalLM` folders only (others are refused: see `NotServed`). A folder
exported to a native family (`hf-scratch convert FOLDER NATIVE_FOLDER`) needs neither this nor
`--trust-remote-code`: plain `transformers serve NATIVE_FOLDER` serves it.
"""

import sys

import transformers
import typer
from transformers import AutoModelForCausalLM
from transformers.cli.serve import Serve

from hf_scratch_transformer import AUTO_CLASSES


class NotServableError(ValueError):
    """A Scratch folder that `transformers serve` cannot answer with."""


class NotServed:
    """Stands in `transformers` for a Scratch class that is not a causal LM. The server answers with `generate()`'s
    output after the prompt's length: an encoder-decoder's output is a new sequence, so its non-streamed answers came
    back empty, and a classifier or encoder does not generate at all. Loading one is refused, naming it."""

    def __init__(self, model_class: type):
        self.__name__ = model_class.__name__

    def from_pretrained(self, model_id: str, *args, **kwargs):
        raise NotServableError(
            f"{model_id} holds a {self.__name__}; `hf-scratch serve` serves causal language models "
            "(ScratchDecoderForCausalLM) only. Use `transformers.pipeline` for this one."
        )


# Where `transformers serve` looks for the class named in config.json's `architectures`.
for models in AUTO_CLASSES.values():
    for auto_class, model_class in models:
        served = model_class if auto_class is AutoModelForCausalLM else NotServed(model_class)
        setattr(transformers, model_class.__name__, served)

try:
    typer.run(Serve)
except NotServableError as error:  # raised at start for the folder given on the command line: no traceback
    sys.exit(f"hf-scratch serve: error: {error}")
