"""Hub publishing (SPEC section 8): a model card rendered from `model_cards/template.md`, the list of files a
saved folder would upload, and the upload itself through `huggingface_hub`.

No model file imports this module, so it never travels to the Hub.
"""

import json
import re
import shutil
from importlib.metadata import requires
from importlib.resources import files
from pathlib import Path

import yaml
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, EvalResult, HfApi, ModelCard, ModelCardData
from huggingface_hub.utils import filter_repo_objects, validate_repo_id
from packaging.requirements import Requirement
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from tokenizer_training import TOKENIZER_FILES

from .modeling_scratch_common import safetensors_error
from .pipeline_scratch_text2text import ABSOLUTE_POSITIONS

TEMPLATE = files("hf_scratch_transformer.model_cards") / "template.md"  # package data (pyproject.toml)

# What each task puts in the card: the class and Auto class, the pipeline shown in "How to use", and the Hub's
# task ids for `pipeline_tag` and `model-index`. transformers 5 has no translation pipeline, so the seq2seq family
# is driven by its own `scratch-text2text` task.
TASKS = {
    "causal-lm": dict(
        family_description="A decoder-only causal language model",
        model_class="ScratchDecoderForCausalLM",
        auto_class="AutoModelForCausalLM",
        pipeline_task="text-generation",
        pipeline_call='print(pipe("To be, or not to be", max_new_tokens=40)[0]["generated_text"])',
        hub_task="text-generation",
    ),
    "masked-lm": dict(
        family_description="An encoder-only masked language model",
        model_class="ScratchEncoderForMaskedLM",
        auto_class="AutoModelForMaskedLM",
        pipeline_task="fill-mask",
        pipeline_call='print(pipe(f"The capital of France is {pipe.tokenizer.mask_token}."))',
        hub_task="fill-mask",
    ),
    "seq2seq": dict(
        family_description="An encoder-decoder sequence-to-sequence model",
        model_class="ScratchSeq2SeqForConditionalGeneration",
        auto_class="AutoModelForSeq2SeqLM",
        pipeline_task="scratch-text2text",
        pipeline_call='print(pipe("The house is wonderful.", max_new_tokens=40)[0]["generated_text"])',
        hub_task="translation",
    ),
    # Fine-tuned heads (`hf-scratch finetune`); the card names the model's own class (encoder or decoder family).
    "text-classification": dict(
        family_description="A text classifier",
        model_class="ScratchEncoderForSequenceClassification",
        auto_class="AutoModelForSequenceClassification",
        pipeline_task="text-classification",
        pipeline_call='print(pipe("To be, or not to be"))',
        hub_task="text-classification",
    ),
    "token-classification": dict(
        family_description="A token classifier",
        model_class="ScratchEncoderForTokenClassification",
        auto_class="AutoModelForTokenClassification",
        pipeline_task="token-classification",
        pipeline_call='print(pipe("Romeo and Juliet met in Verona"))',
        hub_task="token-classification",
    ),
    # transformers 5 has no question-answering pipeline: the example reads the span from the logits.
    "question-answering": dict(
        family_description="An extractive question-answering model",
        model_class="ScratchEncoderForQuestionAnswering",
        auto_class="AutoModelForQuestionAnswering",
        pipeline_task=None,
        pipeline_call='inputs = tokenizer("Where did Romeo meet Juliet?", "Romeo met Juliet in Verona.", '
                      'return_tensors="pt")\n'
                      "output = model(**inputs)\n"
                      "start, end = output.start_logits.argmax(-1).item(), output.end_logits.argmax(-1).item()\n"
                      'print(tokenizer.decode(inputs["input_ids"][0, start : end + 1]))',
        hub_task="question-answering",
    ),
    # Nor a multiple-choice one: the example pairs the prompt with each choice and scores the pairs as one row.
    "multiple-choice": dict(
        family_description="A multiple-choice model",
        model_class="ScratchEncoderForMultipleChoice",
        auto_class="AutoModelForMultipleChoice",
        pipeline_task=None,
        pipeline_call='prompt, choices = "Romeo met Juliet", ["in Verona.", "on the moon."]\n'
                      'inputs = tokenizer([prompt] * len(choices), choices, padding=True, return_tensors="pt")\n'
                      "output = model(**{name: tensor[None] for name, tensor in inputs.items()})  # one row of "
                      "choices\n"
                      "print(choices[output.logits.argmax(-1).item()])",
        hub_task="multiple-choice",
    ),
}

