"""`hf-scratch serve`: transformers' OpenAI-compatible server on a saved Scratch folder, started for real as a
subprocess on 127.0.0.1 and spoken to with the official `openai` client, with and without continuous batching.
Every answer must be the text of greedy `generate()` on the same prompt."""

import contextlib
import copy
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import psutil
import pytest
import torch
from forked_python import forked_command, run_python
from tiny_models import tiny_config
from tiny_tokenizers import byte_level_bpe
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from hf_scratch_transformer import ScratchDecoderForCausalLM, ScratchSeq2SeqForConditionalGeneration
from hf_scratch_transformer.conversion import to_hf
from tokenizer_training import padded_vocab_size, special_token_ids

pytestmark = pytest.mark.slow
NEW_TOKENS = 12
# Guards against a hang, not speed limits: on a busy machine (one core shared with two other processes) a server
# took 38-60 s to refuse its folder at start, and `--compile`'s first request, which compiles the decoding step, 107 s
# (26 s alone on the core): past the 60 s both had, and the test failed with "Request timed out".
START_TIMEOUT = 300  # seconds for the server to load the model and answer /health
REQUEST_TIMEOUT = 300  # seconds for an answer
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy, whatever the environment says
QUESTIONS = ["Who is there?", "What says the king?", "Speak, friend.", "Good morrow, cousin!"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny saved decoder with its tokenizer and a chat template. Its output layer only ever picks tokens that
    decode to printable ASCII, so that text streamed token by token is comparable exactly (a lone byte of a
    multi-byte character would be held back by the streaming decoder) and no EOS cuts an answer short."""
    return saved_decoder(tmp_path_factory.mktemp("served"), max_position_embeddings=128,
                         position_embedding_type="rope", num_key_value_heads=2)


def saved_decoder(path, **config_fields):
    """`folder`'s model and tokenizer with `config_fields`, saved in `path`."""
    tokenizer = copy.deepcopy(byte_level_bpe())
    tokenizer.chat_template = CHAT_TEMPLATE
    config = tiny_config("decoder", vocab_size=padded_vocab_size(tokenizer), tie_word_embeddings=False,
                         initializer_range=0.5, **special_token_ids(tokenizer), **config_fields)
    torch.manual_seed(0)
    model = ScratchDecoderForCausalLM(config).eval()
    printable = [token for token in range(len(tokenizer)) if _is_printable(tokenizer.decode([token]))]
    keep = torch.zeros(config.vocab_size, dtype=torch.bool)
    keep[printable] = True
    with torch.no_grad():
        model.lm_head.weight[~keep] = 0.0  # logit 0, below the best of ~200 random ones
    model.generation_config.do_sample = False
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def exported_to_native(folder, path):
    """`folder`'s model exported to its native class (`hf-scratch convert`), saved with its tokenizer in `path`."""
    to_hf(AutoModelForCausalLM.from_pretrained(folder)).save_pretrained(path)
    AutoTokenizer.from_pretrained(folder).save_pretrained(path)
    return path


def _is_printable(text: str) -> bool:
    return bool(text) and all(" " <= char <= "~" or char == "\n" for char in text)


@pytest.fixture(scope="module")
def expected(folder):
    """What greedy `generate()` answers, loading the folder as a user would: chat and plain completions."""
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)

    def answer(inputs) -> str:
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
        return tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)

    chat = {
        question: answer(tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt",
            return_dict=True,
        ))
        for question in QUESTIONS
    }
    plain = {question: answer(tokenizer(question, return_tensors="pt")) for question in QUESTIONS}
    assert len(set(chat.values())) > 1 and all(chat.values())  # answers that tell the prompts apart
    return {"chat": chat, "plain": plain}


def _serve_command(folder, port: int) -> list[str]:
    """The command line of `hf-scratch serve FOLDER`, or of a server that loads what each request names (`None`)."""
    return [sys.executable, "-m", "hf_scratch_transformer.cli", "serve", *([] if folder is None else [str(folder)]),
            "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module", params=["generate", "continuous-batching"])
def server(request, folder):
    """`hf-scratch serve FOLDER` on a free loopback port; yields an `openai` client, then stops the server."""
    options = []
    if request.param == "continuous-batching":
        options = ["--continuous-batching", "--cb-num-blocks", "16", "--cb-max-batch-tokens", "64"]
    # a fresh interpreter: test_memory_stays_flat_over_prompts_of_new_lengths measures the server's own process
    with _running(folder, options, folder.parent / f"server-{request.param}.log", forked=False) as client:
        yield client


