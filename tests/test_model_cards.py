"""Model cards and Hub publishing (SPEC section 8), without the Hub: the card renders and parses with
`huggingface_hub.ModelCard`, the upload plan lists exactly what a Hub model needs, the CLI's dry run works
offline, and the published folder loads in a clean process where the package is not installed."""

import json
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from forked_python import run_python
from huggingface_hub import CommitOperationDelete, ModelCard, RepoUrl, metadata_load
from huggingface_hub.utils import validate_repo_id
from hypothesis import example, given
from hypothesis import strategies as st
from load_without_package import output_of, run_without_package
from matplotlib.figure import Figure
from tiny_models import LM_CLASSES, lm_inputs, tiny_config, tiny_lm
from tiny_tokenizers import byte_level_bpe, wordpiece

from hf_scratch_transformer import ScratchEncoderForSequenceClassification, ScratchEncoderForTokenClassification, hub
from hf_scratch_transformer.cli import run_data

ROOT = Path(__file__).resolve().parent.parent
TASK_OF = {"decoder": "causal-lm", "encoder": "masked-lm", "seq2seq": "seq2seq"}
EVAL_RESULTS = {
    "causal-lm": {"perplexity": 12.5, "eval_loss": 2.526},
    "masked-lm": {"mlm_accuracy": 0.41, "eval_loss": 3.1},
    "seq2seq": {"bleu": 27.3, "chrf": 55.1},
}
HYPERPARAMETERS = {"learning_rate": 0.0007, "warmup_steps": 4000, "adam_beta2": 0.98, "label_smoothing": 0.1}


def _model_folder(family: str, folder: Path) -> Path:
    """A saved tiny model and tokenizer with a loss curve, a checkpoint and a hidden file beside them, and a card."""
    model = tiny_lm(family)
    model.save_pretrained(folder)
    (wordpiece() if family == "encoder" else byte_level_bpe(family=family)).save_pretrained(folder)
    figure = Figure()
    figure.add_subplot().plot([4.6, 3.2, 2.5])
    figure.savefig(folder / "loss_curve.png")
    (folder / "checkpoints" / "checkpoint-10").mkdir(parents=True)
    (folder / "checkpoints" / "checkpoint-10" / "model.safetensors").write_bytes(b"stale")
    (folder / ".DS_Store").write_bytes(b"")
    hub.write_model_card(
        folder, task=TASK_OF[family], model_name=f"someone/tiny-{family}", preset="gpt-mini",
        config=model.config.to_dict(), num_parameters=model.num_parameters(), dataset="tiny_shakespeare",
        dataset_description="40k lines of Shakespeare.", hyperparameters=HYPERPARAMETERS,
        eval_results=EVAL_RESULTS[TASK_OF[family]],
    )
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cards")
    return {family: _model_folder(family, root / family) for family in TASK_OF}


# ---------------------------------------------------------------------------------------------- the card


@pytest.mark.parametrize("family", list(TASK_OF))
def test_card_parses_with_metadata_and_model_index(folders, family):
    task = TASK_OF[family]
    card = ModelCard.load(folders[family] / "README.md")
    metadata = card.data.to_dict()
    assert metadata["library_name"] == "transformers"
    assert metadata["pipeline_tag"] == hub.TASKS[task]["hub_task"]
    assert metadata["license"] == "apache-2.0"
    assert "hf-scratch-transformer" in metadata["tags"] and metadata["datasets"] == ["tiny_shakespeare"]
    assert metadata_load(folders[family] / "README.md")["model-index"][0]["name"] == f"someone/tiny-{family}"
    results = {result.metric_name: result.metric_value for result in card.data.eval_results}
    expected = {hub.METRICS[key][1]: value for key, value in EVAL_RESULTS[task].items()}
    assert results == expected
    assert {result.task_type for result in card.data.eval_results} == {hub.TASKS[task]["hub_task"]}