# The "How to use" of a native model (a folder `hf-scratch convert` exported), by task: (pipeline task, the call on
# it). transformers 5 has no pipeline for translation: there the example calls `generate` itself.
NATIVE_USAGE = {
    "causal-lm": ("text-generation", TASKS["causal-lm"]["pipeline_call"]),
    "masked-lm": ("fill-mask", TASKS["masked-lm"]["pipeline_call"]),
    "text-classification": ("text-classification", TASKS["text-classification"]["pipeline_call"]),
    "token-classification": ("token-classification", TASKS["token-classification"]["pipeline_call"]),
    "question-answering": (None, TASKS["question-answering"]["pipeline_call"]),
    "multiple-choice": (None, TASKS["multiple-choice"]["pipeline_call"]),
    "seq2seq": (None, 'inputs = tokenizer("The house is wonderful.", return_tensors="pt")\n'
                      "output = model.generate(**inputs, max_new_tokens=40)\n"
                      "print(tokenizer.decode(output[0], skip_special_tokens=True))"),
}

# eval_results key -> (Hub metric id, pretty name); other keys are used as they are.
METRICS = {
    "perplexity": ("perplexity", "Perplexity"),
    "eval_loss": ("loss", "Eval loss"),
    "mlm_accuracy": ("accuracy", "MLM accuracy"),
    "bleu": ("bleu", "BLEU"),
    "chrf": ("chrf", "chrF"),
    "accuracy": ("accuracy", "Accuracy"),
    "mse": ("mse", "Mean squared error"),
    "pearson": ("pearsonr", "Pearson correlation"),
    "spearman": ("spearmanr", "Spearman correlation"),
    "f1": ("f1", "Macro F1"),
    "entity_precision": ("precision", "Entity precision (seqeval)"),
    "entity_recall": ("recall", "Entity recall (seqeval)"),
    "entity_f1": ("f1", "Entity F1 (seqeval)"),
}
# A task's own names for its keys: a question-answering model's F1 is SQuAD's, over the words of its answers
TASK_METRICS = {"question-answering": {"exact_match": ("exact_match", "Exact match (SQuAD)"),
                                       "f1": ("f1", "F1 (SQuAD)")}}
# eval_results key -> the model-index `args` of its metric (what `evaluate`'s compute() would be given): the macro-F1
# of words or texts and seqeval's entity F1 are both of type "f1" in a token classifier's card.
METRIC_ARGS = {"f1": {"average": "macro"}}

# The config fields shown in the card's architecture table, when the family has them.
ARCHITECTURE_KNOBS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "encoder_layers", "decoder_layers", "num_attention_heads",
    "num_key_value_heads", "intermediate_size", "hidden_act", "norm_type", "norm_position",
    "position_embedding_type", "max_position_embeddings", "tie_word_embeddings",
)

# Training checkpoints (ours under checkpoints/, Trainer's checkpoint-N/), folders being written (NAME.tmp) or removed
# (NAME.deleted) and hidden files stay local, at any depth (`*` spans folders): a run whose output folder lay in the
# published one (`--output-dir MODEL/more`) had its optimizer and random states uploaded under more/checkpoints/.
IGNORE_PATTERNS = ["checkpoints/*", "*/checkpoints/*", "checkpoint-*/*", "*/checkpoint-*/*", "*.tmp/*", "*.deleted/*",
                   ".*", "*/.*"]

CONVERTED = "**Converted** by `hf-scratch convert`"  # how the card of a converted model begins, under its title
LOSS_CURVE = "loss_curve.png"  # a card shows it when its folder has it (`training.plot_loss_curve` writes it)

# The transformers releases the model code is tested with (pyproject.toml): it imports transformers 5's modules, so
# under transformers 4 a Hub user's load failed with an ImportError the card did not explain.
_TRANSFORMERS = next(requirement for requirement in map(Requirement, requires("hf-scratch-transformer"))
                    if requirement.name == "transformers" and not requirement.extras)
