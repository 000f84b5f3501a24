"""What `hf-scratch serve` changes in transformers' server (`transformers serve`, 5.25), in each of its processes.

transformers runs each model in a process of its own, started with `spawn`: a fresh interpreter, which imports this
module as it unpickles the loader it is given (`ScratchModelLoader`, put in place of transformers' by `use_loader`).
So every change below holds in the API server, where requests are read and answered, and in the model's process,
where the model loads and generates. Nothing here starts a server: `serve.py` is the command.

Why each change: transformers finds the model's class as `getattr(transformers, config.architectures[0])`, where no
remote-code class is; and requests that a model cannot answer (a prompt past its positions, its vocabulary or the
paged cache; a chat without a chat template; settings `generate()` rejects) failed with a bare 500, or stopped the
continuous batching worker for good. transformers' server answers a `ValueError` with a 400 giving its message, so
each such request now gets a `NotServableError` naming the problem, before generation starts.
"""

import contextlib
import copy
import functools
import json
import time
from pathlib import Path

from fastapi.responses import JSONResponse
from huggingface_hub import is_offline_mode, try_to_load_from_cache
from huggingface_hub.utils import HFValidationError, validate_repo_id
from openai.types.responses import ResponseIncompleteEvent, ResponseOutputItemDoneEvent
from transformers import AutoModelForCausalLM
from transformers.cli.serving import model_manager
from transformers.cli.serving.chat_completion import ChatCompletionHandler
from transformers.cli.serving.completion import CompletionHandler
from transformers.cli.serving.model_manager import EngineClient, ModelLoader
from transformers.cli.serving.response import ResponseHandler
from transformers.cli.serving.utils import CBGenerateRunner, parse_model_id

from hf_scratch_transformer import AUTO_CLASSES
from hf_scratch_transformer.compiled_decoding import cpu_compile_config
from hf_scratch_transformer.linear_kernels import bound_onednn_caches


class NotServableError(ValueError):
    """A model, or a request, that the server cannot answer: a 400 with this message (transformers' server answers
    any `ValueError` so); at start, the command prints it and exits 2."""


SERVED = {}  # the causal LMs, by class name: where transformers' loader looks for them
NOT_SERVED = set()  # every other Scratch class: the server answers with `generate()` cut at the prompt's length
for models in AUTO_CLASSES.values():
    for auto_class, model_class in models:
        if auto_class is AutoModelForCausalLM:
            SERVED[model_class.__name__] = model_class
        else:
            NOT_SERVED.add(model_class.__name__)
for name, model_class in SERVED.items():
    # On the module object the loader reads (importing transformers' submodules may put another in sys.modules).
    setattr(model_manager.transformers, name, model_class)
# Each new prompt length is a new shape of product: oneDNN's caches grew with every one (the model's process).
bound_onednn_caches()


def model_problem(model: str) -> str | None:
    """What keeps `transformers serve` from loading `model` (a folder, or a Hub id `<repo>[@revision][:file.gguf]`, as
    the command line or a request names it), or None. A mistyped folder or a file went to the Hub as a repo id and
    failed with a traceback ending in 'Repo id must be in the form ...', a folder without its tokenizer with one
    ending in 'Unrecognized processing class'; refused naming the path, as the other commands do."""
    repo, revision, gguf_file = parse_model_id(model)
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


class ScratchModelLoader(ModelLoader):
    """transformers' loader, refusing what it cannot serve before anything loads (`model_problem`, and a Scratch
    class other than the causal LM: an encoder-decoder's answers came back empty, a classifier's requests failed)."""

    compile_on_cpu = False  # `CompilingModelLoader`

    def load_config(self, model_id: str):
        if problem := model_problem(model_id):
            raise NotServableError(problem)
        config, generation_config = super().load_config(model_id)
        architecture = (config.architectures or [None])[0]
        if architecture in NOT_SERVED:
            raise NotServableError(f"{model_id} holds a {architecture}; `hf-scratch serve` serves causal language "
                                   "models (ScratchDecoderForCausalLM) only. Use `transformers.pipeline` for this one.")
        return config, generation_config

    def _load_model(self, *args, **kwargs):
        model = super()._load_model(*args, **kwargs)
        if self.compile_on_cpu and model.device.type == "cpu" and model.generation_config.compile_config is None:
            model.generation_config.compile_config = cpu_compile_config()
        return model