@contextlib.contextmanager
def _running(folder, options: list[str], log, env: dict | None = None, forked: bool = True):
    """`hf-scratch serve [FOLDER] OPTIONS` on a free loopback port, its output in `log` (a file: a pipe nobody reads
    could fill and block it), `env` added to its environment; yields an `openai` client, then stops the server.
    `forked`: the server forked from forked_python's (a fresh interpreter spent 9-21 s importing before it served)."""
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    command = _serve_command(folder, port) + options
    with open(log, "w") as output:
        process = subprocess.Popen(forked_command(command) if forked else command, env=env, stdout=output,
                                   stderr=subprocess.STDOUT)
    try:
        _wait_until_healthy(process, port, log)
        yield openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=REQUEST_TIMEOUT,
            http_client=openai.DefaultHttpxClient(trust_env=False),  # loopback only, whatever proxy is configured
        )
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_healthy(process: subprocess.Popen, port: int, log) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the server exited with {process.returncode}:\n{log.read_text()}")
        try:
            with LOOPBACK.open(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"the server did not answer within {START_TIMEOUT} s:\n{log.read_text()}")


def _chat(client, model: str, question: str, stream: bool, max_tokens: int | None = NEW_TOKENS) -> str:
    messages = [{"role": "user", "content": question}]
    response = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=stream
    )
    if not stream:
        return response.choices[0].message.content
    return "".join(chunk.choices[0].delta.content or "" for chunk in response if chunk.choices)


def test_chat_completions_equal_generate(server, folder, expected):
    for question in QUESTIONS[:2]:
        assert _chat(server, str(folder), question, stream=False) == expected["chat"][question]
        assert _chat(server, str(folder), question, stream=True) == expected["chat"][question]


def test_concurrent_requests_each_get_their_own_answer(server, folder, expected):
    jobs = [(question, stream) for question in QUESTIONS for stream in (False, True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: _chat(server, str(folder), *job), jobs))
    assert answers == [expected["chat"][question] for question, _ in jobs]


def test_plain_completions_equal_generate(server, folder, expected):
    for question in QUESTIONS[:2]:
        response = server.completions.create(model=str(folder), prompt=question, max_tokens=NEW_TOKENS, temperature=0)
        assert response.choices[0].text == expected["plain"][question]


def test_several_api_servers_answer_and_refuse_as_one(folder, expected, tmp_path):
    """`--api-server-count 2` (transformers 5.25): two API-server processes, spawned, share the model's process. Each
    has the Scratch class and the checks of each request (it imports them as it unpickles our loader): the answers
    are greedy `generate()`'s, chat and plain, and a request a model cannot answer is a 400 naming the problem."""
    log = tmp_path / "server.log"
    with _running(folder, ["--api-server-count", "2"], log) as client:
        for question in QUESTIONS[:2]:
            assert _chat(client, str(folder), question, stream=True) == expected["chat"][question]
            answer = client.completions.create(model=str(folder), prompt=question, max_tokens=NEW_TOKENS,
                                               temperature=0)
            assert answer.choices[0].text == expected["plain"][question]
            with pytest.raises(openai.BadRequestError) as refusal:
                client.completions.create(model=str(folder), prompt=question, max_tokens=0)
            reason = refusal.value.response.json()["detail"]  # ours, before the request reaches the model
            assert reason.startswith("invalid generation settings") and "`max_new_tokens` must be greater" in reason
    assert "Traceback" not in log.read_text()