TRANSFORMERS_REQUIREMENT = "transformers" + ",".join(sorted(map(str, _TRANSFORMERS.specifier), reverse=True))  # >=,<
# What the card says of remote code (left out of the card of a native model that `hf-scratch convert` exported).
REMOTE_CODE_NOTE = (
    "The model code travels with the weights, so loading needs `trust_remote_code=True` (read the `*.py` files first) "
    f'and the transformers releases that code is tested with: `pip install "{TRANSFORMERS_REQUIREMENT}"`.'
)
# The note in a card of this or an earlier version (whose note ended at the `*.py` files).
_REMOTE_CODE_NOTE = re.compile(r"^The model code travels with the weights, so loading needs .*\n", re.MULTILINE)
REMOTE_CODE_LIMITATION = "Loading it runs the Python files in this repository (`trust_remote_code=True`)."

# The pattern transformers follows to copy sibling modules of the model code (dynamic_module_utils).
_RELATIVE_IMPORT = re.compile(r"^\s*from\s+\.(\S+)\s+import", re.MULTILINE)

# The line of the card's "How to use" (model_cards/template.md) that names the repo its example loads.
_USAGE_REPO_ID = re.compile(r'^repo_id = "(.*)"$', re.MULTILINE)

# Headings of a card's usage section: ours ("How to use") and those of other cards, e.g. huggingface_hub's template
# ("How to Get Started with the Model"). Not "Uses": that one is about intended uses.
_USAGE_HEADING = re.compile(r"(how to use|(example )?usage|how to get started.*|getting started|quick ?start)\W*",
                            re.IGNORECASE)
_HEADING = re.compile(r"^(#{1,6}) +(.*?)\s*$")


def default_repo_name(*parts: str) -> str:
    """A card's default title and repo id from its parts joined by '-', each without a Hub namespace, and with what a
    repo id cannot hold made '-' (a data file `my corpus.txt` gave a card whose usage loaded "gpt-mini-my corpus")."""
    name = "-".join(part.rsplit("/", 1)[-1] for part in parts)
    name = re.sub(r"[^\w.]+|-{2,}|\.{2,}", "-", name, flags=re.ASCII)  # '--' and '..' are forbidden too
    return re.sub(r"-{2,}", "-", name).strip("-.")[:96].strip("-.") or "model"


def positions_limitation(task: str, config: dict) -> str:
    """What a causal LM whose positions end (learned or sinusoidal, at `max_position_embeddings`) asks of its
    callers: transformers' text-generation pipeline asks for 256 new tokens unless told otherwise, and a generation
    that reaches the last position stops with our error, so a model of 128 positions failed the pipeline's default
    call whenever no end-of-text came first. RoPE and ALiBi have no last position; seq2seq's own pipeline keeps its
    default within the positions."""
    if task != "causal-lm" or config.get("position_embedding_type") not in ABSOLUTE_POSITIONS:
        return ""
    positions = config["max_position_embeddings"]
    return (f"It reads at most {positions} positions ({config['position_embedding_type']} position embeddings): "
            f"keep the prompt plus `max_new_tokens` within {positions}. A generation that reaches the last position "
            "stops with an error, and `pipeline(\"text-generation\")` asks for 256 new tokens unless given "
            "`max_new_tokens`. ")


def usage_example(repo_id: str, auto_class: str, pipeline_task: str | None, call: str, remote_code: bool) -> str:
    """The code block of a card's "How to use": load the model and tokenizer of `repo_id` with `auto_class`, then
    `call` (on `pipe`, the `pipeline_task` pipeline, or on `model` and `tokenizer` where there is none). Its
    `repo_id = "..."` line is the one `publish` points at the repo it uploads to (`_USAGE_REPO_ID`)."""
    remote = ", trust_remote_code=True" if remote_code else ""
    lines = [
        f"from transformers import {auto_class}, AutoTokenizer{', pipeline' if pipeline_task else ''}",
        "",
        f'repo_id = "{repo_id}"',
        f"model = {auto_class}.from_pretrained(repo_id{remote})",
        f"tokenizer = AutoTokenizer.from_pretrained(repo_id{remote})" + ("  # the config names our classes"
                                                                         if remote_code else ""),
        "",
        *([f'pipe = pipeline("{pipeline_task}", model=repo_id{remote})'] if pipeline_task else []),
        call,
    ]
    return "```python\n" + "\n".join(lines) + "\n```"