@pytest.mark.parametrize("family", list(TASK_OF))
def test_card_text_shows_the_run(folders, family):
    spec = hub.TASKS[TASK_OF[family]]
    text = (folders[family] / "README.md").read_text()
    assert "`gpt-mini`" in text and "| `hidden_size` | `32` |" in text
    for name, value in HYPERPARAMETERS.items():
        assert f"| {name} | {value} |" in text
    assert "![loss curve](loss_curve.png)" in text
    assert f"{spec['auto_class']}.from_pretrained(repo_id, trust_remote_code=True)" in text
    assert f'pip install "{hub.TRANSFORMERS_REQUIREMENT}"' in text  # the code needs transformers 5, tested releases
    assert hub.TRANSFORMERS_REQUIREMENT.startswith("transformers>=5.")
    assert f'pipeline("{spec["pipeline_task"]}"' in text
    assert "## Intended use" in text and "## Limitations" in text


def test_card_without_loss_curve_or_results(tmp_path):
    folder = tmp_path / "bare"
    folder.mkdir()
    card = hub.write_model_card(
        folder, task="causal-lm", model_name="someone/bare", preset=None, config={}, num_parameters=10,
        dataset="tiny_shakespeare", hyperparameters={}, eval_results={}, intended_use="Unit tests only.",
    )
    assert "loss_curve.png" not in card.text and "model-index" not in card.content
    assert "| Metric |" not in card.text and "## Evaluation results\n\nNone recorded" in card.text  # no empty table
    assert "`custom`" in card.text and "Unit tests only." in card.text


def test_card_says_the_name_size_data_tokenizer_and_results_it_is_given(tmp_path):
    """Titled by the model's name; the parameter count with its thousands marked, the license, the data's
    description, the tokenizer's own line (our runs say how to load theirs; without one, the default line that loads
    the tokenizer saved beside the weights) and each result by its metric's name."""
    tokenizer_line = "A byte-level BPE: `AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)`."
    card = hub.write_model_card(
        tmp_path, task="causal-lm", model_name="someone/sized", preset=None, config={}, num_parameters=1234567,
        dataset="tiny_shakespeare", dataset_description="40k lines of Shakespeare.", hyperparameters={},
        eval_results={"perplexity": 12.5}, tokenizer_description=tokenizer_line, license="mit",
    )
    assert card.text.startswith("\n# someone/sized\n")
    assert "- **Parameters:** 1,234,567\n- **License:** mit\n" in card.text
    assert "| Perplexity | tiny_shakespeare | 12.5 |" in card.text
    assert "Trained on `tiny_shakespeare`.\n40k lines of Shakespeare." in card.text
    assert f"## Tokenizer\n\n{tokenizer_line}\n" in card.text
    default = hub.write_model_card(
        tmp_path, task="causal-lm", model_name="someone/sized", preset=None, config={}, num_parameters=10,
        dataset="tiny_shakespeare", hyperparameters={}, eval_results={},
    )
    assert "## Tokenizer\n\nThe tokenizer saved beside the weights: `AutoTokenizer.from_pretrained(repo_id)`." in (
        default.text)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope"])
def test_a_causal_lm_card_says_where_its_positions_end(tmp_path, positions):
    """transformers' text-generation pipeline asks for 256 new tokens by default: a model of 128 learned positions
    stopped with an error whenever no end-of-text came first. Its card says so; RoPE has no last position."""
    config = {"position_embedding_type": positions, "max_position_embeddings": 128}
    card = hub.write_model_card(
        tmp_path, task="causal-lm", model_name="someone/short", preset=None, config=config, num_parameters=10,
        dataset="tiny_shakespeare", hyperparameters={}, eval_results={},
    )
    said = "It reads at most 128 positions" in card.text and "asks for 256 new tokens" in card.text
    assert said == (positions != "rope")
    assert "trust_remote_code=True" in card.text.split("## Limitations")[1]  # the rest of the default kept


