"""Serve a saved model folder as an OpenAI-compatible endpoint with transformers' own server, `transformers serve`
(its routes, streaming and continuous batching):

    hf-scratch serve outputs/quickstart/model --port 8000
    hf-scratch serve outputs/quickstart/model --continuous-batching --cb-num-blocks 256

then `/v1/chat/completions` and `/v1/responses` (the tokenizer needs a chat template; without one they answer 400),
`/v1/completions`, `/v1/models`, `/health`.
Every option of `transformers serve` works (`hf-scratch serve --help`); it needs `pip install "transformers[serving]"`.

Why not `transformers serve` itself: its model manager resolves the class as `getattr(transformers,
config.architectures[0])`, where no remote-code class is found. This command puts the Scratch classes there and runs
the same command, for `ScratchDecoderForCausalLM` folders only (others are refused: see `NotServed`). A folder
exported to a native family (`hf-scratch convert FOLDER NATIVE_FOLDER`) needs neither this nor
`--trust-remote-code`: plain `transformers serve NATIVE_FOLDER` serves it.
"""

import contextlib
import functools
import importlib.metadata
import json
import sys
import time
from pathlib import Path

import torch
import transformers
import typer
from huggingface_hub import is_offline_mode, try_to_load_from_cache
from huggingface_hub.utils import HFValidationError, validate_repo_id
from packaging.version import Version
from transformers import AutoModelForCausalLM
from transformers.cli.serve import Serve
from transformers.cli.serving.utils import split_model_id
from transformers.generation.configuration_utils import ALL_STATIC_CACHE_IMPLEMENTATIONS as STATIC_CACHES
from transformers.utils.import_utils import is_serve_available

try:  # transformers 5.24: an existing folder's '@' is part of its path
    from transformers.cli.serving.utils import split_revision
except ImportError:  # 5.23 read what follows it as a revision
    split_revision = None

from hf_scratch_transformer import AUTO_CLASSES, ScratchDecoderForCausalLM
from hf_scratch_transformer.compiled_decoding import cpu_compile_config
from hf_scratch_transformer.linear_kernels import bound_onednn_caches
from hf_scratch_transformer.pipeline_scratch_text2text import ABSOLUTE_POSITIONS

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

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from openai.types.responses import ResponseIncompleteEvent, ResponseOutputItemDoneEvent
from transformers.cli.serving.chat_completion import ChatCompletionHandler
from transformers.cli.serving.completion import CompletionHandler
from transformers.cli.serving.model_manager import ModelManager
from transformers.cli.serving.response import ResponseHandler
from transformers.cli.serving.utils import CBGenerateManager, GenerateManager


class NotServableError(HTTPException):
    """A Scratch folder that `transformers serve` cannot answer with, or a request it cannot answer. As an
    `HTTPException`, such a request is answered 400 with the reason (FastAPI's handler), where any other exception is a
    bare 500."""

    def __init__(self, message: str):
        super().__init__(status_code=400, detail=message)


class NotServed:
    """Stands in `transformers` for a Scratch class that is not a causal LM. The server answers with `generate()`'s
    output after the prompt's length: an encoder-decoder's output is a new sequence, so its non-streamed answers came
    back empty, and a classifier or encoder does not generate at all. Loading one is refused, naming it: at start, or
    with a 400 to the request that names it."""

    def __init__(self, model_class: type):
        self.__name__ = model_class.__name__

    def from_pretrained(self, model_id: str, *args, **kwargs):
        raise NotServableError(
            f"{model_id} holds a {self.__name__}; `hf-scratch serve` serves causal language models "
            "(ScratchDecoderForCausalLM) only. Use `transformers.pipeline` for this one."
        )