def write_model_card(
    folder,
    *,
    task: str,
    model_name: str,
    preset: str | None,
    config: dict,
    num_parameters: int,
    dataset: str,
    dataset_on_hub: bool = True,
    dataset_description: str = "",
    tokenizer_description: str = "",
    hyperparameters: dict,
    eval_results: dict[str, float],
    license: str = "apache-2.0",
    intended_use: str | None = None,
    limitations: str | None = None,
    model_class: str | None = None,
) -> ModelCard:
    """Render the model card of a trained model and write it to `folder/README.md`.

    `task` is "causal-lm", "masked-lm", "seq2seq", "text-classification", "token-classification" or "question-answering"
    (`model_class` names the model's class where the task's default does not); `model_name` titles the card and is the
    id in its usage snippet (give the Hub repo id, e.g. "user/scratch-gpt-shakespeare"); `config` is the model's config
    as a dict; `dataset` a `datasets` id or a short name, and `dataset_on_hub=False` says it names local data: the card
    names it but leaves it out of the `datasets` metadata, which the Hub links to hf.co/datasets/NAME (transformers'
    Trainer cards leave local data out too); `eval_results` maps metric keys ("perplexity", "eval_loss", "mlm_accuracy",
    "bleu", "chrf", "accuracy", "f1", ...) to values, which also go to the `model-index` metadata. A
    `folder/loss_curve.png` is shown when present. The template is package data (`TEMPLATE`), so cards are written from
    an installed wheel as from a checkout.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    folder, spec = Path(folder), TASKS[task]
    results = []
    task_metrics = TASK_METRICS.get(task, {})
    for key, value in eval_results.items():
        metric_type, metric_name = task_metrics.get(key) or METRICS.get(key, (key, key))
        results.append(EvalResult(
            task_type=spec["hub_task"], dataset_type=dataset, dataset_name=dataset, metric_type=metric_type,
            metric_value=value, metric_name=metric_name,
            metric_args=None if key in task_metrics else METRIC_ARGS.get(key),
        ))
    card_data = ModelCardData(
        model_name=model_name,
        library_name="transformers",
        license=license,
        tags=["hf-scratch-transformer", spec["hub_task"]],
        datasets=[dataset] if dataset_on_hub else None,
        pipeline_tag=spec["hub_task"],
        eval_results=results or None,  # an empty model-index is invalid metadata
    )
    card = ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE),
        **spec | ({"model_class": model_class} if model_class else {}),
        model_name=model_name,  # to_dict() moves it into model-index
        usage=usage_example(model_name, spec["auto_class"], spec["pipeline_task"], spec["pipeline_call"], True),
        remote_code_note=REMOTE_CODE_NOTE,
        remote_code_limitation=REMOTE_CODE_LIMITATION,
        positions_limitation=positions_limitation(task, config),
        preset=preset,
        architecture={knob: config[knob] for knob in ARCHITECTURE_KNOBS if knob in config},
        num_parameters=num_parameters,
        dataset=dataset,
        dataset_description=dataset_description,
        tokenizer_description=tokenizer_description,
        hyperparameters=hyperparameters,
        eval_results=results,
        loss_curve=(folder / LOSS_CURVE).is_file(),
        intended_use=intended_use,
        limitations=limitations,
    )
    card.save(folder / "README.md")
    return card


def load_card(folder) -> ModelCard | None:
    """`folder/README.md` as a model card, None where there is none; a ValueError naming the file where its metadata
    block is not valid YAML (or not a mapping)."""
    path = Path(folder) / "README.md"
    if not path.is_file():
        return None
    try:
        return ModelCard.load(path)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not a valid model card: it is not UTF-8 text ({error})") from error
    except (ValueError, yaml.YAMLError) as error:
        raise ValueError(f"{path} is not a valid model card: its metadata block does not parse ({error})") from error


def _usage_sections(text: str) -> list[tuple[int, int, int]]:
    """(start, end, level) of each usage section of the markdown `text` (`_USAGE_HEADING`), outermost only: from its
    heading over the subsections that hold code (more examples), up to any other heading, so that a subsection such
    as the gpt2 card's "Limitations and bias" under its "How to use" stays. Lines in ``` fences are code."""
    headings, offset, fenced = [], 0, False  # [offset, level, title, whether its own text holds code]
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            if headings:
                headings[-1][3] = True
        heading = None if fenced else _HEADING.match(line)
        if heading:
            headings.append([offset, len(heading.group(1)), heading.group(2), False])
        offset += len(line)
    sections = []
    for i, (start, level, title, _) in enumerate(headings):
        if _USAGE_HEADING.fullmatch(title) and not (sections and start < sections[-1][1]):
            end = next((later for later, deeper, _, code in headings[i + 1:] if deeper <= level or not code),
                       len(text))
            sections.append((start, end, level))
    return sections