def test_a_requests_length_is_honoured_and_an_answer_it_ends_reported_as_openai_does(server, folder):
    """A request's own `generation_config` may give its length as `max_length` (prompt included): transformers' default
    count of new tokens (1024) went with it to `generate()`, where a count wins over a length, and continuous batching
    reads a count only. Without a length the answer runs to the end of the text (EOS) or of the model's 128 positions,
    `finish_reason` "stop" where EOS ended it. `/v1/responses` said status "completed" for an answer ended by
    `max_output_tokens`, where OpenAI's API says "incomplete" with the reason (streamed: a last `response.incomplete`
    event), and so does its message item (it said "completed", in the response and in the stream's
    `response.output_item.done`); an answer that stopped at EOS before its limit stays "completed"."""
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    question = QUESTIONS[1]
    prompt = tokenizer(question, return_tensors="pt")
    length = prompt["input_ids"].shape[1]
    greedy = model.generate(**prompt, max_new_tokens=128 - length, do_sample=False)[0, length:]
    given = {"generation_config": json.dumps({"max_length": length + 7, "do_sample": False})}
    answer = server.completions.create(model=str(folder), prompt=question, extra_body=given)
    assert answer.choices[0].text == tokenizer.decode(greedy[:7], skip_special_tokens=True)
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 7
    given = {"generation_config": json.dumps({"do_sample": False})}
    answer = server.completions.create(model=str(folder), prompt=question, extra_body=given)
    assert answer.choices[0].text == tokenizer.decode(greedy, skip_special_tokens=True)
    ended_by_eos = greedy[-1].item() == tokenizer.eos_token_id
    assert answer.choices[0].finish_reason == ("stop" if ended_by_eos else "length")

    answer = server.responses.create(model=str(folder), input=question, max_output_tokens=5, stream=False)
    assert answer.status == "incomplete" and answer.incomplete_details.reason == "max_output_tokens"
    assert answer.usage.output_tokens == 5 and _message_statuses(answer) == ["incomplete"]
    *events, last = server.responses.create(model=str(folder), input=question, max_output_tokens=5, stream=True)
    assert last.type == "response.incomplete" and last.response.status == "incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens" and last.response.usage.output_tokens == 5
    assert _message_statuses(last.response) == ["incomplete"] == _streamed_message_statuses(events)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)
    third_token = model.generate(**chat, max_new_tokens=3, do_sample=False)[0, -1].item()
    stopping = {"generation_config": json.dumps({"max_new_tokens": 12, "eos_token_id": third_token,
                                                 "do_sample": False})}
    answer = server.responses.create(model=str(folder), input=question, stream=False, extra_body=stopping)
    assert answer.status == "completed" and answer.incomplete_details is None and answer.usage.output_tokens <= 3
    assert _message_statuses(answer) == ["completed"]
    *events, last = server.responses.create(model=str(folder), input=question, stream=True, extra_body=stopping)
    assert last.type == "response.completed" and last.response.status == "completed"
    assert _message_statuses(last.response) == ["completed"] == _streamed_message_statuses(events)


def test_a_requests_count_of_new_tokens_wins_over_the_folders(tmp_path):
    """A folder whose generation_config.json sets `max_new_tokens` (as `generate()` reads it): a request's
    `max_tokens` is its own count, as `generate(max_new_tokens=...)` takes it over the folder's, and a request that
    gives no count gets at least transformers serve's 1024 (5.25), here to the end of the context: the server's
    `--max-model-len` 64, within the model's 128 positions. A prompt that fills it is transformers' 400."""
    folder = saved_decoder(tmp_path / "counted", max_position_embeddings=128, position_embedding_type="rope")
    generation_config = GenerationConfig.from_pretrained(folder)
    generation_config.max_new_tokens = 6
    generation_config.save_pretrained(folder)
    with _running(folder, ["--max-model-len", "64"], tmp_path / "server.log") as client:
        answer = client.completions.create(model=str(folder), prompt=QUESTIONS[0], max_tokens=3, temperature=0)
        assert answer.usage.completion_tokens == 3 and answer.choices[0].finish_reason == "length"
        given = {"generation_config": json.dumps({"do_sample": False})}
        answer = client.completions.create(model=str(folder), prompt=QUESTIONS[0], extra_body=given)
        assert answer.usage.total_tokens == 64 and answer.choices[0].finish_reason == "length"
        with pytest.raises(openai.BadRequestError) as refusal:
            client.completions.create(model=str(folder), prompt=" ".join(QUESTIONS * 4), max_tokens=2)
        assert "takes at most 64, prompt and answer" in refusal.value.response.json()["detail"]


def _message_statuses(response) -> list[str]:
    """The status of each message item of a Responses API `response`."""
    return [item.status for item in response.output if item.type == "message"]


def _streamed_message_statuses(events) -> list[str]:
    """The status of each message item that a Responses stream's `response.output_item.done` events give."""
    return [event.item.status for event in events if event.type == "response.output_item.done"
            and event.item.type == "message"]