class CompiledOnCPU:
    """Stands in `transformers` for the causal LM under `--compile`. `transformers serve --compile` asks `generate()`
    for a static cache, and transformers compiles the decoding step over it on accelerators only: on a CPU the flag
    gave eager decoding over the static cache, slower than without it. A model loaded on the CPU gets a
    `compile_config` that allows compiling there (`cpu_compile_config`), so its decoding is compiled as on a GPU:
    200-token completions 1.57x faster once the first requests had compiled it (AVX2 AMD EPYC; docs/serving.md).
    Not with continuous batching, which keeps its own paths."""

    def __init__(self, model_class: type):
        self.model_class = model_class
        self.__name__ = model_class.__name__

    def from_pretrained(self, *args, **kwargs):
        model = self.model_class.from_pretrained(*args, **kwargs)
        if model.device.type == "cpu" and model.generation_config.compile_config is None:
            model.generation_config.compile_config = cpu_compile_config()
        return model


# Where `transformers serve` looks for the class named in config.json's `architectures`.
for models in AUTO_CLASSES.values():
    for auto_class, model_class in models:
        served = model_class if auto_class is AutoModelForCausalLM else NotServed(model_class)
        setattr(transformers, model_class.__name__, served)


def check_model(model: str | None) -> None:
    """The model given on the command line, refused at start where `model_problem` finds one."""
    if model is not None and (problem := model_problem(*split_model_id(model))):
        raise typer.BadParameter(problem)


def model_problem(model: str, gguf_file: str | None = None) -> str | None:
    """What keeps `transformers serve` from loading `model` (a folder, or a Hub id `<repo>[@revision]`, as the command
    line or a request names it), or None. A mistyped folder or a file went to the Hub as a repo id and stopped with a
    traceback ending in 'Repo id must be in the form ...', a folder without its tokenizer with one ending in
    'Unrecognized processing class'; refused naming the path, as the other commands do."""
    if "@" in model and Path(model).exists():
        if split_revision is None:
            return (f"{model}: `transformers serve` reads what follows '@' as a revision; give the folder a path "
                    "without '@' (a symbolic link will do)")
        repo, revision = model, None
    else:
        repo, _, revision = model.partition("@")
    folder = Path(repo)
    if folder.is_dir():
        if gguf_file is not None:  # the GGUF file holds the config and the tokenizer
            return None
        if not (folder / "config.json").is_file():
            return f"{repo} holds no config.json: not a model folder written by `save_pretrained`"
        if not (folder / "tokenizer_config.json").is_file():  # what every tokenizer's `save_pretrained` writes
            return (f"{repo} holds no tokenizer (tokenizer_config.json): the server reads prompts with it; save the "
                    "tokenizer next to the model (`tokenizer.save_pretrained`)")
        return None
    if folder.exists():
        return f"{repo} is a file, not a model folder written by `save_pretrained`"
    try:
        validate_repo_id(repo)  # `namespace/name` may be on the Hub; anything else can only be a local path
    except HFValidationError:
        return f"folder {repo} does not exist"
    # A Hub id in form only: a mistyped folder (`outputs/modl`) went to the Hub, and the server stopped with a
    # traceback ending in "We couldn't connect to 'https://huggingface.co'", naming no folder.
    if "/" in repo and folder.parent.is_dir():
        return (f"folder {repo} does not exist (its parent folder does: a mistyped name?); to serve the Hub's {repo}, "
                f"start the server where no {folder.parent} is")
    cached = try_to_load_from_cache(repo, "config.json", revision=revision)  # a path, or not cached
    if is_offline_mode() and not isinstance(cached, str):
        return (f"folder {repo} does not exist, and with HF_HUB_OFFLINE set a Hub model must be in the local Hub "
                "cache, where it is not")
    return None


def refusing_what_would_fail(load):
    """`ModelManager.load_model_and_processor` refusing, with a 400 naming it, a model that `model_problem` finds
    fault with: a server started without a folder loads what each request names, and a missing folder, one without
    a tokenizer or a file was answered with a bare 500 (the reason in the server's log only)."""

    @functools.wraps(load)
    def load_checked(self, model_id_and_revision: str, *args, gguf_file: str | None = None, **kwargs):
        if problem := model_problem(model_id_and_revision, gguf_file):
            raise NotServableError(problem)
        return load(self, model_id_and_revision, *args, gguf_file=gguf_file, **kwargs)

    return load_checked


ModelManager.load_model_and_processor = refusing_what_would_fail(ModelManager.load_model_and_processor)