def write_conversion_card(folder, source, *, name: str, task: str, source_class: str, model_class: str,
                          native: bool, check: str) -> ModelCard:
    """The card of the model that `hf-scratch convert` wrote to `folder` from the folder `source`, written to
    `folder/README.md`: the source's card (ours or any other) under a paragraph naming both classes and the `check`
    made, with a "How to use" in place of the source's usage sections (`_usage_sections`) that loads the converted
    model (a `native` one without remote code, and without the card's remote-code sentences), and the loss curve it
    shows; where the source has no card, that paragraph and example under the title `name`, which its example loads.
    The metadata (license, datasets, results) stays the source's: the model computes the same function."""
    folder, source, spec = Path(folder), Path(source), TASKS[task]
    source_card = load_card(source)
    if source_card is not None:
        data, text = source_card.data, source_card.text
    else:
        data, text = ModelCardData(library_name="transformers", pipeline_tag=spec["hub_task"]), f"\n# {name}\n"
    if (source / LOSS_CURVE).is_file():
        shutil.copy2(source / LOSS_CURVE, folder / LOSS_CURVE)
    if native:
        text = _REMOTE_CODE_NOTE.sub("", text).replace(" " + REMOTE_CODE_LIMITATION, "")
    pipeline_task, call = NATIVE_USAGE[task] if native else (spec["pipeline_task"], spec["pipeline_call"])
    named = _USAGE_REPO_ID.search(text)
    repo_id = named.group(1) if named else name
    usage = "How to use\n\n" + usage_example(repo_id, spec["auto_class"], pipeline_task, call, not native) + "\n"
    # The source's usage sections load the source: the first becomes ours, at its level; the others go.
    sections = _usage_sections(text)
    for index, (start, end, level) in reversed(list(enumerate(sections))):
        text = text[:start] + ("#" * level + " " + usage + "\n" if index == 0 else "") + text[end:]
    if not sections:
        text = text.rstrip() + "\n\n## " + usage
    loading = "a native transformers class, loaded without `trust_remote_code`" if native else \
        "loaded with `trust_remote_code=True`, or with the Auto classes after `import hf_scratch_transformer`"
    note = (f"{CONVERTED} from `{source_class}` to `{model_class}` ({loading}). {check} The rest of this card "
            "describes the source model.\n")
    text = re.sub(rf"^{re.escape(CONVERTED)} .*\n\n?", "", text, flags=re.MULTILINE)  # a converted source's note
    title = re.search(r"^# .*\n", text, re.MULTILINE)
    text = text[: title.end()] + "\n" + note + text[title.end():] if title else note + text
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n{text}")
    card.save(folder / "README.md")
    return card