class CompilingModelLoader(ScratchModelLoader):
    """The loader of `--compile` without continuous batching. `--compile` asks `generate()` for a static cache, and
    transformers compiles the decoding step over it on accelerators only: on a CPU the flag gave eager decoding over
    the static cache, slower than without it. A model loaded on the CPU gets a `compile_config` that allows compiling
    there (`cpu_compile_config`): 200-token completions 1.57x faster once the first requests had compiled it (AVX2 AMD
    EPYC; docs/serving.md). A class of its own: `Serve` builds the loader itself, from the class `use_loader` puts
    in place, with transformers' arguments only."""

    compile_on_cpu = True


def use_loader(compile_on_cpu: bool) -> None:
    """Puts our loader where `transformers serve` takes its loader from (`Serve` builds it from this name)."""
    model_manager.ModelLoader = CompilingModelLoader if compile_on_cpu else ScratchModelLoader


def needing_a_chat_template(render):
    """The chat and Responses handlers' `render_messages` refusing a model whose tokenizer has no chat template
    (every tokenizer `hf-scratch` trains: base language models), naming the way out."""

    @functools.wraps(render)
    def render_checked(self, engine, messages, body):
        if engine.processor.chat_template is None and "chat_template" not in self._chat_template_kwargs(body):
            raise NotServableError(
                f"{engine.model_id}: its tokenizer has no chat template, so chat requests cannot be formatted (a base "
                "language model). Send a plain prompt to /v1/completions, or give the tokenizer a chat template "
                "(`tokenizer.chat_template = ...`, then `tokenizer.save_pretrained` into the model folder)."
            )
        return render(self, engine, messages, body)

    return render_checked


REQUEST_COUNTS = ("max_tokens", "max_completion_tokens", "max_output_tokens")  # each endpoint's `max_new_tokens`


def refusing_invalid_generation(build):
    """A handler's `_build_generation_kwargs` refusing settings that `generate()` rejects from the settings alone
    (`max_tokens` 0 or negative), and settings that cannot be read (a request's own `generation_config` that is no
    JSON object, a `temperature` that is no number): a bare 500, or, streamed, an error event in a 200. And a request
    whose own `generation_config` gives its length as `max_length` gets that length: transformers' default count of
    new tokens (1024) went with it to `generate()`, where a count wins over a length (`fitted_to_the_model` turns the
    length into a count, knowing the prompt's)."""

    @functools.wraps(build)
    def build_checked(self, body, model_generation_config):
        try:
            requested = json.loads(body["generation_config"]) if body.get("generation_config") is not None else {}
            if not isinstance(requested, dict):
                raise TypeError(f"`generation_config` must be a mapping (a JSON object), got {requested!r}")
            generation_kwargs = build(self, body, model_generation_config)  # reads the request's values
            settings = copy.deepcopy(model_generation_config)
            settings.update(**{name: value for name, value in generation_kwargs.items() if name != "seed"})
            settings.validate()  # what `generate()` runs first; minor issues are logged once, as there
        except (ValueError, TypeError) as error:
            raise NotServableError(
                "invalid generation settings (`max_tokens` or `max_output_tokens` sets `max_new_tokens`; "
                f"`generation_config` is a JSON object of `GenerationConfig` fields): {error}"
            ) from error
        if "max_length" in requested and "max_new_tokens" not in requested and not any(map(body.get, REQUEST_COUNTS)):
            generation_kwargs["max_new_tokens"] = None
        return generation_kwargs

    return build_checked


for handler in (ChatCompletionHandler, ResponseHandler):
    handler.render_messages = needing_a_chat_template(handler.render_messages)
for handler in (ChatCompletionHandler, CompletionHandler, ResponseHandler):
    handler._build_generation_kwargs = refusing_invalid_generation(handler._build_generation_kwargs)