def needing_a_chat_template(resolve):
    """The chat and Responses handlers' `_resolve_model` refusing, with a 400 naming it, a model whose tokenizer has
    no chat template (every tokenizer `hf-scratch` trains: base language models): `apply_chat_template` raised after
    the model was loaded, and the request was answered a bare 500 (streamed or not)."""

    @functools.wraps(resolve)
    def resolve_checked(self, body: dict):
        model_id, model, processor = resolve(self, body)
        given = {**self.chat_template_kwargs, **(body.get("chat_template_kwargs") or {})}  # a template may come here
        if processor.chat_template is None and "chat_template" not in given:
            raise NotServableError(
                f"{model_id}: its tokenizer has no chat template, so chat requests cannot be formatted (a base "
                "language model). Send a plain prompt to /v1/completions, or give the tokenizer a chat template "
                "(`tokenizer.chat_template = ...`, then `tokenizer.save_pretrained` into the model folder)."
            )
        return model_id, model, processor

    return resolve_checked


def refusing_invalid_generation(build):
    """A handler's `_build_generation_config` refusing, with a 400 giving the reason, settings that `generate()`
    rejects from the config alone (`max_tokens` 0 or negative): a bare 500, streamed an error event in a 200. Checked
    before generation starts, with or without continuous batching. Settings that cannot be read were bare 500s too:
    a request's own `generation_config` that is no JSON object or that `GenerationConfig` rejects (it validates
    itself), a `temperature` or `max_tokens` that is no number."""

    @functools.wraps(build)
    def build_checked(self, *args, **kwargs):
        try:
            generation_config = build(self, *args, **kwargs)  # reads the request's values: any error is theirs
            generation_config.validate()  # what `generate()` runs first; minor issues are logged once, as there
        except (ValueError, TypeError) as error:
            raise NotServableError(
                "invalid generation settings (`max_tokens` or `max_output_tokens` sets `max_new_tokens`; "
                f"`generation_config` is a JSON object of `GenerationConfig` fields): {error}"
            ) from error
        return generation_config

    return build_checked


for handler in (ChatCompletionHandler, ResponseHandler):
    handler._resolve_model = needing_a_chat_template(handler._resolve_model)
for handler in (ChatCompletionHandler, CompletionHandler, ResponseHandler):
    handler._build_generation_config = refusing_invalid_generation(handler._build_generation_config)


def within_the_models_positions(generate):
    """A generation manager's `generate_streaming` / `generate_non_streaming` giving each request the new tokens that
    `generate()` gives it, as a count (`new_tokens_asked`), and keeping it within the positions of a model whose
    positions end (`position_limit`): a request without `max_tokens` asks for 1024 new tokens (transformers serve's
    default), one with a `generation_config` of its own may give a `max_length` past them, and one that ran past the
    last position failed part-way with an IndexError, a bare 500 (streamed: an error event), and stopped the
    continuous batching worker for good. The new tokens now end where the positions do (`finish_reason` "length"),
    and a prompt that leaves no room for one is answered 400 before it reaches the model."""

    @functools.wraps(generate)
    def generate_within(self, model, processor, inputs, gen_config, *args, **kwargs):
        ids = inputs["input_ids"]
        prompt = len(ids) if isinstance(ids, list) else ids.shape[-1]  # continuous batching: a list of ids
        static_cache = gen_config.use_cache is not False and gen_config.cache_implementation in STATIC_CACHES
        positions = position_limit(model, static_cache)
        if positions is not None and prompt >= positions:
            sized = " (a static cache, as under --compile, holds its max_position_embeddings)" if static_cache else ""
            raise NotServableError(f"the prompt is {prompt} tokens, and this model reads at most {positions} "
                                   f"positions, its answer included{sized}: shorten the prompt")
        gen_config.max_new_tokens = new_tokens_asked(model, gen_config, prompt)
        if positions is not None:
            gen_config.max_new_tokens = min(gen_config.max_new_tokens, positions - prompt)
            if getattr(gen_config, "max_cache_len", None) is not None:  # a static cache size of its own (5.24)
                gen_config.max_cache_len = min(gen_config.max_cache_len, positions)
        return generate(self, model, processor, inputs, gen_config, *args, **kwargs)

    return generate_within