def _code_files(folder: Path, config: dict) -> list[str]:
    """The Python files a `trust_remote_code` load imports: the modules that `auto_map` and `custom_pipelines`
    name, and the sibling modules those import in turn."""
    for key in ("auto_map", "custom_pipelines"):  # a hand-edited list ended in an AttributeError traceback
        if not isinstance(config.get(key, {}), dict):
            raise ValueError(f"{folder / 'config.json'}'s {key} is a JSON {type(config[key]).__name__}, not the "
                             "object save_pretrained writes")
    references = [pipe["impl"] for pipe in config.get("custom_pipelines", {}).values()]
    for value in config.get("auto_map", {}).values():
        references += value if isinstance(value, list) else [value]  # AutoTokenizer maps to [slow, fast]
    # "other/repo--module.Class" is code in another repository, which transformers fetches from there.
    pending = [reference.rsplit(".", 1)[0] + ".py" for reference in references if reference and "--" not in reference]
    found = set()
    while pending:
        name = pending.pop()
        if name in found:
            continue
        found.add(name)
        if (folder / name).is_file():
            pending += [f"{module}.py" for module in _RELATIVE_IMPORT.findall((folder / name).read_text("utf-8"))]
    return sorted(found)


def _read_json(path: Path) -> dict:
    """A JSON object of the folder's, or a ValueError naming the file (the parser's message gives only a position)."""
    try:
        content = json.loads(path.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(content, dict):
        raise ValueError(f"{path} holds a JSON {type(content).__name__}, not the object save_pretrained writes")
    return content


# The names of `save_pretrained`'s weights, in one file or sharded with their index.
_WEIGHT_FILE = re.compile(r"model\.safetensors(\.index\.json)?|model-\d+-of-\d+\.safetensors")


def _weight_files(folder: Path) -> list[str]:
    """`model.safetensors`, or when sharded, every shard its index names. Both is an earlier save's leftover (see
    `remove_stale_weights`): `from_pretrained` reads the single file, whichever is the model, so it is refused."""
    index = folder / "model.safetensors.index.json"
    if index.is_file() and (folder / "model.safetensors").is_file():
        raise ValueError(
            f"{folder} holds both model.safetensors and model.safetensors.index.json, one of them left by an earlier "
            "save: from_pretrained reads model.safetensors. Save the model again into this folder, or remove the "
            "files that are not the model."
        )
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(name, str) for name in weight_map.values()):
            raise ValueError(f"{index} has no weight_map of tensor names to shard files: not an index that "
                             "save_pretrained writes")
        return sorted(set(weight_map.values()))
    return ["model.safetensors"]


def _missing_files(folder: Path) -> list[str]:
    """What a Hub model needs and `folder` lacks: config, weights, card, tokenizer and model code. (Without a
    tokenizer, the card's "How to use", `AutoTokenizer` and `pipeline`, fails on the Hub; `tokenizer_config.json` is
    what `AutoTokenizer` reads first, and every tokenizer's `save_pretrained` writes it. `upload_plan` loads it.)"""
    if not (folder / "config.json").is_file():
        return ["config.json"]
    config = _read_json(folder / "config.json")
    needed = ["README.md", "tokenizer_config.json", *_weight_files(folder), *_code_files(folder, config)]
    return [name for name in needed if not (folder / name).is_file()]


def _check_tokenizer(folder: Path) -> None:
    """A ValueError naming the folder where its tokenizer does not load as the card's "How to use" loads it: a
    tokenizer_config.json without tokenizer.json passed, and `AutoTokenizer` failed on the Hub with "Couldn't
    instantiate the backend tokenizer"."""
    try:
        AutoTokenizer.from_pretrained(folder, trust_remote_code=True)  # as the card's "How to use"
    except Exception as error:  # whatever the tokenizer class raises: the folder cannot be published as it is
        raise ValueError(f"{folder}'s tokenizer does not load ({type(error).__name__}: {error}): save it again with "
                         "its save_pretrained") from error


def _check_configs(folder: Path) -> None:
    """A ValueError naming the folder where its config.json or generation_config.json does not load as
    `from_pretrained` loads them: a hand-edited value (`hidden_act` "foo", heads that do not divide the width, a
    generation config that is not JSON) passed, and the model failed to load on the Hub."""
    try:
        AutoConfig.from_pretrained(folder, trust_remote_code=True)
        if (folder / "generation_config.json").is_file():
            GenerationConfig.from_pretrained(folder)
    except Exception as error:  # whatever the config class raises: the folder cannot be published as it is
        raise ValueError(f"{folder}'s configuration does not load ({type(error).__name__}: {error})") from error