def test_memory_stays_flat_over_prompts_of_new_lengths(server, folder):
    """Each new prompt length is a new shape of product, for which oneDNN builds and keeps a kernel (about 0.5 MB,
    1024 of them by default): the server grew by about 1 MB a request where native GPT-2's stays flat. Bounded
    (`linear_kernels.bound_onednn_caches`), it stays flat. Prompts past FEW_ROWS tokens: prefill's products."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(" ".join(QUESTIONS * 20))["input_ids"]
    prompts = {len(tokenizer(text)["input_ids"]): text for text in (tokenizer.decode(ids[:n]) for n in range(65, 121))}
    prompts = [text for length, text in sorted(prompts.items()) if length > 64]
    assert len(prompts) >= 40
    (process,) = [child for child in psutil.Process().children() if "serve" in child.cmdline()]

    def complete(prompt_texts):
        for prompt in prompt_texts:
            server.completions.create(model=str(folder), prompt=prompt, max_tokens=1, temperature=0)
        return process.memory_info().rss / 2**20

    settled = complete(prompts[:10])
    assert complete(prompts[10:]) - settled < 30  # MiB over 30 or more new lengths; unbounded: about 1 each


def test_compile_compiles_decoding_on_the_cpu_with_the_answers_of_generate(folder, expected, tmp_path):
    """`--compile` on a CPU: transformers alone would decode eagerly over a static cache; ours compiles the decoding
    step (inductor writes its kernels into the server's own cache folder), and the answers stay greedy `generate()`'s.
    One prompt, streamed and not. The requests for the largest cache come first: the cache is kept for later ones,
    so one compilation serves them all (a larger cache after a smaller one compiles again, 20 s here).
    `generate()` allocates the static cache for the prompt and the whole answer, and keeps the largest it allocated:
    on this RoPE model (no positions to end the answer) a huge `max_tokens` (or a request's own `max_cache_len`)
    failed to allocate it, a bare 500, and so did every later request. A static cache holds the model's
    `max_position_embeddings` (128) at most: the answer ends there (`finish_reason` "length"), a longer prompt is a
    400, and the server answers on."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    inductor_cache = tmp_path / "inductor"
    log = tmp_path / "server.log"
    with _running(folder, ["--compile"], log, {"TORCHINDUCTOR_CACHE_DIR": str(inductor_cache)}) as client:
        question = QUESTIONS[0]
        given = {"generation_config": json.dumps({"max_new_tokens": 4, "max_cache_len": 10**9, "do_sample": False})}
        answer = client.completions.create(model=str(folder), prompt=question, extra_body=given)
        assert expected["plain"][question].startswith(answer.choices[0].text) and answer.usage.completion_tokens == 4
        answer = client.completions.create(model=str(folder), prompt=question, max_tokens=10**9, temperature=0)
        assert answer.choices[0].text.startswith(expected["plain"][question])
        assert answer.choices[0].finish_reason == "length" and answer.usage.total_tokens == 128
        assert _chat(client, str(folder), question, stream=False) == expected["chat"][question]
        assert _chat(client, str(folder), question, stream=True) == expected["chat"][question]
        long_prompt = " ".join(QUESTIONS * 10)
        assert len(tokenizer(long_prompt)["input_ids"]) > 128
        with pytest.raises(openai.BadRequestError) as refusal:
            client.completions.create(model=str(folder), prompt=long_prompt, max_tokens=2)
        assert "takes at most 128, prompt and answer" in refusal.value.response.json()["detail"]
        assert _chat(client, str(folder), question, stream=False) == expected["chat"][question]
    assert any(inductor_cache.rglob("*.py")), "nothing was compiled"
    assert "Traceback" not in log.read_text()


def test_chat_without_a_chat_template_or_max_tokens_0_is_answered_400_naming_it(folder, expected, tmp_path):
    """A base model's tokenizer has no chat template (none that `hf-scratch` trains has one): chat and Responses
    requests, streamed or not, were answered a bare 500 with `apply_chat_template`'s traceback in the server's log,
    and so were `max_tokens` 0 or negative (streamed: an error event), and settings that could not be read (a
    request's own `generation_config` that `GenerationConfig` rejects or that is no JSON object, a `temperature` that
    is no number). Each gets a 400 giving the reason, and the server answers on."""
    base = tmp_path / "base"
    shutil.copytree(folder, base)
    (base / "chat_template.jinja").unlink()
    log = tmp_path / "server.log"
    with _running(base, [], log) as client:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as refusal:
                _chat(client, str(base), QUESTIONS[0], stream=stream)
            assert "tokenizer has no chat template" in refusal.value.response.json()["detail"]
            assert "/v1/completions" in refusal.value.response.json()["detail"]
            with pytest.raises(openai.BadRequestError) as refusal:
                client.responses.create(model=str(base), input=QUESTIONS[0], max_output_tokens=NEW_TOKENS,
                                        stream=stream)
            assert "tokenizer has no chat template" in refusal.value.response.json()["detail"]
        for max_tokens in (0, -1):
            with pytest.raises(openai.BadRequestError) as refusal:
                client.completions.create(model=str(base), prompt="Hi", max_tokens=max_tokens)
            assert "`max_new_tokens` must be greater than 0" in refusal.value.response.json()["detail"]
        # The same settings in the request's own `generation_config`, one that is no JSON object, a value that is no
        # number: bare 500s, as they failed while the settings were read.
        unreadable = [({"generation_config": '{"max_new_tokens": 0}'}, "`max_new_tokens` must be greater than 0"),
                      ({"generation_config": "{not json"}, "Expecting property name"),
                      ({"generation_config": "[1]"}, "must be a mapping"),
                      ({"temperature": "hot"}, "could not convert string to float")]
        for given, reason in unreadable:
            for stream in (False, True):
                with pytest.raises(openai.BadRequestError) as refusal:
                    client.completions.create(model=str(base), prompt="Hi", stream=stream, extra_body=given)
                assert reason in refusal.value.response.json()["detail"]
        question = QUESTIONS[0]
        answer = client.completions.create(model=str(base), prompt=question, max_tokens=NEW_TOKENS, temperature=0)
        assert answer.choices[0].text == expected["plain"][question]
    assert "Traceback" not in log.read_text()


def text_of(tokenizer, length: int) -> str:
    """A text that `tokenizer` reads as exactly `length` tokens."""
    return next(text for n in range(length) if len(tokenizer(text := "a" + " a" * n).input_ids) == length)


@pytest.mark.parametrize("native", [False, True], ids=["scratch", "native-gpt2"])
@pytest.mark.parametrize("options", [[], ["--continuous-batching", "--cb-num-blocks", "16"]], ids=["generate", "cb"])
def test_answers_end_where_the_models_positions_do_and_a_prompt_past_them_is_answered_400(options, native, tmp_path):
    """A model of 32 learned positions: a request without `max_tokens` asks for 1024 new tokens, and one that reached
    the last position failed part-way (a bare 500, streamed an error event; under continuous batching the worker stopped
    for good), and so did one whose own `generation_config` gave a `max_length` past them under continuous batching
    (without: `finish_reason` "stop"), or gave no length at all (a bare 500). The answer now ends where the positions
    do, as `generate()` with the room left, with `finish_reason` "length", on every route; a prompt that leaves no room
    is a 400 (transformers' own check from 5.25 on), and the server answers on. The same model exported to GPT-2
    (`hf-scratch convert`), whose positions are its `wpe` table, had no check at all: each such request failed with an
    IndexError (a bare 500), and under continuous batching the first one stopped the worker for good (503 "CB worker is
    dead")."""
    folder = saved_decoder(tmp_path / "learned", max_position_embeddings=32, position_embedding_type="learned")
    if native:
        folder = exported_to_native(folder, tmp_path / "gpt2")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    question = QUESTIONS[0]
    prompt = tokenizer(question, return_tensors="pt")
    room = 32 - prompt["input_ids"].shape[1]
    filled = model.generate(**prompt, max_new_tokens=room, do_sample=False)[0, -room:]

    def to_the_end(inputs) -> str:
        left = 32 - inputs["input_ids"].shape[1]
        return tokenizer.decode(model.generate(**inputs, max_new_tokens=left, do_sample=False)[0, -left:],
                                skip_special_tokens=True)

    longer = QUESTIONS[3]  # past the room of the first request, whose count continuous batching takes as its own
    longer_filled = to_the_end(tokenizer(longer, return_tensors="pt"))
    chat_filled = to_the_end(tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                           add_generation_prompt=True, return_tensors="pt",
                                                           return_dict=True))
    log = tmp_path / "server.log"
    with _running(folder, options, log) as client:
        for max_tokens in (None, 100):
            answer = client.completions.create(model=str(folder), prompt=question, max_tokens=max_tokens,
                                               temperature=0)
            assert answer.choices[0].text == tokenizer.decode(filled, skip_special_tokens=True)
            assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == room
        streamed = client.completions.create(model=str(folder), prompt=question, temperature=0, stream=True)
        assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == answer.choices[0].text
        given = {"generation_config": json.dumps({"max_length": 100, "do_sample": False})}
        answer = client.completions.create(model=str(folder), prompt=longer, extra_body=given)
        assert answer.choices[0].text == longer_filled and answer.choices[0].finish_reason == "length"
        given = {"generation_config": json.dumps({"do_sample": False})}  # transformers' 1024 new tokens
        answer = client.completions.create(model=str(folder), prompt=question, extra_body=given)
        assert answer.choices[0].text == tokenizer.decode(filled, skip_special_tokens=True)
        assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == room
        assert _chat(client, str(folder), question, stream=True, max_tokens=None) == chat_filled
        answer = client.responses.create(model=str(folder), input=question, stream=False)
        assert answer.output_text == chat_filled and answer.usage.total_tokens == 32
        assert answer.status == "incomplete" and answer.incomplete_details.reason == "max_output_tokens"
        # Far past the positions, and filling them exactly: no room is left for one new token either way.
        for prompt, stream in itertools.product((" ".join(QUESTIONS * 4), text_of(tokenizer, 32)), (False, True)):
            with pytest.raises(openai.BadRequestError) as refusal:
                client.completions.create(model=str(folder), prompt=prompt, max_tokens=2, stream=stream)
            assert "takes at most 32, prompt and answer" in refusal.value.response.json()["detail"]
        answer = client.completions.create(model=str(folder), prompt=question, max_tokens=4, temperature=0)
        assert answer.choices[0].text == tokenizer.decode(filled[:4], skip_special_tokens=True)
    assert "Traceback" not in log.read_text()


def test_answers_end_where_the_paged_cache_does_and_a_prompt_past_it_is_answered_400(folder, tmp_path):
    """Under continuous batching a request holds its prompt and answer (all but the last token) in the paged cache,
    here 2 blocks of 16 tokens. One larger than the cache stopped the batching worker for good: every later request
    was answered 503 "CB worker is dead", and so was /health. The answer now ends where the cache does, as
    `generate()` with the room left, with `finish_reason` "length" (the first request, before the worker has built
    its cache, and later ones, streamed or not); a prompt past the cache is a 400 naming both sizes; the server
    answers on."""
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    question = QUESTIONS[0]
    prompt = tokenizer(question, return_tensors="pt")
    room = 32 + 1 - prompt["input_ids"].shape[1]
    new_tokens = model.generate(**prompt, max_new_tokens=room, do_sample=False)[0, -room:]
    filled = tokenizer.decode(new_tokens, skip_special_tokens=True)
    long_prompt = text_of(tokenizer, 60)  # within the model's 128 positions, past the cache's 32 tokens
    log = tmp_path / "server.log"
    options = ["--continuous-batching", "--cb-num-blocks", "2", "--cb-block-size", "16"]
    with _running(folder, options, log) as client:
        for _ in range(2):
            answer = client.completions.create(model=str(folder), prompt=question, max_tokens=100, temperature=0)
            assert answer.choices[0].text == filled
            assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == room
        streamed = client.completions.create(model=str(folder), prompt=question, max_tokens=100, temperature=0,
                                             stream=True)
        assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == filled
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as refusal:
                client.completions.create(model=str(folder), prompt=long_prompt, max_tokens=2, stream=stream)
            reason = refusal.value.response.json()["detail"]
            assert f"the prompt is {len(tokenizer(long_prompt)['input_ids'])} tokens" in reason
            assert "paged cache of continuous batching holds 32 tokens" in reason
        answer = client.completions.create(model=str(folder), prompt=question, max_tokens=4, temperature=0)
        assert answer.choices[0].text == tokenizer.decode(new_tokens[:4], skip_special_tokens=True)
        assert answer.choices[0].finish_reason == "length"
        with LOOPBACK.open(f"{client.base_url}".removesuffix("/v1/") + "/health", timeout=10) as health:
            assert health.status == 200
    assert "Traceback" not in log.read_text()


def test_a_folder_that_is_not_a_causal_lm_is_refused_at_start(tmp_path):
    """`transformers serve` answers with `generate()` cut at the prompt's length: an encoder-decoder's non-streamed
    answers came back empty (its output starts a new sequence), a classifier's requests failed later. Refused."""
    tokenizer = byte_level_bpe(family="seq2seq")
    config = tiny_config("seq2seq", vocab_size=len(tokenizer), decoder_start_token_id=tokenizer.bos_token_id)
    ScratchSeq2SeqForConditionalGeneration(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = run_python(_serve_command(tmp_path, _free_port()), cwd=tmp_path, env=env, timeout=START_TIMEOUT)
    assert result.returncode == 2  # a bad argument, as a missing folder (1 until 2026-11-30)
    assert "ScratchSeq2SeqForConditionalGeneration" in result.stderr and "causal" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("options", [[], ["--continuous-batching", "--cb-num-blocks", "16"]],
                         ids=["generate", "continuous-batching"])
def test_a_prompt_holding_a_token_past_the_models_vocabulary_is_answered_400(options, tmp_path):
    """Tokens added to the tokenizer after the model was saved, its embeddings not resized: a prompt holding one was
    answered a bare 500, and under continuous batching it stopped the generation loop (every later request 503).
    It is a 400 naming both counts; prompts of the model's own tokens are served on."""
    tokenizer = copy.deepcopy(byte_level_bpe())
    tokenizer.add_tokens([f"<added {i}>" for i in range(30)])  # 330 tokens
    folder = tmp_path / "model"
    ScratchDecoderForCausalLM(tiny_config("decoder", vocab_size=320)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    log = tmp_path / "server.log"
    with _running(folder, options, log) as client:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as refusal:
                client.completions.create(model=str(folder), prompt="to be <added 29>", max_tokens=2, stream=stream)
            reason = refusal.value.response.json()["detail"]
            assert "token id 329, and the model has 320 embedding rows" in reason and "330 tokens" in reason, reason
            assert "resize_token_embeddings" in reason
        answer = client.completions.create(model=str(folder), prompt="to be", max_tokens=3, temperature=0)
        assert answer.usage.completion_tokens == 3
    assert "Traceback" not in log.read_text()


def test_a_request_for_a_folder_that_is_not_a_causal_lm_is_answered_400_naming_it(tmp_path):
    """A server started without a folder loads what each request names: a seq2seq folder was refused in the server's
    log only, and the client got a bare 500 'Internal Server Error'. It gets a 400 that names the class; asked to
    load it ahead (`/load_model`, transformers 5.25's stream of loading events), the server's answer is an error event
    that names it."""
    tokenizer = byte_level_bpe(family="seq2seq")
    config = tiny_config("seq2seq", vocab_size=len(tokenizer), decoder_start_token_id=tokenizer.bos_token_id)
    ScratchSeq2SeqForConditionalGeneration(config).save_pretrained(tmp_path / "seq2seq")
    tokenizer.save_pretrained(tmp_path / "seq2seq")
    with _running(None, [], tmp_path / "server.log") as client:
        with pytest.raises(openai.BadRequestError) as refusal:
            client.completions.create(model=str(tmp_path / "seq2seq"), prompt="Hi", max_tokens=2)
        load = urllib.request.Request(str(client.base_url).removesuffix("/v1/") + "/load_model", method="POST",
                                      data=json.dumps({"model": str(tmp_path / "seq2seq")}).encode(),
                                      headers={"Content-Type": "application/json"})
        with LOOPBACK.open(load, timeout=REQUEST_TIMEOUT) as stream:
            events = [json.loads(line.removeprefix(b"data: ")) for line in stream.read().splitlines() if line]
    assert refusal.value.status_code == 400
    reason = refusal.value.response.json()["detail"]
    assert "ScratchSeq2SeqForConditionalGeneration" in reason and "causal" in reason
    assert [event["status"] for event in events] == ["error"]
    assert "ScratchSeq2SeqForConditionalGeneration" in events[0]["message"]


# `hf-scratch serve ARGS...` where transformers[serving] is not installed: its packages cannot be imported.
SERVE_WITHOUT_THE_EXTRA = """
import sys
for name in ("fastapi", "uvicorn", "openai"):
    sys.modules[name] = None
from hf_scratch_command import main
main(["serve", *sys.argv[1:]])
"""

# ... where openai 1.98 is installed, which transformers[serving] admits but its server cannot import.
SERVE_WITH_OPENAI_1_98 = """
import importlib.metadata, sys
installed = importlib.metadata.version
importlib.metadata.version = lambda name: "1.98.0" if name == "openai" else installed(name)
from hf_scratch_command import main
main(["serve", *sys.argv[1:]])
"""


@pytest.mark.parametrize("serve, refusal", [
    (SERVE_WITHOUT_THE_EXTRA, 'missing dependencies for serving: pip install "transformers[serving]"'),
    (SERVE_WITH_OPENAI_1_98, "transformers' server needs openai>=1.99, and 1.98.0 is installed: "
                             "pip install 'openai>=1.99'"),
])
def test_help_is_answered_without_the_serving_extra_and_serving_is_refused_in_one_line(serve, refusal, tmp_path):
    """`hf-scratch serve --help` exited 1 with 'pip install "transformers[serving]"' where the extra is not
    installed: only serving needs it. With openai 1.98 the server's import failed with a traceback."""
    script = tmp_path / "serve_in_this_environment.py"
    script.write_text(serve)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    helped = run_python([sys.executable, script, "--help"], cwd=tmp_path, env=env, timeout=START_TIMEOUT)
    assert helped.returncode == 0 and "--continuous-batching" in helped.stdout, helped.stderr
    refused = run_python([sys.executable, script, "model"], cwd=tmp_path, env=env, timeout=START_TIMEOUT)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == f"hf-scratch serve: error: {refusal}", refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.parametrize("given, reason", [
    ("missing/model/folder", "folder missing/model/folder does not exist"),
    ("model/modl", "folder model/modl does not exist (its parent folder does: a mistyped name?)"),
    ("modl", "folder modl does not exist, and with HF_HUB_OFFLINE set a Hub model must be in the local Hub cache"),
    (".", ". holds no config.json"),
    ("model", "model holds no tokenizer"),
])
def test_a_model_that_is_neither_a_folder_nor_a_hub_id_is_refused_at_start(tmp_path, given, reason):
    """A mistyped folder (or a file, or a folder without config.json) went to the Hub as a repo id, and the server
    stopped with a traceback ending in 'Repo id must be in the form ...'; a model folder without its tokenizer (a bare
    checkpoint) with one ending in 'Unrecognized processing class', a folder named with '@' with the first error as it
    was read as a revision; a mistyped name that could be a Hub id went to the Hub, and stopped with a traceback
    ending in "We couldn't connect to 'https://huggingface.co'". Refused as a bad argument, naming the path."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model/config.json").write_text("{}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "200"}
    command = _serve_command(given, _free_port())
    result = run_python(command, cwd=tmp_path, env=env, timeout=START_TIMEOUT)
    assert result.returncode == 2, result.stderr
    assert reason in result.stderr and "Traceback" not in result.stderr, result.stderr



def test_a_request_for_a_model_that_cannot_load_is_answered_400_naming_it(folder, expected, tmp_path):
    """A server started without a folder loads what each request names: a missing folder, one without a tokenizer
    or a file got a bare 500 (the reason in the server's log only); each is refused with a 400 naming it, as at
    start. A folder named with '@' is a path, not a revision."""
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare/config.json").write_text((folder / "config.json").read_text())
    (tmp_path / "run@2").symlink_to(folder, target_is_directory=True)
    refused = {tmp_path / "missing": f"folder {tmp_path / 'missing'} does not exist",
               tmp_path / "bare": f"{tmp_path / 'bare'} holds no tokenizer (tokenizer_config.json)",
               folder / "config.json": f"{folder / 'config.json'} is a file, not a model folder"}
    with _running(None, [], tmp_path / "server.log") as client:
        for model, reason in refused.items():
            with pytest.raises(openai.BadRequestError) as refusal:
                client.completions.create(model=str(model), prompt="Hi", max_tokens=2)
            assert reason in refusal.value.response.json()["detail"]
        with pytest.raises(openai.UnprocessableEntityError) as refusal:  # the request's own fault comes first
            client.completions.create(model=str(tmp_path / "missing"), prompt="Hi", extra_body={"no_such_field": 1})
        assert "no_such_field" in refusal.value.response.json()["detail"]
        question = QUESTIONS[0]
        answer = client.completions.create(model=str(tmp_path / "run@2"), prompt=question, max_tokens=NEW_TOKENS,
                                           temperature=0)
        assert answer.choices[0].text == expected["plain"][question]