def position_limit(model, static_cache: bool) -> int | None:
    """How many positions a request may take, prompt and answer together, or None where they do not end: a learned
    or sinusoidal table's (ours, by `position_embedding_type`; a native model's learned table, as GPT-2's `wpe`) and,
    over a static cache, any model's `max_position_embeddings`: `generate()` allocates that cache for the prompt and
    the whole answer at once, and keeps the largest it has allocated, so one request with a huge `max_tokens` (RoPE,
    ALiBi: no table to end it) failed to allocate it, and every later request with it, a bare 500 each."""
    positions = getattr(model.config, "max_position_embeddings", None)
    return positions if positions is not None and (static_cache or has_a_position_table(model, positions)) else None


def has_a_position_table(model, positions: int) -> bool:
    """Whether `model` reads its positions from a table of `positions` rows: ours with learned or sinusoidal
    positions, or a native model with a learned table besides its token embeddings."""
    if getattr(model.config, "position_embedding_type", None) in ABSOLUTE_POSITIONS:
        return True
    tokens = model.get_input_embeddings()
    return any(isinstance(table, torch.nn.Embedding) and table is not tokens and table.num_embeddings == positions
               for table in model.modules())


GENERATE_DEFAULT_NEW_TOKENS = 20  # what `generate()` gives where nothing sets a count or a length


def new_tokens_asked(model, gen_config, prompt: int) -> int:
    """The new tokens that `generate()` gives a request of `prompt` tokens: its `max_new_tokens`, else its
    `max_length` less the prompt, each the request's or, where a request's own `generation_config` leaves it unset, the
    folder's (as `generate()` fills it in), else 20 within `max_position_embeddings` (as `generate()` bounds them).
    Continuous batching reads a count only: a length given otherwise was ignored there (the answer took the first
    request's count, or ran on to the end of the positions), and `finish_reason` read "stop" for an answer that
    it ended (transformers compares the answer with `max_new_tokens` alone)."""
    folder = model.generation_config
    new_tokens = first_set(gen_config.max_new_tokens, folder.max_new_tokens)
    if new_tokens is not None:
        return new_tokens
    max_length = first_set(gen_config.max_length, folder.max_length)
    if max_length is None:
        positions = getattr(model.config, "max_position_embeddings", None) or prompt + GENERATE_DEFAULT_NEW_TOKENS
        max_length = min(prompt + GENERATE_DEFAULT_NEW_TOKENS, positions)
    if max_length <= prompt:
        raise NotServableError(f"the prompt is {prompt} tokens, and the request ends at {max_length} (its "
                               "`max_length`, or `max_position_embeddings` where it gives none): no room for an answer")
    return max_length - prompt


def first_set(*values):
    """The first of `values` that is not None (None if all are)."""
    return next((value for value in values if value is not None), None)


def within_the_models_vocabulary(generate):
    """A generation manager's `generate_streaming` / `generate_non_streaming` answering 400 to a prompt holding a
    token id past the model's embedding rows (tokens added to the folder's tokenizer after the model was saved, its
    embeddings not resized): it was a bare 500, and under continuous batching it stopped the generation loop, every
    later request answered 503. Prompts of the model's own tokens are served as before."""

    @functools.wraps(generate)
    def generate_within(self, model, processor, inputs, gen_config, *args, **kwargs):
        ids, rows = inputs["input_ids"], model.get_input_embeddings().num_embeddings
        ids = ids if isinstance(ids, list) else ids.flatten().tolist()  # continuous batching: a list of ids
        highest = max(ids, default=-1)
        if highest >= rows:
            raise NotServableError(
                f"the prompt holds token id {highest}, and the model has {rows} embedding rows (ids 0 to {rows - 1}): "
                f"its tokenizer has {len(getattr(processor, 'tokenizer', processor))} tokens, some added after the "
                "model was saved. Resize the model's embeddings to its tokenizer "
                "(`model.resize_token_embeddings(len(tokenizer))`, then `save_pretrained`), or save the tokenizer "
                "it was trained with into the folder.")
        return generate(self, model, processor, inputs, gen_config, *args, **kwargs)

    return generate_within