def test_local_data_is_named_but_not_linked_as_a_hub_dataset(tmp_path):
    """A run on local files names them in the card, but its `datasets` metadata (which the Hub links to
    hf.co/datasets/NAME) stays empty, as in transformers' own Trainer cards; the results keep their model-index."""
    card = hub.write_model_card(
        tmp_path, task="causal-lm", model_name="someone/local", preset=None, config={}, num_parameters=10,
        dataset="train", dataset_on_hub=False, hyperparameters={}, eval_results={"eval_loss": 2.5},
    )
    assert "datasets" not in metadata_load(tmp_path / "README.md")
    assert "Trained on `train`." in card.text
    assert [(result.dataset_name, result.metric_value) for result in card.data.eval_results] == [("train", 2.5)]


def test_a_training_runs_card_links_a_hub_dataset_or_the_embedded_corpus_and_no_local_files(tmp_path):
    """What the training commands give `write_model_card` as `dataset_on_hub`: the embedded Tiny Shakespeare is the
    Hub's tiny_shakespeare, and a --dataset that is no local path a Hub dataset; --train-files, parallel files and a
    local --dataset are named only (linked, the card would point at hf.co/datasets/<file name>)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be.\n")

    def linked(**given) -> bool:
        args = SimpleNamespace(**{"dataset": None, "train_files": None, "source_files": None, "target_files": None}
                               | given)
        return run_data.run_data_on_hub(args, run_data.run_data_files(args))

    assert linked() and linked(dataset="someone/shakespeare")
    assert not linked(train_files=[str(corpus)])
    assert not linked(source_files=[str(corpus)], target_files=[str(corpus)])
    assert not linked(dataset=str(corpus))


def test_a_token_classifiers_two_f1_scores_are_told_apart_in_the_model_index(tmp_path):
    """Words' macro-F1 and seqeval's entity F1 are both of the Hub's type "f1": the macro one says how it averaged
    (`args`, what `evaluate.load("f1").compute` takes), so that a reader of the metadata need not go by names."""
    hub.write_model_card(
        tmp_path, task="token-classification", model_name="someone/ner", preset=None, config={}, num_parameters=10,
        dataset="conll2003", hyperparameters={}, eval_results={"accuracy": 0.9, "f1": 0.8, "entity_f1": 0.7},
    )
    metrics = metadata_load(tmp_path / "README.md")["model-index"][0]["results"][0]["metrics"]
    assert [(metric["type"], metric.get("args"), metric["value"]) for metric in metrics] == [
        ("accuracy", None, 0.9), ("f1", {"average": "macro"}, 0.8), ("f1", None, 0.7)]


def test_unknown_task_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="causal-lm, masked-lm, seq2seq"):
        hub.write_model_card(
            tmp_path, task="text-generation", model_name="x", preset=None, config={}, num_parameters=0,
            dataset="d", hyperparameters={}, eval_results={},
        )


# ---------------------------------------------------------------------------------------------- upload plan


@pytest.mark.parametrize("family", list(TASK_OF))
def test_upload_plan_lists_the_hub_files_and_skips_checkpoints(folders, family):
    plan = dict(hub.upload_plan(folders[family]))
    code = {"configuration_scratch.py", f"modeling_scratch_{family}.py", "scratch_layers.py"}
    assert {"config.json", "model.safetensors", "README.md", "loss_curve.png"} | code <= set(plan)
    assert not any(path.startswith(("checkpoints/", ".")) for path in plan)
    assert plan["model.safetensors"] == (folders[family] / "model.safetensors").stat().st_size


def test_upload_plan_leaves_training_state_local_at_any_depth(folders, tmp_path):
    """A run whose --output-dir lay in the model folder (`MODEL/more`) had its checkpoints uploaded with it, optimizer
    and random states included: only a top-level checkpoints/ was left out. Folders being written (`.tmp`) or removed
    (`.deleted`) went too. A subfolder of other files (a second model) still goes, listed by the dry run."""
    folder = shutil.copytree(folders["decoder"], tmp_path / "decoder")
    local = ["more/checkpoints/step-2/optimizer.bin", "more/checkpoint-4/optimizer.pt", "more/model.tmp/config.json",
             "model.tmp/model.safetensors", "more/checkpoints.deleted/step-2/random_states_0.pkl",
             "more/.hf-scratch.lock"]
    for path in [*local, "more/model/config.json"]:
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(b"state")
    plan = dict(hub.publish(folder, "someone/tiny", dry_run=True))
    assert not set(local) & set(plan) and "more/model/config.json" in plan
    assert set(plan) - {"more/model/config.json"} == set(dict(hub.upload_plan(folders["decoder"])))


# The tokenizer too: without it the card's "How to use" (AutoTokenizer, pipeline) fails on the Hub.
@pytest.mark.parametrize("missing", ["README.md", "modeling_scratch_decoder.py", "scratch_layers.py", "config.json",
                                     "tokenizer_config.json"])
def test_upload_plan_names_what_is_missing(folders, tmp_path, missing):
    folder = shutil.copytree(folders["decoder"], tmp_path / "decoder")
    (folder / missing).unlink()
    with pytest.raises(ValueError, match=missing.replace(".", r"\.")):
        hub.upload_plan(folder)


def test_upload_plan_leaves_code_of_another_repository_to_it(folders, tmp_path):
    """An `auto_map` entry "other/repo--module.Class" (code transformers fetches from that repository) was asked for
    as a missing file "other/repo--module.py" of the folder."""
    folder = shutil.copytree(folders["decoder"], tmp_path / "decoder")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"]["AutoModelForTokenClassification"] = "someone/heads--modeling_heads.TaggingHead"
    (folder / "config.json").write_text(json.dumps(config))
    assert not any("modeling_heads" in path for path, _ in hub.upload_plan(folder))


def test_upload_plan_names_a_config_that_is_not_json(folders, tmp_path):
    """A truncated config.json (an interrupted copy): the error names the file, as `from_pretrained`'s does, not only
    the JSON parser's position."""
    folder = shutil.copytree(folders["decoder"], tmp_path / "decoder")
    (folder / "config.json").write_text((folder / "config.json").read_text()[:100])
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON: Unterminated string"):
        hub.upload_plan(folder)