def knowing_the_paged_cache(handle):
    """A handler's `handle_request` learning, at a model's first request under continuous batching, how many tokens
    its paged cache holds for a request (`ScratchCBGenerateRunner.paged_cache_capacity`, asked of the model's
    process): `fitted_to_the_model` needs it before the answer starts, which may stream."""

    @functools.wraps(handle)
    async def handle_knowing(self, body, request_id):
        self._validate_request(body)  # as `handle` does first: a request's unexpected fields are its 422
        engine = self.model_manager.get_engine(body.get("model"))
        if engine.use_cb and "paged_cache_capacity" not in vars(engine):
            engine.paged_cache_capacity = await engine._send_request("paged_cache_capacity", args=())
        return await handle(self, body, request_id)

    return handle_knowing


for handler in (ChatCompletionHandler, CompletionHandler, ResponseHandler):
    handler.handle_request = knowing_the_paged_cache(handler.handle_request)


def fitted_to_the_model(engine, inputs: dict, generation_kwargs: dict) -> None:
    """Refuses a prompt that the model cannot read, and ends the answer where the model's positions, or its paged
    cache, end (in `generation_kwargs`, which the handler then reports the answer's end by: `finish_reason` "length").

    - A token id past the model's embedding rows (tokens added to the folder's tokenizer after the model was saved):
      a bare 500, and under continuous batching the generation loop stopped, every later request answered 503.
    - The positions (`max_position_embeddings`, or `--max-model-len`): transformers refuses a prompt that fills them,
      but a request without `max_tokens` asks for 1024 new tokens, and one that reached the last position of a
      learned table failed part-way (a bare 500; under continuous batching the worker stopped for good); over a
      static cache (`--compile`), `generate()` allocated one for the whole answer, and a huge `max_tokens` (or a
      request's own `max_cache_len`) failed to, and so did every later request.
    - The paged cache of continuous batching holds a request's prompt and its answer but for the last token: one that
      outgrew it failed ("No requests can be scheduled") and stopped the worker for good, every later request
      answered 503. Requests that fit alone but not together are the worker's to share (it offloads).
    inputs["input_ids"]: (1, prompt) or, under continuous batching, a list of the prompt's ids."""
    ids = inputs["input_ids"]
    ids = ids if isinstance(ids, list) else ids.flatten().tolist()
    prompt, rows = len(ids), engine.model_config.get_text_config().vocab_size
    highest = max(ids, default=-1)
    if highest >= rows:
        tokens = len(getattr(engine.processor, "tokenizer", engine.processor))
        raise NotServableError(
            f"the prompt holds token id {highest}, and the model has {rows} embedding rows (ids 0 to {rows - 1}): its "
            f"tokenizer has {tokens} tokens, some added after the model was saved. Resize the model's embeddings to "
            "its tokenizer (`model.resize_token_embeddings(len(tokenizer))`, then `save_pretrained`), or save the "
            "tokenizer it was trained with into the folder.")
    if generation_kwargs["max_new_tokens"] is None:  # the request gave its length (`refusing_invalid_generation`)
        if generation_kwargs["max_length"] <= prompt:
            raise NotServableError(f"the prompt is {prompt} tokens, and the request's `max_length` is "
                                   f"{generation_kwargs['max_length']}: no room for an answer")
        generation_kwargs["max_new_tokens"] = generation_kwargs.pop("max_length") - prompt
    positions = engine.generation_state.context_length(engine.model_config)
    if positions is not None:  # transformers has refused a prompt of `positions` tokens or more
        generation_kwargs["max_new_tokens"] = min(generation_kwargs["max_new_tokens"], positions - prompt)
        if generation_kwargs.get("max_cache_len") is not None:
            generation_kwargs["max_cache_len"] = min(generation_kwargs["max_cache_len"], positions)
    capacity = vars(engine).get("paged_cache_capacity")
    if capacity is not None:
        if prompt > capacity:
            raise NotServableError(f"the prompt is {prompt} tokens, and the paged cache of continuous batching holds "
                                   f"{capacity} tokens for a request, its answer included: shorten the prompt, or "
                                   "start the server with a larger --cb-num-blocks or --cb-block-size")
        generation_kwargs["max_new_tokens"] = min(generation_kwargs["max_new_tokens"], capacity + 1 - prompt)