def upload_plan(folder) -> list[tuple[str, int]]:
    """The files `publish` would upload from `folder`, as (relative path, size in bytes), sorted by path.

    Raises ValueError naming what is missing when the folder is not a complete Hub model.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder")
    missing = _missing_files(folder)
    if missing:
        raise ValueError(
            f"{folder} is not ready for the Hub, missing: {', '.join(missing)} (save the model with save_pretrained, "
            "which writes the weights and the model code, its tokenizer with save_pretrained, and the card with "
            "write_model_card)"
        )
    for name in _weight_files(folder):  # a truncated copy (full disk, interrupted save) must not be published
        corrupt = safetensors_error(folder / name)
        if corrupt:
            raise corrupt
    load_card(folder)  # metadata the Hub would not read, or a card that is not UTF-8: named before any upload
    _check_configs(folder)
    _check_tokenizer(folder)
    paths = sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())
    # upload_folder's filter; `publish` uploads exactly these files.
    kept = filter_repo_objects(paths, ignore_patterns=IGNORE_PATTERNS)
    return [(path, (folder / path).stat().st_size) for path in kept]


def card_repo_id(folder) -> str | None:
    """The repo id that the "How to use" of `folder`'s card loads (None for a card without one)."""
    match = _USAGE_REPO_ID.search((Path(folder) / "README.md").read_text("utf-8"))
    return match.group(1) if match else None


def _card_for(folder: Path, repo_id: str) -> bytes:
    """`folder/README.md` as it goes to `repo_id`: its "How to use" loads that repo. A card is written before the repo
    is chosen (`hf-scratch train` names it `<preset>-<data>`), and Hub users run its example as it stands."""
    text = (folder / "README.md").read_text("utf-8")
    return _USAGE_REPO_ID.sub(lambda _: f'repo_id = "{repo_id}"', text, count=1).encode("utf-8")


def publish(
    folder,
    repo_id: str,
    *,
    private: bool = False,
    dry_run: bool = False,
    token: str | None = None,
    commit_message: str = "Upload hf-scratch-transformer model",
):
    """Upload `folder` to the Hub model repository `repo_id`, creating it if needed; return the commit URL. One commit
    of the files of `upload_plan`, with the card's "How to use" loading `repo_id` (the folder's card is left as it is),
    which also deletes the repo's weight and tokenizer files that the plan does not hold (an earlier upload's).

    `private` creates a new repository as private; an existing public one is refused before any upload (the Hub
    ignores `private` for a repository that exists). Without it, a new repository gets the Hub's default visibility
    (an organization's may be private), as `push_to_hub` gives it.

    With `dry_run`, check the folder and the repo id and return the `upload_plan` without touching the network.
    """
    validate_repo_id(repo_id)  # as the upload would, with a ValueError (HFValidationError) saying what is wrong
    plan = upload_plan(folder)
    if dry_run:
        return plan
    folder = Path(folder)
    api = HfApi(token=token)
    # `private=False` would ask for a public repository, overriding an organization's private default: None leaves it.
    repo_id = api.create_repo(repo_id, private=private or None, exist_ok=True).repo_id  # a bare name gets a namespace
    if private and not api.repo_info(repo_id).private:
        raise ValueError(f"{repo_id} exists and is public, and `private` only makes a new repository private: nothing "
                         "was uploaded. Make it private in its settings on the Hub first, or publish without it.")
    operations = [
        CommitOperationAdd(path, _card_for(folder, repo_id) if path == "README.md" else folder / path)
        for path, _ in plan
    ]
    # A repo published to before keeps weights of the other layout, which no upload replaces: its model.safetensors
    # is what `from_pretrained` reads before a new index (the earlier weights, silently), as `remove_stale_weights`
    # says of a folder. The repo's weight files that the plan does not hold go in the same commit, and so do its
    # tokenizer files: one left beside the new tokenizer overrides it (an earlier upload's special_tokens_map.json
    # renamed its special tokens, its chat_template.jinja gave it a template of another model).
    uploaded = {path for path, _ in plan}
    operations += [CommitOperationDelete(path) for path in api.list_repo_files(repo_id)
                   if (_WEIGHT_FILE.fullmatch(path) or path in TOKENIZER_FILES) and path not in uploaded]
    return api.create_commit(repo_id, operations, commit_message=commit_message).commit_url