def test_upload_plan_refuses_weights_in_both_layouts(tmp_path):
    """One `model.safetensors` beside a shard index (an earlier save's leftover, from the time `save_pretrained` left
    it): `from_pretrained` reads the single file, whichever is the model, and the plan uploaded both (or asked for the
    shards of a stale index)."""
    folder = tmp_path / "decoder"
    tiny_lm("decoder").save_pretrained(folder)
    byte_level_bpe().save_pretrained(folder)
    (folder / "README.md").write_text("card")
    hub.upload_plan(folder)
    tiny_lm("decoder").save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    for path in (tmp_path / "sharded").glob("model*"):
        shutil.copy(path, folder)
    with pytest.raises(ValueError, match=r"both model\.safetensors and model\.safetensors\.index\.json"):
        hub.upload_plan(folder)


def test_publish_dry_run_cli_lists_the_plan_offline(folders):
    folder = folders["seq2seq"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    completed = run_python(
        [sys.executable, str(ROOT / "scripts" / "publish.py"), str(folder), "--repo-id", "someone/tiny", "--dry-run"],
        env=env, cwd=ROOT, timeout=300)
    assert completed.returncode == 0, completed.stderr
    for path, size in hub.upload_plan(folder):
        assert f"{size:>12,}  {path}" in completed.stdout
    assert "checkpoints" not in completed.stdout and "dry run" in completed.stdout
    assert "README.md: its \"How to use\" loads 'someone/tiny-seq2seq'; uploaded, it loads 'someone/tiny'" in \
        completed.stdout


@pytest.mark.parametrize("repo_id", ["my model", "https://huggingface.co/someone/tiny", "someone/tiny--v2"])
def test_publish_dry_run_refuses_a_repo_id_the_hub_would(folders, repo_id):
    """The dry run checks the repo id as the upload does: it passed one that `create_repo` then refused."""
    with pytest.raises(ValueError, match="[Rr]epo.?id"):
        hub.publish(folders["decoder"], repo_id, dry_run=True)


def test_publish_cli_refuses_a_folder_that_is_not_ready_as_a_bad_argument(tmp_path, monkeypatch, capsys):
    """Exit status 2 and the command's name, as argparse and the other commands refuse; it exited 1 with a bare
    'error: ...'."""
    monkeypatch.setattr(sys, "argv", ["hf-scratch publish", str(tmp_path), "--repo-id", "someone/tiny", "--dry-run"])
    with pytest.raises(SystemExit) as stopped:
        runpy.run_module("hf_scratch_transformer.cli.publish", run_name="__main__")
    assert stopped.value.code == 2
    assert capsys.readouterr().err.startswith(f"hf-scratch publish: error: {tmp_path} is not ready for the Hub, "
                                              "missing: config.json")


def test_publish_cli_says_why_the_hub_refused_without_a_traceback(folders):
    """The Hub out of reach (here offline mode; elsewhere no token, no access): an error line, not huggingface_hub's
    traceback."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    completed = run_python(
        [sys.executable, str(ROOT / "scripts" / "publish.py"), str(folders["decoder"]), "--repo-id", "someone/tiny"],
        env=env, cwd=ROOT, timeout=300)
    assert completed.returncode == 1
    assert "error: could not publish" in completed.stderr and "offline mode is enabled" in completed.stderr
    assert "Traceback" not in completed.stderr


class FakeApi:
    """`HfApi` without the Hub: records the calls in `calls`; the repo holds `repo_files`; the repos of `public_repos`
    exist and are public (`create_repo` leaves them so, whatever it is asked, as the Hub does)."""

    calls: list = []
    repo_files: list = []
    public_repos: set = set()

    def __init__(self, token=None):
        self.calls.append(("init", token))

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))
        return RepoUrl(f"https://huggingface.co/{repo_id if '/' in repo_id else 'someone/' + repo_id}")

    def repo_info(self, repo_id):
        return type("RepoInfo", (), {"private": repo_id not in self.public_repos})()

    def list_repo_files(self, repo_id):
        return list(self.repo_files)

    def create_commit(self, repo_id, operations, **kwargs):
        self.calls.append(("create_commit", repo_id, list(operations), kwargs))
        return type("Commit", (), {"commit_url": "https://huggingface.co/someone/tiny/commit/abc"})()


@pytest.fixture
def fake_api(monkeypatch) -> type[FakeApi]:
    monkeypatch.setattr(FakeApi, "calls", [])
    monkeypatch.setattr(FakeApi, "repo_files", [".gitattributes"])
    monkeypatch.setattr(FakeApi, "public_repos", set())
    monkeypatch.setattr(hub, "HfApi", FakeApi)
    return FakeApi


def test_publish_creates_the_repo_and_uploads_the_plan(folders, fake_api):
    calls = fake_api.calls
    folder = folders["decoder"]  # its card was written for someone/tiny-decoder
    card = (folder / "README.md").read_bytes()
    assert hub.publish(folder, "someone/tiny", dry_run=True) == hub.upload_plan(folder)
    assert calls == []
    url = hub.publish(folder, "someone/tiny", private=True, token="hf_x", commit_message="first")
    assert url.endswith("/commit/abc")
    assert calls[:2] == [("init", "hf_x"), ("create_repo", "someone/tiny", {"private": True, "exist_ok": True})]
    _, repo_id, operations, kwargs = calls[2]
    assert repo_id == "someone/tiny" and kwargs == {"commit_message": "first"}
    assert [operation.path_in_repo for operation in operations] == [path for path, _ in hub.upload_plan(folder)]
    # The card's "How to use" loads the repo it is published to (a card is written before the repo is chosen:
    # `hf-scratch train` names it <preset>-<data>, and that example failed on the Hub); the folder keeps its own.
    uploaded = {operation.path_in_repo: operation.path_or_fileobj for operation in operations}
    assert b'repo_id = "someone/tiny"\n' in uploaded["README.md"]
    assert b'repo_id = "someone/tiny-decoder"' not in uploaded["README.md"]
    assert (folder / "README.md").read_bytes() == card and Path(uploaded["config.json"]) == folder / "config.json"
    # A bare name is created under the token's user: the card loads the repo as the Hub named it.
    hub.publish(folder, "tiny")
    uploaded = {operation.path_in_repo: operation.path_or_fileobj for operation in calls[-1][2]}
    assert b'repo_id = "someone/tiny"\n' in uploaded["README.md"]


def test_publish_leaves_the_visibility_to_the_hub_unless_asked_and_never_uploads_private_work_to_a_public_repo(
        folders, fake_api):
    """Without `private`, `create_repo(private=False)` asked for a public repository, overriding an organization
    whose new repositories are private; with it, a repository that existed public was uploaded to without a word
    (the Hub ignores `private` for a repository that exists): the model went out public."""
    folder = folders["decoder"]
    hub.publish(folder, "someorg/tiny")
    assert fake_api.calls[1] == ("create_repo", "someorg/tiny", {"private": None, "exist_ok": True})
    fake_api.public_repos.add("someorg/tiny")
    calls = len(fake_api.calls)
    with pytest.raises(ValueError, match="someorg/tiny exists and is public.*nothing was uploaded"):
        hub.publish(folder, "someorg/tiny", private=True)
    assert [call[0] for call in fake_api.calls[calls:]] == ["init", "create_repo"]  # no commit


def test_publishing_again_deletes_the_repos_weights_of_the_other_layout(folders, fake_api, tmp_path):
    """A folder published sharded to a repo that holds an earlier single `model.safetensors`: `from_pretrained` reads
    that file before the new index, so the repo served the earlier weights; and a single file over shards left them.
    The weight files that the new upload does not hold are deleted in its commit; nothing else of the repo's is."""
    single = folders["decoder"]
    sharded = shutil.copytree(single, tmp_path / "sharded")
    tiny_lm("decoder").save_pretrained(sharded, max_shard_size="20KB")
    shards = [path for path, _ in hub.upload_plan(sharded) if path.startswith("model") and ".safetensors" in path]
    assert len(shards) > 2 and "model.safetensors" not in shards
    kept = [".gitattributes", "README.md", "model.fp16.safetensors", "results/model-1-of-2.safetensors"]
    for folder, earlier in ((sharded, ["model.safetensors"]), (single, [*shards, "model-00009-of-00009.safetensors"])):
        fake_api.repo_files = kept + earlier
        hub.publish(folder, "someone/tiny")
        operations = fake_api.calls[-1][2]
        deleted = [operation.path_in_repo for operation in operations if isinstance(operation, CommitOperationDelete)]
        assert sorted(deleted) == sorted(earlier)
        added = {operation.path_in_repo for operation in operations} - set(deleted)
        assert added == {path for path, _ in hub.upload_plan(folder)}


def test_publishing_again_deletes_the_repos_tokenizer_files_the_new_tokenizer_does_not_have(folders, fake_api):
    """An earlier upload's special_tokens_map.json (transformers 4 wrote one; 5 does not) or chat_template.jinja stayed
    in the repo beside the new tokenizer, and AutoTokenizer read them over it: other special tokens, another model's
    chat template. Such tokenizer files go in the upload's commit; the repo's other files stay."""
    folder = folders["decoder"]
    stale = ["special_tokens_map.json", "chat_template.jinja", "added_tokens.json", "vocab.txt", "merges.txt"]
    fake_api.repo_files = [".gitattributes", "notes.md", "tokenizer.json", "tokenizer_config.json", *stale]
    hub.publish(folder, "someone/tiny")
    operations = fake_api.calls[-1][2]
    assert sorted(op.path_in_repo for op in operations if isinstance(op, CommitOperationDelete)) == sorted(stale)
    assert {"tokenizer.json", "tokenizer_config.json"} <= {op.path_in_repo for op in operations}


def _card_not_yaml(folder: Path) -> None:
    text = (folder / "README.md").read_text()
    (folder / "README.md").write_text(text.replace("---\n", "---\nlicense: [apache\n", 1))


def _card_not_utf8(folder: Path) -> None:
    (folder / "README.md").write_bytes((folder / "README.md").read_bytes().replace(b"# ", b"# \xe9", 1))


def _tokenizer_json_missing(folder: Path) -> None:
    (folder / "tokenizer.json").unlink()


def _index_without_weight_map(folder: Path) -> None:
    (folder / "model.safetensors.index.json").write_text('{"metadata": {}}')


def _config_that_is_a_list(folder: Path) -> None:
    (folder / "config.json").write_text("[]")


def _config_edited(**fields):
    def spoil(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | fields))
    return spoil