def generating_within_the_model(generate):
    """`EngineClient.generate_streaming` / `generate_non_streaming` with `fitted_to_the_model` first: called before
    the answer starts, so a refusal is a 400 whether it would stream or not."""

    @functools.wraps(generate)
    def generate_within(self, inputs, generation_kwargs, *args, **kwargs):
        fitted_to_the_model(self, inputs, generation_kwargs)
        return generate(self, inputs, generation_kwargs, *args, **kwargs)

    return generate_within


EngineClient.generate_streaming = generating_within_the_model(EngineClient.generate_streaming)
EngineClient.generate_non_streaming = generating_within_the_model(EngineClient.generate_non_streaming)


class ScratchCBGenerateRunner(CBGenerateRunner):
    """transformers' runner of continuous batching (in the model's process), which tells the API server how many
    tokens its paged cache holds for a request."""

    def paged_cache_capacity(self, request_id: int, stream: bool) -> None:
        """Sends the tokens a request may hold in the paged cache, prompt and answer, or None where no bound applies:
        a cache of sliding-window layers alone keeps a request's last `sliding_window` tokens. (A native model mixing
        both kinds can outgrow it by its window's share, not counted here.)"""
        # The worker builds the cache as it starts; a worker that stopped without one (a cache too large for memory)
        # fails the requests with its reason, as before.
        while self.manager.batch_processor is None and self.manager.is_running():
            time.sleep(0.01)
        processor = self.manager.batch_processor
        cache = processor.cache if processor is not None else None
        window = cache.read_cache_limit if cache is not None else None
        bounded = cache is not None and (window is None or window > cache.max_tokens_read)
        self.send_results([], [], [(request_id, cache.max_tokens_read if bounded else None)])


model_manager.CBGenerateRunner = ScratchCBGenerateRunner  # what the model's process builds its runner from


def reported_as_cut(response: dict, max_new_tokens: int) -> dict:
    """A Responses API `response` (a dict) as OpenAI's API reports an answer that ended at its length (the
    request's `max_output_tokens`, or the room left by the positions or the paged cache): status "incomplete", with
    `incomplete_details` {"reason": "max_output_tokens"}, and its message item "incomplete" too; transformers said
    "completed" (its chat completions say `finish_reason` "length", by the same count). Any other response as it is."""
    if response["usage"]["output_tokens"] < max_new_tokens:  # set by `fitted_to_the_model`
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
    async def respond_reporting(self, request_id, engine, body, inputs, generation_kwargs, *args, **kwargs):
        reply = await respond(self, request_id, engine, body, inputs, generation_kwargs, *args, **kwargs)
        response = json.loads(reply.body)
        reported = reported_as_cut(response, generation_kwargs["max_new_tokens"])
        return reply if reported is response else JSONResponse(reported)

    return respond_reporting


def streaming_a_cut_answer_as_incomplete(respond):
    """`ResponseHandler._streaming` ending with a `response.incomplete` event where `reported_as_cut` says so, in
    place of `response.completed`, as OpenAI's stream of such an answer ends."""

    @functools.wraps(respond)
    def respond_reporting(self, request_id, engine, body, inputs, generation_kwargs, *args, **kwargs):
        reply = respond(self, request_id, engine, body, inputs, generation_kwargs, *args, **kwargs)
        reply.body_iterator = ending_as_reported(reply.body_iterator, generation_kwargs["max_new_tokens"])
        return reply

    return respond_reporting


async def ending_as_reported(chunks, max_new_tokens: int):
    """The chunks of a Responses stream (events `data: {...}`, each ended by a blank line), each event as
    `reported_event` gives it; closing it closes the stream (a client that leaves cancels the generation there).
    A chunk that ends the message (its `response.output_item.done`) waits for the next: where that one reports the
    answer cut, the message's item says "incomplete" there too. The last message ends after the generation, just
    before the final event, so nothing waits for a token."""
    held = None
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            chunk = each_event(chunk, reported_event, max_new_tokens)
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


def reported_event(event: str, max_new_tokens: int) -> str:
    """One event of a Responses stream: `response.completed` as `response.incomplete` where `reported_as_cut` says
    so, any other as it is."""
    if COMPLETED_EVENT not in event:
        return event
    completed = json.loads(event.removeprefix("data: "))
    response = reported_as_cut(completed["response"], max_new_tokens)
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