def within_the_paged_cache(generate):
    """The continuous batching manager's `generate_streaming` / `generate_non_streaming` keeping each request within
    its paged cache (`--cb-num-blocks` x `--cb-block-size` tokens, rounded up to whole memory sectors), which holds a
    request's prompt and its answer but for the last token: one that outgrew it failed ("No requests can be scheduled
    and no requests can be offloaded") and stopped the worker for good, every later request answered 503 "CB worker is
    dead". The new tokens now end where the cache does (`finish_reason` "length"), and a prompt past it is answered 400
    before it reaches the worker. Requests that fit alone but not together are the worker's to share (it offloads)."""

    @functools.wraps(generate)
    def generate_within(self, model, processor, inputs, gen_config, *args, **kwargs):
        cb = self._cb
        # The worker thread builds the cache as it starts, after `init_cb` has returned (no event tells when): a
        # worker that stopped without one (a cache too large for memory) is answered 503 with its reason, as before.
        while cb is not None and cb.batch_processor is None and cb.is_running():
            time.sleep(0.01)
        cache = cb.batch_processor.cache if cb is not None and cb.batch_processor is not None else None
        # A cache of sliding-window layers alone keeps a request's last `sliding_window` tokens: bounded where those
        # do not fit. (A native model mixing both kinds can outgrow it by its window's share, not counted here.)
        window = cache.read_cache_limit if cache is not None else None
        if cache is not None and (window is None or window > cache.max_tokens_read):
            capacity, prompt = cache.max_tokens_read, len(inputs["input_ids"])
            if prompt > capacity:
                raise NotServableError(f"the prompt is {prompt} tokens, and the paged cache of continuous batching "
                                       f"holds {capacity} tokens for a request, its answer included: shorten the "
                                       "prompt, or start the server with a larger --cb-num-blocks or --cb-block-size")
            room = capacity + 1 - prompt  # the last new token is never written to the cache
            gen_config.max_new_tokens = min(gen_config.max_new_tokens, room)
        return generate(self, model, processor, inputs, gen_config, *args, **kwargs)

    return generate_within


# Inside the positions' check, which runs first: it gives every request its count of new tokens.
CBGenerateManager.generate_streaming = within_the_paged_cache(CBGenerateManager.generate_streaming)
CBGenerateManager.generate_non_streaming = within_the_paged_cache(CBGenerateManager.generate_non_streaming)
for manager in (GenerateManager, CBGenerateManager):
    for method in ("generate_streaming", "generate_non_streaming"):
        setattr(manager, method, within_the_models_vocabulary(within_the_models_positions(getattr(manager, method))))


def reported_as_cut(response: dict, gen_config) -> dict:
    """A Responses API `response` (a dict) as OpenAI's API reports an answer that ended at its length (the
    request's `max_output_tokens`, or the room left by the positions or the paged cache): status "incomplete", with
    `incomplete_details` {"reason": "max_output_tokens"}, and its message item "incomplete" too; transformers said
    "completed" (its chat completions say `finish_reason` "length", by the same count). Any other response as it is."""
    if response["usage"]["output_tokens"] < gen_config.max_new_tokens:  # set by `within_the_models_positions`
        return response
    return {**response, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
            "output": [message_as_cut(item) for item in response["output"]]}


def message_as_cut(item: dict) -> dict:
    """An output item of an answer cut by its length: the message "incomplete", as OpenAI's API marks it; any other
    item (reasoning, a tool call) as it is."""
    return {**item, "status": "incomplete"} if item["type"] == "message" else item


def reporting_a_cut_answer(respond):
    """`ResponseHandler._non_streaming` answering with `reported_as_cut`."""

    @functools.wraps(respond)
    async def respond_reporting(self, request_id, model, processor, model_id, body, inputs, gen_config, **kwargs):
        reply = await respond(self, request_id, model, processor, model_id, body, inputs, gen_config, **kwargs)
        response = json.loads(reply.body)
        reported = reported_as_cut(response, gen_config)
        return reply if reported is response else JSONResponse(reported)

    return respond_reporting