def _generation_config_not_json(folder: Path) -> None:
    (folder / "generation_config.json").write_text("{not json")


@pytest.mark.parametrize("spoil, message", [
    (_card_not_yaml, r"README\.md is not a valid model card: its metadata block does not parse"),
    (_card_not_utf8, r"README\.md is not a valid model card: it is not UTF-8 text"),
    (_tokenizer_json_missing, r"tokenizer does not load"),
    (_index_without_weight_map, r"model\.safetensors\.index\.json has no weight_map"),
    (_config_that_is_a_list, r"config\.json holds a JSON list, not the object"),
    (_config_edited(hidden_act="foo"), r"configuration does not load \(ValueError: `hidden_act` must be one of"),
    (_config_edited(num_attention_heads=7), r"configuration does not load .* must be divisible"),
    (_config_edited(auto_map=["modeling_scratch_decoder.ScratchDecoderForCausalLM"]),
     r"config\.json's auto_map is a JSON list, not the object"),
    (_generation_config_not_json, r"configuration does not load \(OSError: .*generation_config\.json"),
], ids=["card-not-yaml", "card-not-utf8", "tokenizer-json-missing", "index-without-weight-map", "config-list",
        "unknown-activation", "heads-not-dividing", "auto-map-list", "generation-config-not-json"])
