"""Serve a saved model folder as an OpenAI-compatible endpoint with transformers' own server, `transformers serve`
(its routes, streaming and continuous batching):

    hf-scratch serve outputs/quickstart/model --port 8000
    hf-scratch serve outputs/quickstart/model --continuous-batching --cb-num-blocks 256

then `/v1/chat/completions` and `/v1/responses` (the tokenizer needs a chat template; without one they answer 400),
`/v1/completions`, `/v1/models`, `/health`.
Every option of `transformers serve` works (`hf-scratch serve --help`); it needs `pip install "transformers[serving]"`.

Why not `transformers serve` itself: its loader resolves the class as `getattr(transformers,
config.architectures[0])`, where no remote-code class is found. This command runs the same server with the Scratch
classes there, for `ScratchDecoderForCausalLM` folders only, and refuses what it cannot answer (`serving.py` says
what and why). A folder exported to a native family (`hf-scratch convert FOLDER NATIVE_FOLDER`) needs neither this nor
`--trust-remote-code`: plain `transformers serve NATIVE_FOLDER` serves it.
"""

import functools
import importlib.metadata
import sys

import typer
from packaging.version import Version
from transformers.cli.serve import Serve
from transformers.utils.import_utils import is_serve_available

# What keeps transformers' server from importing here, in a line rather than the traceback of the imports below, once
# the command runs: `--help` needs none of them, and typer answers it first (it was refused). The first line is the
# one `transformers serve` says.
if not is_serve_available():
    refusal = 'missing dependencies for serving: pip install "transformers[serving]"'
elif Version(openai_release := importlib.metadata.version("openai")) < Version("1.99"):
    # transformers[serving] admits openai 1.98, which lacks a class the server imports
    refusal = f"transformers' server needs openai>=1.99, and {openai_release} is installed: pip install 'openai>=1.99'"
else:
    refusal = None
if refusal is not None:  # typer.run exits here
    typer.run(functools.wraps(Serve, updated=())(lambda **options: sys.exit(f"hf-scratch serve: error: {refusal}")))

from hf_scratch_transformer.cli.serving import NotServableError, model_problem, use_loader


def check_model(model: str | None) -> None:
    """The model given on the command line, refused at start where `model_problem` finds one."""
    if model is not None and (problem := model_problem(model)):
        raise typer.BadParameter(problem)


@functools.wraps(Serve, updated=())  # typer reads `Serve`'s options and help through the wrapper
def serve(**options) -> None:
    check_model(options["force_model"])
    use_loader(compile_on_cpu=options["compile"] and not options["continuous_batching"])
    Serve(**options)


try:
    typer.run(serve)
except NotServableError as error:  # raised at start for the model given on the command line: no traceback
    print(f"hf-scratch serve: error: {error}", file=sys.stderr)
    sys.exit(2)  # a bad argument, as typer's own refusals of the folder