def streaming_a_cut_answer_as_incomplete(respond):
    """`ResponseHandler._streaming` ending with a `response.incomplete` event where `reported_as_cut` says so, in
    place of `response.completed`, as OpenAI's stream of such an answer ends."""

    @functools.wraps(respond)
    def respond_reporting(self, request_id, model, processor, model_id, body, inputs, gen_config, **kwargs):
        reply = respond(self, request_id, model, processor, model_id, body, inputs, gen_config, **kwargs)
        reply.body_iterator = ending_as_reported(reply.body_iterator, gen_config)
        return reply

    return respond_reporting


async def ending_as_reported(chunks, gen_config):
    """The chunks of a Responses stream (events `data: {...}`, each ended by a blank line), each event as
    `reported_event` gives it; closing it closes the stream (a client that leaves cancels the generation there).
    A chunk that ends the message (its `response.output_item.done`) waits for the next: where that one reports the
    answer cut, the message's item says "incomplete" there too. The last message ends after the generation, just
    before the final event, so nothing waits for a token."""
    held = None
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            chunk = each_event(chunk, reported_event, gen_config)
            if held is not None:
                yield each_event(held, message_done_as_cut) if INCOMPLETE_EVENT in chunk else held
            held = chunk if any(map(ends_the_message, chunk.split("\n\n"))) else None
            if held is None:
                yield chunk
        if held is not None:
            yield held


def each_event(chunk: str, rewrite, *args) -> str:
    """The chunk of a Responses stream with each of its events as `rewrite(event, *args)` gives it."""
    return "\n\n".join(rewrite(event, *args) for event in chunk.split("\n\n"))


# As the events' JSON writes them (a quote in any text is escaped).
COMPLETED_EVENT = '"type":"response.completed"'
INCOMPLETE_EVENT = '"type":"response.incomplete"'
ITEM_DONE_EVENT = '"type":"response.output_item.done"'


def reported_event(event: str, gen_config) -> str:
    """One event of a Responses stream: `response.completed` as `response.incomplete` where `reported_as_cut` says
    so, any other as it is."""
    if COMPLETED_EVENT not in event:
        return event
    completed = json.loads(event.removeprefix("data: "))
    response = reported_as_cut(completed["response"], gen_config)
    if response is completed["response"]:
        return event
    incomplete = ResponseIncompleteEvent(type="response.incomplete", sequence_number=completed["sequence_number"],
                                         response=response)
    return f"data: {incomplete.model_dump_json(exclude_none=True)}"


def ends_the_message(event: str) -> bool:
    """Whether the event of a Responses stream is the `response.output_item.done` of a message."""
    return ITEM_DONE_EVENT in event and json.loads(event.removeprefix("data: "))["item"]["type"] == "message"


def message_done_as_cut(event: str) -> str:
    """One event of a Responses stream whose answer was cut: the message's `response.output_item.done` with the item
    as `message_as_cut` gives it, any other event as it is."""
    if not ends_the_message(event):
        return event
    done = json.loads(event.removeprefix("data: "))
    cut = ResponseOutputItemDoneEvent(**{**done, "item": message_as_cut(done["item"])})
    return f"data: {cut.model_dump_json(exclude_none=True)}"


ResponseHandler._non_streaming = reporting_a_cut_answer(ResponseHandler._non_streaming)
ResponseHandler._streaming = streaming_a_cut_answer_as_incomplete(ResponseHandler._streaming)


@functools.wraps(Serve, updated=())  # typer reads `Serve`'s options and help through the wrapper
def serve(**options) -> None:
    check_model(options["force_model"])
    if options["compile"] and not options["continuous_batching"]:
        setattr(transformers, ScratchDecoderForCausalLM.__name__, CompiledOnCPU(ScratchDecoderForCausalLM))
    Serve(**options)


bound_onednn_caches()  # each new prompt length is a new shape of product: memory grew with every one
try:
    typer.run(serve)
except NotServableError as error:  # raised at start for the folder given on the command line: no traceback
    print(f"hf-scratch serve: error: {error.detail}", file=sys.stderr)
    sys.exit(2)  # a bad argument, as typer's own refusals of the folder