def test_upload_plan_refuses_a_folder_the_hub_would_not_load(folders, tmp_path, spoil, message):
    """Each passed the dry run (a card whose metadata the Hub does not read, a tokenizer_config.json without the
    tokenizer, which the card's "How to use" then failed to load, a hand-edited config or generation config that
    does not load) or ended in a traceback (a UnicodeDecodeError after
    the file list, a KeyError, an AttributeError)."""
    folder = shutil.copytree(folders["decoder"], tmp_path / "decoder")
    if spoil is _index_without_weight_map:
        (folder / "model.safetensors").unlink()
    spoil(folder)
    with pytest.raises(ValueError, match=message):
        hub.upload_plan(folder)


def test_publish_cli_says_when_the_hub_cannot_be_reached_and_wants_a_namespace(folders):
    """No route to the Hub (a refused connection, a name that does not resolve) ended in the HTTP library's
    traceback; a bare repo name is created under the token's user, which the dry run cannot name."""
    env = {key: value for key, value in os.environ.items() if key != "HF_HUB_OFFLINE"}
    env |= {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": "hf_unused"}
    command = [sys.executable, str(ROOT / "scripts" / "publish.py"), str(folders["decoder"]), "--repo-id"]
    completed = run_python([*command, "someone/tiny"], env=env, cwd=ROOT, timeout=300)
    assert completed.returncode == 1
    assert "error: could not publish" in completed.stderr and "Traceback" not in completed.stderr, completed.stderr
    # no Hub to name: in a fork of the test process (HF_ENDPOINT, read as huggingface_hub is imported, runs fresh)
    completed = run_python([*command, "tiny", "--dry-run"], env=os.environ | {"HF_TOKEN": "hf_unused"}, cwd=ROOT,
                           timeout=300)
    assert completed.returncode == 2 and "'tiny': give USER/NAME or ORG/NAME" in completed.stderr


# ---------------------------------------------------------------------------------------------- clean load


def test_published_folder_loads_where_the_package_is_missing(folders, tmp_path):
    folder = folders["decoder"]
    inputs = {"input_ids": lm_inputs("decoder")["input_ids"]}
    with torch.no_grad():
        expected = tiny_lm("decoder")(**inputs).logits
    torch.save([{"folder": str(folder), "auto_class": "AutoModelForCausalLM", "inputs": inputs}], tmp_path / "jobs.pt")
    completed = run_without_package(tmp_path, tmp_path / "jobs.pt", tmp_path / "results.pt")
    assert completed.returncode == 0, completed.stderr[-3000:]
    [result] = torch.load(tmp_path / "results.pt")
    assert result["class"] == "ScratchDecoderForCausalLM"
    torch.testing.assert_close(result["output"], expected, rtol=0, atol=0)


CARD_EXAMPLES = {  # task -> (family, model class)
    **{task: (family, LM_CLASSES[family]) for family, task in TASK_OF.items()},
    "text-classification": ("encoder", ScratchEncoderForSequenceClassification),
    "token-classification": ("encoder", ScratchEncoderForTokenClassification),
}


def _card_example(task: str, folder: Path) -> Path:
    """The "How to use" block of the card of a tiny `task` model published in `folder`, its repo id pointing there."""
    family, model_class = CARD_EXAMPLES[task]
    tokenizer = {"encoder": wordpiece, "decoder": byte_level_bpe, "seq2seq": byte_level_bpe}[family]
    tokenizer = tokenizer() if family == "encoder" else tokenizer(family=family)
    specials = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                    eos_token_id=tokenizer.eos_token_id)
    if family == "seq2seq":
        specials["decoder_start_token_id"] = tokenizer.bos_token_id
    torch.manual_seed(0)
    model = model_class(tiny_config(family, vocab_size=len(tokenizer), **specials)).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    card = hub.write_model_card(folder, task=task, model_name="someone/tiny", preset=None,
                                config=model.config.to_dict(), num_parameters=model.num_parameters(),
                                dataset="tiny_shakespeare", hyperparameters={}, eval_results={})
    example = card.text.split("## How to use")[1].split("```python\n")[1].split("```")[0]
    script = folder.parent / f"{folder.name}.py"
    script.write_text(example.replace('"someone/tiny"', repr(str(folder))))
    return script


@pytest.fixture(scope="module")
def card_examples(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict[str, Path]]:
    """(the run, task -> its card's example): the examples run one after the other in one process where the package
    cannot be imported, each loading a folder of its own name (transformers names the folder's code after it)."""
    work = tmp_path_factory.mktemp("cards")
    examples = {task: _card_example(task, work / f"published_{task.replace('-', '_')}") for task in CARD_EXAMPLES}
    return run_without_package(work, "--run", *examples.values()), examples


@pytest.mark.parametrize("task", list(CARD_EXAMPLES))
def test_the_cards_example_runs_where_the_package_is_missing_without_asking(task, card_examples):
    """The "How to use" block of the card, with its repo id pointing at the published folder (model, tokenizer,
    card), run in a process where the package cannot be imported, with no terminal to answer a
    `trust_remote_code` question: every loader in it must say `trust_remote_code=True`."""
    completed, examples = card_examples
    output = output_of(completed, examples[task])
    assert "Traceback" not in output, output[-3000:]
    assert "custom code" not in output  # transformers' question, unanswered


@given(st.lists(st.text(max_size=60), min_size=1, max_size=3))
@example(["gpt-mini", "my corpus"])
@example(["bert-prenorm", "stanfordnlp/imdb"])
@example(["scratch", "..--.."])
def test_a_default_repo_name_is_a_hub_repo_id_whatever_the_data_is_called(parts):
    """A data file `my corpus.txt` named the card "gpt-mini-my corpus", whose usage code could not load it."""
    name = hub.default_repo_name(*parts)
    validate_repo_id(name)
    assert "/" not in name


def test_a_default_repo_name_keeps_what_a_repo_id_holds():
    assert hub.default_repo_name("gpt-mini", "tiny_shakespeare") == "gpt-mini-tiny_shakespeare"
    assert hub.default_repo_name("gpt-mini", "my corpus") == "gpt-mini-my-corpus"
    assert hub.default_repo_name("bert-prenorm", "stanfordnlp/imdb") == "bert-prenorm-imdb"
